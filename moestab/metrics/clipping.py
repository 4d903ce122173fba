"""The one definition of a clip fraction, for numpy arrays and torch tensors.

A unit (a response token, or a sequence) counts as clipped when the ratio that governs it in the loss was clipped
(:class:`moestab.rl.metrics.ClipFlags`). Every clip fraction moestab reports is :func:`clipped_fraction` of such
flags: the loss's per-minibatch diagnostics (``moestab.rl.metrics.clip_metrics``: torch, on the loss's device,
without a host sync) and the step's fractions in metrics.jsonl and ``moestab analyze``
(:func:`moestab.metrics.ratios.clip_fractions`: numpy, over the token tables' rows). Like :mod:`moestab.metrics.kl`,
it is a module of its own so that the torch loss imports neither pandas nor the step statistics.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

A = TypeVar("A")  # numpy array or torch tensor


def clipped_fraction(clipped: A, valid: A) -> A:
    """``|clipped & valid| / |valid|``: the share of the valid units whose governing ratio was clipped, NaN when no
    unit is valid.

    Both are bool arrays of one shape. The counts are divided in float64: numpy arrays give a Python float, torch
    tensors a 0-dim float64 tensor on their device (cast it to the loss's dtype: the quotient of two counts rounds
    the same way whether it is computed in float32 or in float64 and then rounded to float32).
    """
    hits, units = (clipped & valid).sum(), valid.sum()  # type: ignore[operator]
    if isinstance(hits, np.generic | np.ndarray):
        return float(hits) / float(units) if units else float("nan")  # type: ignore[return-value]
    return hits.double() / units.double()  # type: ignore[union-attr]
