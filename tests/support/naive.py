"""Second, deliberately plain implementations (Python sets and loops) to check the analyzers against."""

from __future__ import annotations

import math

import numpy as np


def decision_overlaps(a: np.ndarray, b: np.ndarray) -> list[list[int | None]]:
    """``|set(a[t, l]) ∩ set(b[t, l])|`` per decision, ``None`` if either holds a -1."""
    out = []
    for t in range(a.shape[0]):
        row = []
        for layer in range(a.shape[1]):
            sa, sb = a[t, layer].tolist(), b[t, layer].tolist()
            row.append(None if min(sa) < 0 or min(sb) < 0 else len(set(sa) & set(sb)))
        out.append(row)
    return out


def volatility_metrics(a: np.ndarray, b: np.ndarray, tokens: list[int] | None = None) -> dict[str, float]:
    """Every volatility metric over the decisions of ``tokens`` (all if None), from Python sets."""
    k = a.shape[2]
    overlaps = decision_overlaps(a, b)
    rows = range(a.shape[0]) if tokens is None else tokens
    changed, flips, jaccard = [], [], []
    token_flipped, token_routers_flipped = [], []
    for t in rows:
        recorded = [v for v in overlaps[t] if v is not None]
        for v in recorded:
            changed.append(1 - v / k)
            flips.append(v < k)
            jaccard.append(1 - v / (2 * k - v))
        if recorded:
            token_flipped.append(any(v < k for v in recorded))
            token_routers_flipped.append(sum(v < k for v in recorded))

    def mean(xs: list) -> float:
        return float(np.mean(xs)) if xs else math.nan

    return {
        "changed": mean(changed),
        "router_flip": mean(flips),
        "jaccard_distance": mean(jaccard),
        "token_flip": mean(token_flipped),
        "routers_flipped_per_token": mean(token_routers_flipped),
        "routers": len(changed),
        "tokens": len(token_flipped),
    }
