"""A step's aggregates over *all* its response tokens, for metrics.jsonl (keys: docs/metrics.md).

Every number is computed by the functions of :mod:`moestab.metrics` that the analyzers also call on
the per-token tables, so a logged value and its offline recomputation cannot drift apart.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from moestab import rl
from moestab.metrics.experts import expert_counts, load_stats
from moestab.metrics.mismatch import mismatch_stats
from moestab.metrics.ratios import clip_fractions, ratio_stats
from moestab.metrics.routes import intersection_sizes, route_change
from moestab.recording.step_tensors import StepTensors
from moestab.records import schema

LOSS_METRIC_PREFIXES = ("objective/", "kl/", "rspo/")
"""Loss diagnostics logged as their mean over minibatches (``loss/<key>``). The loss's ratio and clip
statistics are not: per minibatch they would be averaged maxima and a diluted clip share, so the step
reports ``ratio/*`` and ``clip/*`` over all its tokens instead."""


def loss_metrics(per_minibatch: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """Mean over minibatches of the loss diagnostics of :data:`LOSS_METRIC_PREFIXES`, under ``loss/``.

    NaN-valued entries (e.g. ``kl/ref_k3`` without a reference) are skipped; all-NaN gives NaN.
    """
    out: dict[str, float] = {}
    for key in per_minibatch[0]:
        if not key.startswith(LOSS_METRIC_PREFIXES):
            continue
        values = [float(m[key]) for m in per_minibatch if math.isfinite(float(m[key]))]
        out[f"loss/{key}"] = sum(values) / len(values) if values else float("nan")
    return out


def _numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().numpy()


def _route_metrics(pair: str, inter: np.ndarray, top_k: int) -> dict[str, object]:
    rates = route_change(inter, top_k)  # one group: every value [1]
    return {
        f"routing/{pair}/changed": float(rates["changed"][0]),
        f"routing/{pair}/router_flip": float(rates["router_flip"][0]),
        f"routing/{pair}/token_flip": float(rates["token_flip"][0]),
        f"routing/{pair}/changed_by_layer": rates["changed_by_layer"][0].tolist(),
    }


def response_metrics(t: StepTensors) -> dict[str, float]:
    """Response length, share of non-zero advantages and pi_old's mean token entropy (when recorded) of a step."""
    mask = t.batch.response_mask  # [B, T]
    lengths = mask.sum(-1)  # [B]
    out = {
        "response/length_mean": lengths.float().mean().item(),
        "response/length_max": int(lengths.max()),
        "advantage/nonzero_frac": (t.advantages != 0).float().mean().item(),
    }
    if t.entropy is not None:
        out["entropy"] = rl.masked_mean(t.entropy, mask).item()
    return out


def step_metrics(t: StepTensors, per_minibatch: list[dict[str, torch.Tensor]], *, replay: str) -> dict[str, object]:
    """Every metrics.jsonl key of a step but times, reward and loss totals (docs/metrics.md)."""
    routes = {
        schema.COL_ROUTES_ROLLOUT: _numpy(t.response(t.batch.routes.indices)),  # [tokens, layers, k]
        schema.COL_ROUTES_OLD: _numpy(t.response(t.routes_old)),
        schema.COL_ROUTES_OLD_FREE: _numpy(t.response(t.routes_old_free.indices)),
        schema.COL_ROUTES_UPDATE: _numpy(t.response(t.routes_update)),
        schema.COL_ROUTES_NEW: _numpy(t.response(t.routes_new.indices)),
    }
    top_k = t.routes_old_free.top_k
    out: dict[str, object] = loss_metrics(per_minibatch)

    for pair in ("old_new", *schema.LOGP_PAIRS):
        col_a, col_b = schema.ROUTE_PAIRS[pair]
        out.update(_route_metrics(pair, intersection_sizes(routes[col_a], routes[col_b], threads=1), top_k))
    # Per minibatch: how far the free routes at update time had drifted from pi_old's. Under replay
    # the update forward does not choose its routes, so there is nothing to measure.
    minibatch = _numpy(t.per_token(t.minibatch))  # [tokens]
    by_mb = None
    if replay == "off":
        col_a, col_b = schema.ROUTE_PAIRS["update_old"]
        inter = intersection_sizes(routes[col_a], routes[col_b], threads=1)  # [tokens, layers]
        n_mb = int(t.minibatch.max()) + 1
        by_mb = route_change(inter, top_k, minibatch, n_mb)["changed"].tolist()  # NaN (-> null) for an empty one
    out["routing/update_old/changed_by_minibatch"] = by_mb

    logp = {
        schema.COL_LOGP_ROLLOUT: _numpy(t.tokens(t.batch.logp_rollout)),  # [tokens]
        schema.COL_LOGP_OLD: _numpy(t.tokens(t.logp_old)),
        schema.COL_LOGP_OLD_FREE: _numpy(t.tokens(t.logp_old_free)),
    }
    for pair, (rollout, trainer) in schema.LOGP_PAIRS.items():
        stats = mismatch_stats(logp[trainer], logp[rollout])
        out.update({f"mismatch/{pair}/{name}": stats[name] for name in ("k1", "k3", "f2")})

    sequence = _numpy(t.per_token(torch.arange(t.batch.batch_size)))  # [tokens]
    log_w = _numpy(t.tokens(t.log_w))  # [tokens]
    out.update({f"ratio/{k}": v for k, v in ratio_stats(log_w, sequence).items()})
    out.update({f"clip/{k}": v for k, v in clip_fractions(_numpy(t.tokens(t.clipped)), sequence, minibatch).items()})

    counts = expert_counts(routes[schema.COL_ROUTES_OLD_FREE], t.routes_old_free.num_experts)  # [layers, experts]
    out["experts/load"] = (counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)).round(6).tolist()
    out["experts/load_entropy"] = [float(v) for v in load_stats(counts)["load_entropy"]]
    if t.routes_old_free.entropy is not None:
        out["experts/router_entropy"] = t.response(t.routes_old_free.entropy).mean(0).tolist()  # [layers]
    if t.routes_old_free.confidence is not None:
        confidence = t.response(t.routes_old_free.confidence)  # [tokens, layers]
        out["experts/routing_confidence"] = confidence.mean(0).tolist()
        out["experts/routing_confidence_mean"] = confidence.mean().item()
    return out
