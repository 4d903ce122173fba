"""Rollout-vs-trainer mismatch: how far the trainer's pi_old is from the rollout engine's sampler.

REFERENCES "Train-inference mismatch": with ``d = log pi_train - log mu_rollout`` on rollout tokens,
here ``d = logp_old - logp_rollout`` (docs/run-format.md ``mismatch/...``):

- ``k1 = mean(-d)`` (a KL(mu || pi) estimate), ``k3 = mean(exp(d) - 1 - d)`` (>= 0 per token),
- ``extreme_frac`` = F(2) = ``mean(|d| > ln 2)``,
- ``chi2_seq`` = ``E_seq[exp(2 sum_t d)] - 1``, the sequence-level chi-square estimate (inf when
  ``exp`` overflows float64).

Routing mismatch is the volatility between ``routes_rollout`` and ``routes_old``
(:mod:`moestab.analysis.volatility`, pair ``rollout_old``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from moestab.analysis.load import load_tokens
from moestab.analysis.volatility import run_volatility, volatility_table
from moestab.records import schema

MISMATCH_COLUMNS = ("tokens", "sequences", "mean_d", "std_d", "k1", "k3", "extreme_frac", "chi2_seq")


def mismatch_stats(
    logp_old: np.ndarray, logp_rollout: np.ndarray, sequence: np.ndarray | None = None
) -> dict[str, float]:
    """Mismatch statistics of token log-probs ``[tokens]`` (NaN pairs are dropped).

    ``sequence`` ``[tokens]`` labels each token's sequence (any hashable ids, e.g. ``step * B + seq``);
    without it ``chi2_seq`` is NaN. Returns the keys of :data:`MISMATCH_COLUMNS`.
    """
    old = np.asarray(logp_old, dtype=np.float64)
    rollout = np.asarray(logp_rollout, dtype=np.float64)
    if old.shape != rollout.shape or old.ndim != 1:
        raise ValueError(f"logp_old and logp_rollout must be [tokens] of one length, got {old.shape}, {rollout.shape}")
    d = old - rollout  # [tokens]
    keep = np.isfinite(d)
    d = d[keep]
    out = {"tokens": float(d.size), "sequences": np.nan}
    if d.size == 0:
        out.update({name: np.nan for name in MISMATCH_COLUMNS[2:]})
        return out
    with np.errstate(over="ignore"):
        out.update(
            {
                "mean_d": float(d.mean()),
                "std_d": float(d.std()),
                "k1": float(np.mean(-d)),
                "k3": float(np.mean(np.expm1(d) - d)),
                "extreme_frac": float(np.mean(np.abs(d) > math.log(2.0))),
                "chi2_seq": np.nan,
            }
        )
        if sequence is not None:
            seq = np.asarray(sequence)
            if seq.shape != keep.shape:
                raise ValueError(f"sequence must be [tokens] like logp_old, got {seq.shape}")
            codes, _ = pd.factorize(seq[keep])
            sums = np.bincount(codes, weights=d)  # [sequences] sum_t d
            out["sequences"] = float(sums.size)
            out["chi2_seq"] = float(np.mean(np.exp(2.0 * sums)) - 1.0)
    return out


def mismatch_by_step(tokens: pd.DataFrame) -> pd.DataFrame:
    """:func:`mismatch_stats` per ``step`` of a per-token frame (``step``, ``seq``, ``logp_old``, ``logp_rollout``)."""
    needed = [schema.COL_STEP, schema.COL_SEQ, schema.COL_LOGP_OLD, schema.COL_LOGP_ROLLOUT]
    missing = [c for c in needed if c not in tokens.columns]
    if missing:
        raise KeyError(f"per-token frame lacks column(s) {missing}; has {list(tokens.columns)}")
    rows = []
    for step, part in tokens.groupby(schema.COL_STEP, sort=True):
        stats = mismatch_stats(
            part[schema.COL_LOGP_OLD].to_numpy(),
            part[schema.COL_LOGP_ROLLOUT].to_numpy(),
            part[schema.COL_SEQ].to_numpy(),
        )
        rows.append({"step": step, **stats})
    return pd.DataFrame(rows, columns=["step", *MISMATCH_COLUMNS])


def run_mismatch(
    run: str | Path, steps: Iterable[int] | None = None
) -> tuple[pd.DataFrame, dict[str, float], pd.DataFrame | None]:
    """Mismatch of a run's recorded tokens: per step, over all steps, and routing mismatch by layer.

    Returns ``(by_step, overall, routing_by_layer)``; ``routing_by_layer`` is
    :func:`~moestab.analysis.volatility.volatility_table` of the ``rollout_old`` pair by layer, or
    ``None`` without readable route columns.
    """
    steps = None if steps is None else list(steps)
    columns = [schema.COL_STEP, schema.COL_SEQ, schema.COL_LOGP_OLD, schema.COL_LOGP_ROLLOUT]
    tokens = load_tokens(run, columns=columns, steps=steps)
    by_step = mismatch_by_step(tokens) if len(tokens) else pd.DataFrame(columns=["step", *MISMATCH_COLUMNS])
    sequence = None
    if len(tokens):
        sequence = tokens[schema.COL_STEP].to_numpy(np.int64) * (1 << 32) + tokens[schema.COL_SEQ].to_numpy(np.int64)
    overall = mismatch_stats(
        tokens[schema.COL_LOGP_OLD].to_numpy() if len(tokens) else np.array([]),
        tokens[schema.COL_LOGP_ROLLOUT].to_numpy() if len(tokens) else np.array([]),
        sequence,
    )
    counts = run_volatility(run, "rollout_old", steps=steps)
    routing = volatility_table(counts, by=["layer"]) if counts is not None else None
    return by_step, overall, routing
