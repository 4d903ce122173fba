"""Step aggregates over all response tokens: loss statistics, routing volatility, mismatch, load.

Routing numbers use the analyzers' own functions (``moestab.analysis``), so a step's logged
volatility and an offline analysis of its tables are the same computation.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from moestab.analysis.experts import expert_counts, load_stats
from moestab.analysis.mismatch import mismatch_stats
from moestab.analysis.volatility import INVALID, intersection_sizes

if TYPE_CHECKING:
    from moestab.train.step import StepTensors


def scalar_metrics(per_minibatch: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """Mean over minibatches of each loss metric, under ``loss/``; NaN-valued entries are skipped."""
    out: dict[str, float] = {}
    for key in per_minibatch[0]:
        values = [float(m[key]) for m in per_minibatch if math.isfinite(float(m[key]))]
        out[f"loss/{key}"] = sum(values) / len(values) if values else float("nan")
    return out


def _token_routes(indices: torch.Tensor, tensors: StepTensors) -> np.ndarray:
    """``[B, L, layers, k]`` routes -> ``[tokens, layers, k]`` int16 at the response tokens."""
    batch = tensors.batch
    resp = indices[:, batch.prompt_len - 1 :]  # [B, T, layers, k]
    return resp[batch.response_mask].cpu().numpy()


def _changed(inter: np.ndarray, top_k: int) -> float:
    """Slot-level changed fraction of intersection sizes ``[tokens, layers]`` (INVALID excluded)."""
    valid = inter != INVALID
    return float(1.0 - inter[valid].sum() / (top_k * valid.sum())) if valid.any() else float("nan")


def _volatility(prefix: str, a: np.ndarray, b: np.ndarray) -> dict[str, object]:
    # The analyzers' kernel with plain numpy reductions: the pandas tables of route_volatility cost
    # ~7 ms a call, more than the kernel itself on one step's tokens (bench/bench_train.py).
    top_k = a.shape[-1]
    inter = intersection_sizes(a, b, threads=1)  # [tokens, layers] uint8, INVALID = unrecorded
    valid = inter != INVALID
    flipped = valid & (inter < top_k)  # [tokens, layers]
    return {
        f"routing/{prefix}/changed": _changed(inter, top_k),
        f"routing/{prefix}/router_flip": float(flipped.sum() / max(valid.sum(), 1)),
        f"routing/{prefix}/token_flip": float(flipped.any(axis=1)[valid.any(axis=1)].mean()),
        f"routing/{prefix}/changed_by_layer": [_changed(inter[:, [j]], top_k) for j in range(inter.shape[1])],
    }


def routing_metrics(t: StepTensors, *, replay: str) -> dict[str, object]:
    batch = t.batch
    mask = batch.response_mask
    old = _token_routes(t.routes_old.indices, t)
    new = _token_routes(t.routes_new.indices, t)
    rollout = _token_routes(batch.routes.indices, t)
    out: dict[str, object] = {**_volatility("old_new", old, new), **_volatility("rollout_old", rollout, old)}

    # Per minibatch index: how far the free routes at update time had drifted from pi_old's.
    by_mb: list[float | None] = []
    if replay == "off":
        inter = intersection_sizes(_token_routes(t.routes_update, t), old, threads=1)  # [tokens, layers]
        mb_of_token = t.minibatch[:, None].expand_as(mask)[mask].numpy()  # [tokens]
        top_k = old.shape[-1]
        for m in range(int(t.minibatch.max()) + 1):
            sel = mb_of_token == m
            by_mb.append(_changed(inter[sel], top_k) if sel.any() else None)
    out["routing/update_old/changed_by_minibatch"] = by_mb or None

    mm = mismatch_stats(t.logp_old_free[mask].cpu().numpy(), batch.logp_rollout[mask].cpu().numpy())
    out["mismatch/k1"] = mm["k1"]
    out["mismatch/k3"] = mm["k3"]
    out["mismatch/extreme_frac"] = mm["extreme_frac"]

    counts = expert_counts(old, t.routes_old.num_experts)  # [layers, experts]
    out["experts/load"] = (counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)).round(6).tolist()
    out["experts/load_entropy"] = [float(v) for v in load_stats(counts)["load_entropy"]]
    if t.routes_old.entropy is not None:
        entropy = t.routes_old.entropy[:, batch.prompt_len - 1 :][mask]  # [tokens, layers]
        out["experts/router_entropy"] = entropy.mean(0).tolist()
    return out

