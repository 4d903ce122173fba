"""How peaked and how balanced a model's routers are, per layer, on probe tokens (``moestab probe routers``).

A router whose k-th and (k+1)-th experts are far apart (a large top-k margin, in logits), whose softmax is nearly
one-hot (a low normalised entropy) and whose load piles onto a few experts (a high ``max_vio``, experts left idle)
barely changes its choice under a small update: the routing-volatility question needs routers like a pre-trained
MoE's, which a load-balancing loss keeps spread (docs/routers.md).

Columns, per layer, over the real tokens:

- ``margin_p10`` / ``margin_p50`` / ``margin_p90``: quantiles of the gap between the k-th and (k+1)-th selection
  score (logits for softmax routers; ``moestab.routing`` records it);
- ``entropy_norm_p50`` and ``entropy_norm_mean``: the entropy of softmax(router logits) over ``ln E`` (1: uniform,
  0: one expert takes all the probability);
- ``max_vio``: ``(max_e N_e - mean_e N_e) / mean_e N_e`` of the experts' slot counts
  (:func:`moestab.metrics.experts.max_violation`, prime-rl's and verl's ``max_vio``; 0 when uniform);
- ``dead_experts`` (never chosen) and ``experts_under_1pct`` (under 1% of the layer's slots; uniform is 1/E).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from moestab.metrics.experts import expert_counts, max_violation

UNDER_SHARE = 0.01
"""An expert with less than this share of a layer's routed slots counts as nearly idle (``experts_under_1pct``)."""
COLUMNS = ("layer", "tokens", "margin_p10", "margin_p50", "margin_p90", "entropy_norm_p50", "entropy_norm_mean",
           "max_vio", "dead_experts", "experts_under_1pct")


def router_statistics(routes: np.ndarray, margin: np.ndarray, entropy: np.ndarray, num_experts: int,
                      layers: Sequence[int] | None = None) -> pd.DataFrame:
    """Per-layer router statistics (module docstring) of one model on probe tokens.

    ``routes`` ``[tokens, layers, top_k]`` int16 (-1: not recorded); ``margin`` and ``entropy`` (nats)
    ``[tokens, layers]`` float, NaN where not recorded; ``layers``: the decoder-layer index of each entry.
    """
    routes = np.asarray(routes)
    margin, entropy = np.asarray(margin, np.float64), np.asarray(entropy, np.float64)
    if routes.ndim != 3 or margin.shape != routes.shape[:2] or entropy.shape != routes.shape[:2]:
        raise ValueError(f"routes must be [tokens, layers, top_k] and margin, entropy [tokens, layers]; got "
                         f"{routes.shape}, {margin.shape}, {entropy.shape}")
    if num_experts < 2:
        raise ValueError(f"router statistics need at least 2 experts (a one-expert layer has no choice), got "
                         f"{num_experts}")
    labels = list(range(routes.shape[1])) if layers is None else list(layers)
    if len(labels) != routes.shape[1]:
        raise ValueError(f"layers must list {routes.shape[1]} labels, got {len(labels)}")
    counts = expert_counts(routes, num_experts)  # [layers, E]
    share = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)  # [layers, E]
    norm = entropy / np.log(num_experts)  # [tokens, layers]
    with np.errstate(all="ignore"):  # a layer without a recorded token: NaN quantiles, as nanquantile says
        quantiles = np.nanquantile(margin, [0.1, 0.5, 0.9], axis=0) if len(margin) else np.full((3, len(labels)),
                                                                                                 np.nan)
        entropy_p50 = np.nanmedian(norm, axis=0) if len(norm) else np.full(len(labels), np.nan)
        entropy_mean = np.nanmean(norm, axis=0) if len(norm) else np.full(len(labels), np.nan)
    return pd.DataFrame({
        "layer": labels,
        "tokens": (~np.isnan(entropy)).sum(axis=0),
        "margin_p10": quantiles[0], "margin_p50": quantiles[1], "margin_p90": quantiles[2],
        "entropy_norm_p50": entropy_p50, "entropy_norm_mean": entropy_mean,
        "max_vio": max_violation(counts),
        "dead_experts": (counts == 0).sum(axis=1),
        "experts_under_1pct": (share < UNDER_SHARE).sum(axis=1),
    }, columns=list(COLUMNS))
