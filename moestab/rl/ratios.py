"""Importance ratios between the current policy ``pi`` and the behaviour policy ``pi_old``.

- Token ratio (GRPO / PPO): ``w[i,t] = pi(y_t | x, y_<t) / pi_old(y_t | x, y_<t) = exp(logp - old_logp)``.
- Sequence ratio (GSPO, arXiv 2507.18071, Eq. 7): ``s[i] = (pi(y_i|x) / pi_old(y_i|x)) ** (1/|y_i|)
  = exp(mean_t log w[i,t])``, the mean over the response tokens of row ``i``.
- GSPO-token ratio (Eq. 13-14): ``s[i,t] = sg[s_i] * pi(y_t) / sg[pi(y_t)]``; its value is ``s_i`` at every
  token, its gradient w.r.t. ``logp[i,t]`` is ``s_i`` (only through the token's own log-prob).

Masked positions: log-ratios are exactly 0 there (ratios exactly 1), whatever ``logp`` / ``old_logp`` hold, and
no gradient flows to them. An all-masked row has ``s = 1`` (log-ratio 0), never NaN.

``old_logp`` is treated as a constant (detached) everywhere.
"""

from __future__ import annotations

import torch

from moestab.rl.masking import masked_fill_zero, masked_row_mean


def token_log_ratios(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``log w = logp - old_logp`` on response tokens, 0 elsewhere.

    Args:
        logp: ``[batch, seq]`` log-probs under ``pi`` (carries the gradient).
        old_logp: ``[batch, seq]`` log-probs under ``pi_old``.
        mask: ``[batch, seq]`` bool response mask.

    Returns:
        ``[batch, seq]``.
    """
    return masked_fill_zero(logp - old_logp.detach(), mask)  # [batch, seq]


def token_ratios(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``w = exp(logp - old_logp)`` on response tokens, 1 elsewhere: ``[batch, seq]`` -> ``[batch, seq]``."""
    return torch.exp(token_log_ratios(logp, old_logp, mask))  # [batch, seq]


def sequence_log_ratios(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``log s[i] = mean_t (logp - old_logp)`` over row ``i``'s response tokens (0 for an empty row).

    The loss's differentiable form of log s (torch, on the padded batch); every measurement of log s (step metrics,
    ``moestab analyze``) uses :func:`moestab.metrics.ratios.sequence_log_ratios`, checked equal to this one in
    tests/metrics/test_owners.py.

    Returns:
        ``[batch]``.
    """
    return masked_row_mean(token_log_ratios(logp, old_logp, mask), mask)  # [batch]


def sequence_ratios(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Length-normalised sequence ratio ``s[i] = exp(mean_t log w[i,t])`` (GSPO Eq. 7): ``[batch]``."""
    return torch.exp(sequence_log_ratios(logp, old_logp, mask))  # [batch]


def sequence_token_ratios(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO-token ratio ``s[i,t] = sg[s_i] * pi(y_t) / sg[pi(y_t)]`` (GSPO Eq. 14).

    Written as ``exp(sg[log s_i] + logp - sg[logp])``: the exponent's value is exactly ``log s_i`` (``x - x`` is
    exactly 0 in floating point), so the value equals ``s_i`` bit for bit, and the gradient w.r.t.
    ``logp[i,t]`` is ``s_i``.

    Returns:
        ``[batch, seq]``; 1 at masked positions.
    """
    log_s = sequence_log_ratios(logp, old_logp, mask).detach()  # [batch]
    own = masked_fill_zero(logp - logp.detach(), mask)  # [batch, seq], value 0, gradient 1 on response tokens
    return torch.exp(masked_fill_zero(log_s[:, None] + own, mask))  # [batch, seq]
