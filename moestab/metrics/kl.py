"""Per-token KL estimators (Schulman's k1 / k3) and the extreme-token threshold: their one definition.

With tokens sampled from ``p`` and ``d = log q - log p`` per token (REFERENCES "Train-inference
mismatch"): ``k1 = -d`` and ``k3 = exp(d) - 1 - d`` (>= 0, computed as ``expm1(d) - d``), both
unbiased for ``KL(p || q)``; a token is *extreme* when ``|d| > ln 2`` (F(2); AReaL's ``extreme_frac_tau2``, and
``|d| > ln 5`` its ``extreme_frac_tau5``). The functions take numpy
arrays or torch tensors (gradients flow through torch), so the loss's KL terms (``moestab.rl.kl``)
and the mismatch metrics (:mod:`moestab.metrics.mismatch`) share them.
"""

from __future__ import annotations

import math
from typing import TypeVar

import numpy as np

A = TypeVar("A")  # numpy array or torch tensor

EXTREME_LOG_RATIO = math.log(2.0)
"""``|d|`` above this is an extreme token: a probability ratio outside [1/2, 2] (F(2))."""
EXTREME_LOG_RATIO_5 = math.log(5.0)
"""``|d|`` above this: a probability ratio outside [1/5, 5] (F(5), AReaL's ``extreme_frac_tau5``)."""


def k1_terms(d: A) -> A:
    """``k1 = -d`` per token."""
    return -d  # type: ignore[operator]


def k3_terms(d: A) -> A:
    """``k3 = exp(d) - 1 - d`` per token, >= 0, exact near 0 through ``expm1``."""
    expm1 = d.expm1() if hasattr(d, "expm1") else np.expm1(d)  # torch tensor, else numpy
    return expm1 - d  # type: ignore[operator]


def extreme_terms(d: A, threshold: float = EXTREME_LOG_RATIO) -> A:
    """``1[|d| > threshold]`` per token (bool); the default threshold ``ln 2`` is F(2)."""
    return abs(d) > threshold  # type: ignore[operator]
