"""Score-threshold replay (prime-rl PR #2703, REFERENCES "prime-rl score-threshold replay"): a replayed expert is kept
only when the trainer's router scores it at least ``ratio`` times the trainer's weakest own top-k score for that token;
each rejected slot is refilled from the trainer's own top-k, best first, skipping experts already kept. ``ratio`` 0 is
plain replay; the share of replayed slots refilled is prime-rl's ``router_replay_replace_rate``.

The *router score* is the routing probability prime-rl thresholds: the sigmoid of the router logits for families that
score experts by a sigmoid (DeepSeek-V3 and its descendants; without the selection bias, which only steers the
choice), and softmax over the experts for every other family. The decision is made without gradient; the gates of
the chosen experts are then computed from the live logits as in any replay, so the router keeps its gradient.
"""

from __future__ import annotations

import torch

from moestab.routing.adapters import RouterAdapter


def router_scores(adapter: RouterAdapter, logits: torch.Tensor) -> torch.Tensor:
    """``[N, E]`` float32 routing probabilities from router ``logits`` ``[N, E]`` (module docstring)."""
    work = logits.detach().float()  # [N, E]
    if getattr(adapter.selection_scores, "base", "logits") == "sigmoid":
        return work.sigmoid()
    return torch.softmax(work, dim=-1)


def threshold_routes(
    scores: torch.Tensor, own: torch.Tensor, forced: torch.Tensor, ratio: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply the threshold to one layer's replayed routes.

    Args:
        scores: ``[N, E]`` the trainer's router scores.
        own: ``[N, k]`` the trainer's own top-k experts (its router's free choice).
        forced: ``[N, k]`` the experts to replay, -1 where the router keeps its own choice (padding).
        ratio: keep a replayed expert when its score is ``>= ratio * min(scores[own])``.

    Returns:
        ``(chosen [N, k], rejected [N, k] bool)``: the replayed experts with each rejected slot refilled in place by
        the trainer's own experts in order of score, skipping those already kept; ``-1`` stays where ``forced`` had it.
    """
    k = own.shape[1]
    replayed = forced >= 0  # [N, k]
    own_scores = scores.gather(1, own)  # [N, k]
    weakest = own_scores.min(dim=1, keepdim=True).values  # [N, 1]
    rejected = replayed & (scores.gather(1, forced.clamp_min(0)) < ratio * weakest)  # [N, k]
    kept = forced.masked_fill(rejected, -1)  # [N, k]
    best_first = own.gather(1, own_scores.argsort(dim=1, descending=True, stable=True))  # [N, k]
    candidate = ~(best_first[:, :, None] == kept[:, None, :]).any(dim=2)  # [N, k] own experts not kept
    # The r-th rejected slot (in slot order) takes the r-th candidate (in score order); a row always has enough
    # candidates: its k - r kept experts can hold at most k - r of its k own ones.
    cand_rank = candidate.cumsum(dim=1) - 1  # [N, k]
    slots = torch.full((own.shape[0], k + 1), -1, dtype=own.dtype, device=own.device)  # [N, k + 1]
    slots.scatter_(1, torch.where(candidate, cand_rank, k), best_first)  # column k collects the non-candidates
    reject_rank = (rejected.cumsum(dim=1) - 1).clamp_min(0)  # [N, k]
    refill = slots.gather(1, reject_rank)  # [N, k]
    return torch.where(rejected, refill, forced), rejected
