"""Sample-based KL estimators between two per-token log-prob tensors (Schulman's k1 / k3).

Convention (REFERENCES.md, "Train-inference mismatch"): the tokens were sampled from ``p``, and ``q`` is the
other distribution; with ``d = logp_q - logp_p`` on each response token

- ``k1 = -d``                  unbiased for ``KL(p || q)``, can be negative per token;
- ``k3 = exp(d) - 1 - d``      unbiased for ``KL(p || q)``, >= 0 per token (computed as ``expm1(d) - d``).

Uses in moestab:

- rollout vs trainer mismatch: ``p`` = rollout engine (``mu``), ``q`` = trainer (``pi``), ``d = log pi - log mu``;
- old -> new drift (loss metrics ``kl/old_new_k1``, ``kl/old_new_k3``): ``p = pi_old`` (the rollout samples were
  drawn from it), ``q = pi``, ``d = logp - old_logp = log w``;
- the reference penalty: ``k3`` with ``p = pi`` and ``q = pi_ref``, i.e. ``exp(ref - logp) - (ref - logp) - 1`` per
  token, as in DeepSeekMath's GRPO (arXiv 2402.03300, Eq. 4) and TRL's ``beta`` term; gradient flows through
  ``logp``.

The per-token formulas are :mod:`moestab.metrics.kl`'s (shared with the mismatch metrics). Per-token
functions return 0 at masked positions; the batch estimators average over all response tokens of the
batch (token-weighted) and return NaN when there are none.
"""

from __future__ import annotations

import torch

from moestab.metrics.kl import k1_terms, k3_terms
from moestab.rl.masking import masked_fill_zero, masked_mean


def kl_k1_per_token(logp_p: torch.Tensor, logp_q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token ``k1 = logp_p - logp_q`` on response tokens, 0 elsewhere.

    Args:
        logp_p: ``[batch, seq]`` log-probs of the sampled tokens under the sampling distribution ``p``.
        logp_q: ``[batch, seq]`` log-probs of the same tokens under ``q``.
        mask: ``[batch, seq]`` bool response mask.

    Returns:
        ``[batch, seq]``.
    """
    return masked_fill_zero(k1_terms(logp_q - logp_p), mask)  # [batch, seq]


def kl_k3_per_token(logp_p: torch.Tensor, logp_q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token ``k3 = exp(d) - 1 - d``, ``d = logp_q - logp_p``, on response tokens, 0 elsewhere.

    Args:
        logp_p: ``[batch, seq]`` log-probs under the sampling distribution ``p``.
        logp_q: ``[batch, seq]`` log-probs under ``q``.
        mask: ``[batch, seq]`` bool response mask.

    Returns:
        ``[batch, seq]``, >= 0.
    """
    d = masked_fill_zero(logp_q - logp_p, mask)  # [batch, seq]
    return k3_terms(d)  # [batch, seq]; 0 where d = 0 (masked)


def kl_k1(logp_p: torch.Tensor, logp_q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean ``k1`` estimate of ``KL(p || q)`` over the batch's response tokens (0-dim; NaN if none)."""
    return masked_mean(kl_k1_per_token(logp_p, logp_q, mask), mask)


def kl_k3(logp_p: torch.Tensor, logp_q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean ``k3`` estimate of ``KL(p || q)`` over the batch's response tokens (0-dim; NaN if none)."""
    return masked_mean(kl_k3_per_token(logp_p, logp_q, mask), mask)
