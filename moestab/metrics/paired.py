"""Paired differences and their 95% t-interval (no scipy: the t quantile is computed here, numpy only).

For paired outcomes ``a_s`` and ``b_s`` on the same seeds ``s = 1..n``, the differences ``d_s = a_s - b_s`` have

    mean  d_bar = sum(d_s) / n
    sd    s_d   = sqrt(sum((d_s - d_bar)^2) / (n - 1))
    95% CI      = d_bar -+ t_{0.975, n-1} * s_d / sqrt(n)

where ``t_{0.975, n-1}`` is the 97.5% quantile of Student's t with n - 1 degrees of freedom (2.776 for n = 5).

Power of that design (the two-sided paired t-test at level ``alpha``, the interval excluding 0): with a true mean
difference ``delta`` and paired sd ``sigma``, ``T = (Z + lam) / S`` with ``lam = delta * sqrt(n) / sigma``,
``Z ~ N(0, 1)`` and ``S = sqrt(chi2_{n-1} / (n - 1))`` independent (the noncentral t), so

    power = P(|T| > c) = E_S[ Phi(lam - c S) + Phi(-lam - c S) ],   c = t_{1 - alpha/2, n-1},

integrated here over the density of S. The minimum detectable difference is the ``delta`` whose power is the
requested one (0.8 by convention).
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


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    """Phi(x), elementwise (math.erfc: numpy has no erf)."""
    return np.vectorize(math.erfc, otypes=[float])(-x / math.sqrt(2)) / 2


def _check_design(sd: float, n: int, alpha: float) -> None:
    if n < 2:
        raise ValueError(f"n must be >= 2 pairs, got {n}")
    if not sd > 0:
        raise ValueError(f"sd must be > 0, got {sd}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")


def _rejection_probability(lam: float, c: float, df: int) -> float:
    """P(|T| > c) for the noncentral t with ``df`` degrees of freedom and noncentrality ``lam`` (module docstring),
    integrated over the density of S with Simpson's rule."""
    # S has mean ~1 and sd ~1 / sqrt(2 df): 40 of those either side hold all of its mass that matters.
    spread = 40 / math.sqrt(2 * df)
    s = np.linspace(max(0.0, 1 - spread), 1 + spread, _GRID + 1)  # [grid + 1]
    log_c = math.log(2) + df / 2 * math.log(df / 2) - math.lgamma(df / 2)
    density = np.exp(log_c - df * s**2 / 2) * s ** (df - 1)  # [grid + 1], the density of S
    rejected = _normal_cdf(lam - c * s) + _normal_cdf(-lam - c * s)  # [grid + 1], P(|T| > c | S = s)
    weights = np.ones(_GRID + 1)
    weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
    return float(weights @ (density * rejected)) * (s[-1] - s[0]) / _GRID / 3


def paired_power(difference: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t-test at level ``alpha`` (the ``1 - alpha`` interval of :func:`paired_interval`
    excluding 0) when the paired differences of ``n`` pairs have mean ``difference`` and sd ``sd`` (module
    docstring: the noncentral t; exact to ~1e-9)."""
    _check_design(sd, n, alpha)
    return _rejection_probability(difference * math.sqrt(n) / sd, t_quantile(1 - alpha / 2, n - 1), n - 1)


def min_detectable_difference(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest mean paired difference that the two-sided paired t-test at level ``alpha`` on ``n`` pairs with
    paired sd ``sd`` detects with probability ``power`` (bisection on the power), in ``sd``'s units."""
    _check_design(sd, n, alpha)
    if not alpha < power < 1:
        raise ValueError(f"power must be in (alpha, 1) = ({alpha}, 1), got {power}")
    df, c = n - 1, t_quantile(1 - alpha / 2, n - 1)
    lo, hi = 0.0, 1.0  # in units of lam = delta * sqrt(n) / sd
    while _rejection_probability(hi, c, df) < power:
        hi *= 2
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _rejection_probability(mid, c, df) < power else (lo, mid)
    return (lo + hi) / 2 * sd / math.sqrt(n)
