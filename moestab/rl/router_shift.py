"""RSPO's router-shift weight (Router-Shift Policy Optimization, arXiv 2510.23027).

For each response token ``t`` of sequence ``i``, with ``e_lk`` the ``k``-th of the top-``K`` experts chosen at
MoE layer ``l`` under the OLD policy:

    gamma[i,t] = exp( -(1/L) sum_l (1/K) sum_k |log r_new(e_lk) - log r_old(e_lk)| ),

floored at ``gamma_min`` and stop-gradient. ``gamma = 1`` when the router's scores for the old experts did not
move; it shrinks towards ``gamma_min`` as the router drifts. The paper uses it as a per-token trust weight
(see ``moestab.rl.losses.rspo_loss`` for how moestab applies it).
"""

from __future__ import annotations

import math

import torch

from moestab.rl.masking import masked_fill_zero


def check_gamma_min(gamma_min: float) -> None:
    """Raise unless ``0 <= gamma_min <= 1``."""
    if not (isinstance(gamma_min, (int, float)) and math.isfinite(gamma_min) and 0.0 <= gamma_min <= 1.0):
        raise ValueError(f"gamma_min must be a number in [0, 1], got {gamma_min!r}")


def router_shift_weights(
    router_logp_new: torch.Tensor,
    router_logp_old: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma_min: float,
) -> torch.Tensor:
    """Per-token router-shift weight ``gamma`` (RSPO), floored at ``gamma_min``, detached.

    Args:
        router_logp_new: ``[batch, seq, layers, top_k]`` log router probabilities, under the current router,
            of the experts that the OLD policy chose (gather the new router's log-softmax at the old top-k ids).
        router_logp_old: ``[batch, seq, layers, top_k]`` the same experts' log probabilities under the old router.
        mask: ``[batch, seq]`` bool response mask; gamma is 1 at masked positions (values there are not read).
        gamma_min: floor in ``[0, 1]``.

    Returns:
        ``[batch, seq]`` weights in ``[gamma_min, 1]``, no gradient.
    """
    check_gamma_min(gamma_min)
    if router_logp_new.dim() != 4 or tuple(router_logp_new.shape) != tuple(router_logp_old.shape):
        raise ValueError(
            "router_logp_new and router_logp_old must both be [batch, seq, layers, top_k] with equal shapes; "
            f"got {tuple(router_logp_new.shape)} and {tuple(router_logp_old.shape)}"
        )
    if tuple(router_logp_new.shape[:2]) != tuple(mask.shape):
        raise ValueError(
            f"router log-probs have [batch, seq] = {tuple(router_logp_new.shape[:2])}; expected {tuple(mask.shape)}"
        )
    if router_logp_new.shape[2] == 0 or router_logp_new.shape[3] == 0:
        raise ValueError("router log-probs need at least one layer and one expert slot")
    with torch.no_grad():
        diff = masked_fill_zero(router_logp_new - router_logp_old, mask[:, :, None, None])  # [batch, seq, L, K]
        shift = diff.abs().mean(dim=-1).mean(dim=-1)  # [batch, seq]: mean over K, then over L
        if not bool(torch.isfinite(shift).all()):
            raise ValueError("router log-probs are not finite on some response tokens")
        return torch.exp(-shift).clamp(min=gamma_min)  # [batch, seq]
