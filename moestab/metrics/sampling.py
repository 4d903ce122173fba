"""Sampling error of a ratio metric measured on a random sample of whole groups (a measurement budget's sample).

A routing-change rate measured on ``m`` of a step's ``M`` groups is a ratio estimate ``R = sum y_g / sum x_g``
(``y_g``: changed decisions of group ``g``, ``x_g``: its decisions). Its standard error is the cluster-sampling
one (Cochran, *Sampling Techniques*, 3rd ed., eq. 6.13, with the finite-population correction for sampling without
replacement):

    se(R)^2 = (1 - m / M) / (m * xbar^2) * sum_g (y_g - R x_g)^2 / (m - 1)

Groups, not tokens, are the units: tokens of one sequence (and sequences of one prompt) change together, so a
token-level binomial error would be several times too small.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


def ratio_se(y: np.ndarray, x: np.ndarray, population: int) -> float:
    """Standard error of ``sum(y) / sum(x)`` for the sampled groups' ``y`` and ``x`` ``[m]`` out of ``population``
    groups; 0 when every group was measured, NaN with fewer than two groups (no spread to estimate from)."""
    y, x = np.asarray(y, np.float64), np.asarray(x, np.float64)  # [m] each
    m = len(x)
    if m > population:
        raise ValueError(f"{m} sampled groups out of a population of {population}")
    if m == population:
        return 0.0
    if m < 2 or x.sum() == 0:
        return math.nan
    ratio = y.sum() / x.sum()
    residual = y - ratio * x  # [m]
    variance = (1 - m / population) / (m * x.mean() ** 2) * (residual @ residual) / (m - 1)
    return float(math.sqrt(variance))


def mean_se(step_se: np.ndarray) -> float:
    """Standard error of the mean over steps of per-step estimates with standard errors ``step_se`` ``[steps]``
    (independent samples each step): ``sqrt(sum se^2) / steps``; NaN entries (unmeasured steps) are left out."""
    se = np.asarray(step_se, np.float64)
    se = se[np.isfinite(se)]
    return math.nan if se.size == 0 else float(math.sqrt(se @ se) / se.size)


def sample_groups(n_groups: int, fraction: float, seed: int) -> torch.Tensor:
    """``[m]`` sorted indices of the ``m = max(1, ceil(fraction * n_groups))`` groups a measurement budget measures
    (all of them at ``fraction`` 1): the first ``m`` of ``torch.randperm(n_groups)`` seeded with ``seed``. The rule
    run.json records (``moestab.recording.measure_budget.RULE``); the one place it is written. torch is imported here,
    not with the module: the analyzers import this module and must start without torch."""
    import torch

    if fraction >= 1.0:
        return torch.arange(n_groups)
    m = max(1, math.ceil(fraction * n_groups - 1e-9))
    return torch.randperm(n_groups, generator=torch.Generator().manual_seed(seed))[:m].sort().values
