"""Run a model over a probe suite and keep, for every real token, its routes, router margin and entropy, and its
next-token log-prob.

Texts are tokenized without special tokens, cut to ``max_tokens``, and run in right-padded batches of
``batch_size`` under :class:`moestab.routing.RoutingRecorder` without grad. Only the per-token record is kept
(a few bytes per token and layer), so memory stays bounded by one batch's activations whatever the suite size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from moestab.probes.errors import ProbeError


@dataclass(frozen=True)
class ProbeRecord:
    """What one model did on a suite, flattened over its real tokens in (text, position) order."""

    routes: np.ndarray
    """``[tokens, layers, top_k]`` int16 experts, best first (slot 0 = the router's top-1)."""
    margin: np.ndarray
    """``[tokens, layers]`` float32 gap between the k-th and (k+1)-th selection score."""
    entropy: np.ndarray
    """``[tokens, layers]`` float32 entropy (nats) of softmax(router logits)."""
    logp: np.ndarray
    """``[tokens]`` float32 log-prob of the text's next token; NaN at each text's last token."""
    text: np.ndarray
    """``[tokens]`` int32 index of the token's text in the suite."""
    position: np.ndarray
    """``[tokens]`` int32 position of the token in its text."""
    layers: tuple[int, ...]
    """Decoder-layer index of each entry of the layers axis."""
    num_experts: int

    @property
    def top_k(self) -> int:
        return self.routes.shape[2]

    @property
    def tokens(self) -> int:
        return self.routes.shape[0]


def tokenize_suite(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_tokens: int | None) -> list[list[int]]:
    """Token ids of each text (no special tokens), each cut to ``max_tokens``; empty texts are refused."""
    if max_tokens is not None and max_tokens < 2:
        raise ProbeError(f"max_tokens must be >= 2 (a next-token log-prob needs two tokens), got {max_tokens}")
    ids = [tokenizer.encode(text, add_special_tokens=False)[:max_tokens] for text in texts]
    empty = [i for i, row in enumerate(ids) if not row]
    if empty:
        raise ProbeError(f"suite text {empty[0]} has no tokens under this tokenizer")
    return ids


_FIELDS = ("routes", "margin", "entropy", "logp", "text", "position")


def right_padded(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id rows right-padded to the longest: ``ids`` and ``attention_mask``, both ``[rows, longest]``."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)  # [b, seq]
    mask = torch.zeros_like(ids)  # [b, seq]
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask


@torch.no_grad()
def _record_batch(model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, first_text: int) -> dict:
    """One batch's part of a :class:`ProbeRecord` (any padding side), plus its layers and expert count."""
    from moestab.routing import RoutingRecorder

    with RoutingRecorder(model, margin=True, entropy=True, slot_scores=True) as recorder:
        logits = model(input_ids=ids, attention_mask=mask).logits  # [b, seq, vocab]
    routes = recorder.routes.ranked()
    real = mask.bool()  # [b, seq]
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [b, seq-1, vocab]
    nxt = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)  # [b, seq-1]
    nxt = nxt.masked_fill(~real[:, 1:], float("nan"))  # the next position is padding: no next token
    nxt = torch.cat([nxt, torch.full_like(nxt[:, :1], float("nan"))], dim=1)  # [b, seq]
    text = torch.arange(first_text, first_text + ids.shape[0], device=ids.device)[:, None].expand_as(ids)  # [b, seq]
    position = mask.long().cumsum(1) - 1  # [b, seq] position among the text's real tokens
    return {
        "routes": routes.indices[real].cpu().numpy().astype(np.int16),  # [t, layers, k]
        "margin": routes.margin[real].cpu().numpy().astype(np.float32),  # [t, layers]
        "entropy": routes.entropy[real].cpu().numpy().astype(np.float32),  # [t, layers]
        "logp": nxt[real].cpu().numpy().astype(np.float32),  # [t]
        "text": text[real].cpu().numpy().astype(np.int32),
        "position": position[real].cpu().numpy().astype(np.int32),
        "meta": (routes.layers, routes.num_experts),
    }


def _assemble(parts: list[dict]) -> ProbeRecord:
    layers, num_experts = parts[0]["meta"]
    return ProbeRecord(**{k: np.concatenate([p[k] for p in parts]) for k in _FIELDS}, layers=tuple(layers),
                       num_experts=num_experts)


def _batches(starts: range, progress: bool):
    if not progress:
        return starts
    from tqdm.auto import tqdm

    return tqdm(starts, desc="probe", unit="batch")


def record_batches(
    model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
    batch_size: int = 16, progress: bool = False,
) -> ProbeRecord:
    """:class:`ProbeRecord` of already tokenized ``input_ids`` / ``attention_mask`` ``[texts, seq]`` (either padding
    side; padding positions are left out), run ``batch_size`` rows at a time."""
    ids = torch.as_tensor(input_ids)
    mask = torch.ones_like(ids) if attention_mask is None else torch.as_tensor(attention_mask)
    if ids.dim() != 2 or mask.shape != ids.shape:
        raise ProbeError(f"input_ids and attention_mask must be [texts, seq], got {tuple(ids.shape)} and "
                         f"{tuple(mask.shape)}")
    if batch_size < 1:
        raise ProbeError(f"batch_size must be >= 1, got {batch_size}")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        parts = [_record_batch(model, ids[i : i + batch_size].to(device), mask[i : i + batch_size].to(device), i)
                 for i in _batches(range(0, ids.shape[0], batch_size), progress)]
    finally:
        model.train(was_training)
    return _assemble(parts)


@torch.no_grad()
def collect(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    *,
    batch_size: int = 16,
    max_tokens: int | None = None,
    progress: bool = False,
) -> ProbeRecord:
    """Routes, margins and next-token log-probs of ``model`` on ``texts`` (see :class:`ProbeRecord`).

    Each batch is right-padded to its own longest text. ``batch_size=1`` runs one sequence at a time: no padding,
    the shapes an inference engine serving one request would use; comparing it with a batched record measures
    batch-shape numerics.
    """
    if batch_size < 1:
        raise ProbeError(f"batch_size must be >= 1, got {batch_size}")
    if not texts:
        raise ProbeError("the suite has no texts")
    rows = tokenize_suite(tokenizer, texts, max_tokens)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    parts = []
    try:
        for start in _batches(range(0, len(rows), batch_size), progress):
            ids, mask = right_padded(rows[start : start + batch_size], pad)
            parts.append(_record_batch(model, ids.to(device), mask.to(device), start))
    finally:
        model.train(was_training)
    return _assemble(parts)
