"""Router losses of MoE pre-training, for the warm start: Switch-style load balancing and ST-MoE's router z-loss.

Real MoEs are pre-trained with a load-balancing loss (Switch Transformer, arXiv 2101.03961, Eq. 4-6; OLMoE, arXiv
2409.02060, coefficient 0.01; Qwen computes it over the global batch, arXiv 2501.11873), often with a router z-loss
(ST-MoE, arXiv 2202.08906, Eq. 5; OLMoE 0.001). A warm start without them leaves peaked, unbalanced routers that
barely move under RL; moestab's warm start adds them (``moestab.train.warm_start``).

Both are computed per layer and averaged over layers, as Switch and ST-MoE define them. transformers'
``load_balancing_loss_func`` instead pools every layer's tokens before the product, so one layer's busy expert can
offset another's idle one; on a single layer it is ``top_k`` times :func:`load_balancing_loss` (tested).
"""

from __future__ import annotations

import torch


def _real_rows(router_logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``[layers, tokens, experts]`` restricted to the tokens where ``mask [tokens]`` is true (all without one)."""
    if router_logits.dim() != 3:
        raise ValueError(f"router_logits must be [layers, tokens, experts], got shape {tuple(router_logits.shape)}")
    if mask is None:
        return router_logits
    if mask.shape != router_logits.shape[1:2]:
        raise ValueError(f"mask must be [tokens] = [{router_logits.shape[1]}], got shape {tuple(mask.shape)}")
    return router_logits[:, mask.bool()]


def load_balancing_loss(router_logits: torch.Tensor, top_k: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Switch Transformer's auxiliary loss, per layer, averaged over layers: ``E * sum_e f_e * P_e`` with ``f_e`` the
    share of the layer's top-k slots that chose expert ``e`` (no gradient: a count) and ``P_e`` its mean router
    probability. 1 when both are uniform; its gradient pushes probability away from over-used experts.

    ``router_logits`` ``[layers, tokens, experts]``; ``mask`` ``[tokens]`` bool, the real (not padding) tokens.
    Returns a scalar in the logits' dtype (NaN with no real token).
    """
    logits = _real_rows(router_logits, mask)  # [layers, n, E]
    _, n, experts = logits.shape
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k must be 1 to {experts} (the experts), got {top_k}")
    probs = logits.softmax(dim=-1)  # [layers, n, E]
    chosen = probs.topk(top_k, dim=-1).indices  # [layers, n, k]
    slots = torch.zeros_like(probs).scatter_(-1, chosen, 1.0)  # [layers, n, E] 1 at each chosen expert
    share = slots.sum(dim=1) / (n * top_k)  # [layers, E] f_e, sums to 1 over experts
    mean_prob = probs.mean(dim=1)  # [layers, E] P_e
    return (experts * (share * mean_prob).sum(dim=-1)).mean()


def router_z_loss(router_logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """ST-MoE's router z-loss, per layer, averaged over layers: ``mean_t (logsumexp_e x_te)^2``. It keeps router
    logits small, so the softmax stays away from saturation (and bf16 rounding).

    ``router_logits`` ``[layers, tokens, experts]``; ``mask`` ``[tokens]`` bool, the real tokens.
    """
    logits = _real_rows(router_logits, mask)  # [layers, n, E]
    return logits.logsumexp(dim=-1).square().mean()
