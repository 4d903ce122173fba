"""Paired differences and their 95% t-interval (no scipy: the t quantile is computed here, numpy only).

For paired outcomes ``a_s`` and ``b_s`` on the same seeds ``s = 1..n``, the differences ``d_s = a_s - b_s`` have

    mean  d_bar = sum(d_s) / n
    sd    s_d   = sqrt(sum((d_s - d_bar)^2) / (n - 1))
    95% CI      = d_bar -+ t_{0.975, n-1} * s_d / sqrt(n)

where ``t_{0.975, n-1}`` is the 97.5% quantile of Student's t with n - 1 degrees of freedom (2.776 for n = 5).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_GRID = 20_000
"""Simpson intervals of the t density's integral: the quantile is exact to ~1e-9 for the df used here."""


def t_cdf(x: float, df: int) -> float:
    """P(T <= x) for Student's t with ``df`` degrees of freedom: 1/2 + the density integrated over [0, x] (Simpson)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    t = np.linspace(0.0, abs(x), _GRID + 1)  # [grid + 1]
    density = np.exp(log_c - (df + 1) / 2 * np.log1p(t**2 / df))  # [grid + 1]
    weights = np.ones(_GRID + 1)
    weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
    half = float(weights @ density) * abs(x) / _GRID / 3
    return 0.5 + math.copysign(half, x)


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on :func:`t_cdf`), 0.5 <= p < 1."""
    if not 0.5 <= p < 1:
        raise ValueError(f"p must be in [0.5, 1), got {p}")
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class PairedInterval:
    """Mean of the paired differences and its t-interval; sd and the bounds are NaN with fewer than 2 pairs."""

    n: int
    mean: float
    sd: float
    low: float
    high: float


def paired_interval(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> PairedInterval:
    """The differences ``a - b`` (paired by position) and their two-sided ``level`` t-interval (module docstring)."""
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} vs {len(b)}")
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)  # [n]
    n = len(d)
    if n == 0:
        raise ValueError("no pairs")
    mean = float(d.mean())
    if n < 2:
        return PairedInterval(n, mean, math.nan, math.nan, math.nan)
    sd = float(math.sqrt(((d - mean) ** 2).sum() / (n - 1)))
    half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return PairedInterval(n, mean, sd, mean - half, mean + half)
