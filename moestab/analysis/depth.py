"""Router flips against depth, read against the independent-layer baseline.

If each of a token's ``L`` routers flipped independently with the same probability ``p`` (the router flip rate,
``routing/{pair}/router_flip``), the share of tokens with at least one flipped layer (``routing/{pair}/token_flip``)
would be ``1 - (1 - p)^L``. That alone makes the token share grow with depth at a constant ``p``. R3 reports "10%
of routers, 94% of tokens" on a 48-layer model, where independent routers would give 99.4%: its 94% means flips that
fall together on the same tokens (notebook 02 works the arithmetic). At the measured ``p``, anything that makes
a token's layers flip together (a flip cascading into later layers, tokens that are fragile in every layer) puts
the token flip *below* the baseline, since the same flips then fall on fewer tokens; above it only when flips avoid
each other's tokens. A token flip at the baseline means depth adds independent chances, nothing that compounds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd


def independent_token_flip(router_flip: np.ndarray | float, layers: np.ndarray | int) -> np.ndarray:
    """``1 - (1 - p)^L``: the share of tokens with >= 1 flipped layer if each of ``L`` layers flipped independently
    with probability ``p`` (broadcast; ``router_flip`` in [0, 1], ``layers`` >= 0). Float64, NaN where ``p`` is."""
    p = np.asarray(router_flip, dtype=np.float64)  # [...]
    n = np.asarray(layers, dtype=np.float64)  # [...]
    if np.any(p[np.isfinite(p)] < 0) or np.any(p[np.isfinite(p)] > 1):
        raise ValueError(f"router_flip must lie in [0, 1], got {p}")
    if np.any(n < 0):
        raise ValueError(f"layers must be >= 0, got {n}")
    with np.errstate(divide="ignore", invalid="ignore"):  # p = 1: log 0 = -inf, and 0 * -inf at L = 0
        flipped = -np.expm1(n * np.log1p(-p))  # 1 - (1 - p)^L, exact for small p
    return np.where(n == 0, np.where(np.isnan(p), np.nan, 0.0), flipped)


def depth_baseline(table: pd.DataFrame, pairs: Sequence[str] = ("old_new",), layers: str = "depth") -> pd.DataFrame:
    """``table`` (one row per policy: ``layers`` and, per pair, ``{pair}_router_flip`` and ``{pair}_token_flip``, as
    the depth probe gives them) with, per pair, ``{pair}_token_flip_independent`` (:func:`independent_token_flip` of
    the row's router flip and depth) and ``{pair}_token_flip_excess`` (measured / independent: 1 at independence,
    below 1 when flips fall on the same tokens; NaN when the baseline is 0)."""
    out = table.copy()
    for pair in pairs:
        router, token = f"{pair}_router_flip", f"{pair}_token_flip"
        missing = [c for c in (layers, router, token) if c not in table.columns]
        if missing:
            raise KeyError(f"depth_baseline needs column(s) {missing}; has {list(table.columns)}")
        predicted = independent_token_flip(table[router].to_numpy(np.float64), table[layers].to_numpy())  # [rows]
        with np.errstate(invalid="ignore", divide="ignore"):
            excess = np.where(predicted > 0, table[token].to_numpy(np.float64) / predicted, np.nan)  # [rows]
        out[f"{token}_independent"] = predicted
        out[f"{token}_excess"] = excess
    return out
