"""Per-token log-probabilities and entropies from logits, without keeping a log-softmax copy.

``log pi(y_t) = z[y_t] / T - logsumexp(z / T)`` (``T`` the sampling temperature). The naive
``log_softmax(z).gather(...)`` materialises a second ``[batch, seq, vocab]`` tensor and autograd keeps it
alive until backward. Here both functions are custom autograd functions that walk the flattened logits in
row chunks: forward keeps only ``[rows]`` statistics (the logsumexp, and for the entropy the mean logit under
the softmax), backward recomputes each chunk's softmax from the saved logits (which the model's graph holds
anyway). Peak extra memory is about ``chunk_rows * vocab`` elements in the compute dtype. The same idea is
TRL's ``selective_log_softmax`` / ``entropy_from_logits`` (which the tests cross-check against); those two
stay inside autograd and so keep each chunk's intermediates for backward.

Alignment is the caller's job: for a causal LM, the logits at position ``t`` score the token at ``t + 1``,
so pass ``logits[:, :-1]`` with ``tokens[:, 1:]`` (or the response slice of both).

Precision: computation runs in ``promote_types(logits.dtype, float32)`` (bf16/fp16 logits are upcast
chunk by chunk); the result has that dtype and the gradient returned to ``logits`` has ``logits.dtype``.
Double backward is not supported.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

DEFAULT_CHUNK_ROWS = 1024
"""Rows of the flattened ``[batch * seq, vocab]`` logits processed at a time (memory/speed knob only)."""


def _check_temperature_and_chunk(temperature: float, chunk_rows: int) -> None:
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    if not (isinstance(chunk_rows, int) and chunk_rows >= 1):
        raise ValueError(f"chunk_rows must be an int >= 1, got {chunk_rows!r}")


def _compute_dtype(logits: torch.Tensor) -> torch.dtype:
    if not logits.is_floating_point():
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    return torch.promote_types(logits.dtype, torch.float32)


class _TokenLogprob(torch.autograd.Function):
    """``z[n, y_n] / T - logsumexp(z[n] / T)`` over rows ``n`` of ``[rows, vocab]`` logits."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, tokens: torch.Tensor, inv_temp: float, chunk_rows: int):
        # logits: [rows, vocab]; tokens: [rows] int64
        dtype = _compute_dtype(logits)
        rows = logits.shape[0]
        out = torch.empty(rows, dtype=dtype, device=logits.device)  # [rows]
        lse = torch.empty(rows, dtype=dtype, device=logits.device)  # [rows]
        for start in range(0, rows, chunk_rows):
            end = min(start + chunk_rows, rows)
            x = logits[start:end].to(dtype) * inv_temp  # [chunk, vocab], transient
            chunk_lse = torch.logsumexp(x, dim=-1)  # [chunk]
            chosen = x.gather(-1, tokens[start:end, None]).squeeze(-1)  # [chunk]
            out[start:end] = chosen - chunk_lse
            lse[start:end] = chunk_lse
        ctx.save_for_backward(logits, tokens, lse)
        ctx.inv_temp = inv_temp
        ctx.chunk_rows = chunk_rows
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        # d/dz_j [z_y/T - lse(z/T)] = (1[j = y] - softmax(z/T)_j) / T
        logits, tokens, lse = ctx.saved_tensors
        dtype = lse.dtype
        grad = torch.empty_like(logits)  # [rows, vocab]
        for start in range(0, logits.shape[0], ctx.chunk_rows):
            end = min(start + ctx.chunk_rows, logits.shape[0])
            g = grad_out[start:end, None].to(dtype)  # [chunk, 1]
            x = logits[start:end].to(dtype) * ctx.inv_temp  # [chunk, vocab]
            chunk_grad = -torch.exp(x - lse[start:end, None]) * g  # [chunk, vocab]
            chunk_grad.scatter_add_(-1, tokens[start:end, None], g)
            grad[start:end] = (chunk_grad * ctx.inv_temp).to(logits.dtype)
        return grad, None, None, None


class _Entropy(torch.autograd.Function):
    """Entropy of ``softmax(z[n] / T)`` over rows ``n`` of ``[rows, vocab]`` logits."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, inv_temp: float, chunk_rows: int):
        # H = lse(x) - E_p[x] with x = z / T, p = softmax(x)
        dtype = _compute_dtype(logits)
        rows = logits.shape[0]
        entropy = torch.empty(rows, dtype=dtype, device=logits.device)  # [rows]
        lse = torch.empty(rows, dtype=dtype, device=logits.device)  # [rows]
        mean_x = torch.empty(rows, dtype=dtype, device=logits.device)  # [rows], E_p[x]
        for start in range(0, rows, chunk_rows):
            end = min(start + chunk_rows, rows)
            x = logits[start:end].to(dtype) * inv_temp  # [chunk, vocab]
            chunk_lse = torch.logsumexp(x, dim=-1, keepdim=True)  # [chunk, 1]
            p = torch.exp(x - chunk_lse)  # [chunk, vocab]
            # p * x is 0 * -inf = NaN on masked-out vocabulary entries (-inf logits); those contribute 0.
            px = torch.where(p > 0, p * x, torch.zeros((), dtype=dtype, device=x.device))  # [chunk, vocab]
            chunk_mean = px.sum(dim=-1)  # [chunk]
            entropy[start:end] = chunk_lse.squeeze(-1) - chunk_mean
            lse[start:end] = chunk_lse.squeeze(-1)
            mean_x[start:end] = chunk_mean
        ctx.save_for_backward(logits, lse, mean_x)
        ctx.inv_temp = inv_temp
        ctx.chunk_rows = chunk_rows
        return entropy

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        # dH/dx_j = -p_j (x_j - E_p[x]); dH/dz_j = dH/dx_j / T
        logits, lse, mean_x = ctx.saved_tensors
        dtype = lse.dtype
        grad = torch.empty_like(logits)  # [rows, vocab]
        for start in range(0, logits.shape[0], ctx.chunk_rows):
            end = min(start + ctx.chunk_rows, logits.shape[0])
            x = logits[start:end].to(dtype) * ctx.inv_temp  # [chunk, vocab]
            p = torch.exp(x - lse[start:end, None])  # [chunk, vocab]
            d = torch.where(p > 0, -p * (x - mean_x[start:end, None]), torch.zeros((), dtype=dtype, device=x.device))
            g = grad_out[start:end, None].to(dtype)  # [chunk, 1]
            grad[start:end] = (d * g * ctx.inv_temp).to(logits.dtype)
        return grad, None, None


def token_logprobs(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> torch.Tensor:
    """Log-probability of each given token under ``softmax(logits / temperature)``.

    Args:
        logits: ``[batch, seq, vocab]`` (any leading shape ``[...]`` works), already aligned with ``tokens``.
        tokens: ``[batch, seq]`` integer token ids in ``[0, vocab)``.
        temperature: divides the logits (use the rollout's sampling temperature so that ``pi`` and the
            sampler agree); must be > 0.
        chunk_rows: rows of the flattened ``[batch * seq, vocab]`` logits processed per chunk.

    Returns:
        ``[batch, seq]`` log-probabilities in ``promote_types(logits.dtype, float32)``; differentiable w.r.t.
        ``logits`` (first order).
    """
    _check_temperature_and_chunk(temperature, chunk_rows)
    _compute_dtype(logits)
    if logits.dim() < 2:
        raise ValueError(f"logits must be [..., vocab] with at least 2 dims, got shape {tuple(logits.shape)}")
    if tuple(tokens.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"tokens has shape {tuple(tokens.shape)}; expected logits.shape[:-1] = {tuple(logits.shape[:-1])}"
        )
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(f"tokens must be an integer tensor, got {tokens.dtype}")
    vocab = logits.shape[-1]
    if tokens.numel() > 0 and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise ValueError(f"token ids must lie in [0, {vocab}); got range [{int(tokens.min())}, {int(tokens.max())}]")
    flat_logits = logits.reshape(-1, vocab)  # [rows, vocab], a view when logits is contiguous
    flat_tokens = tokens.reshape(-1).to(torch.int64)  # [rows]
    out = _TokenLogprob.apply(flat_logits, flat_tokens, 1.0 / temperature, chunk_rows)  # [rows]
    return out.reshape(tokens.shape)  # [batch, seq]


def token_entropy(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> torch.Tensor:
    """Entropy (nats) of ``softmax(logits / temperature)`` at every position.

    Args:
        logits: ``[batch, seq, vocab]`` (any leading shape ``[...]`` works); ``-inf`` entries are allowed
            (they carry zero probability) as long as each row has a finite entry.
        temperature: divides the logits; must be > 0.
        chunk_rows: rows of the flattened logits processed per chunk.

    Returns:
        ``[batch, seq]`` entropies in ``promote_types(logits.dtype, float32)``; differentiable w.r.t.
        ``logits`` (first order). Call under ``torch.no_grad()`` when it is only a metric.
    """
    _check_temperature_and_chunk(temperature, chunk_rows)
    _compute_dtype(logits)
    if logits.dim() < 2:
        raise ValueError(f"logits must be [..., vocab] with at least 2 dims, got shape {tuple(logits.shape)}")
    vocab = logits.shape[-1]
    flat_logits = logits.reshape(-1, vocab)  # [rows, vocab]
    out = _Entropy.apply(flat_logits, 1.0 / temperature, chunk_rows)  # [rows]
    return out.reshape(logits.shape[:-1])  # [batch, seq]
