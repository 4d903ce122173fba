"""Rollout -> trainer mismatch of a run's recorded tokens, on both sides of pi_old.

Two comparisons (docs/metrics.md; pairs named as in :data:`moestab.run_folder.schema.LOGP_PAIRS`):

- ``rollout_old``: the rollout engine vs pi_old *as used in the ratio* (``logp_old``,
  ``routes_old``) — what the loss sees; R3 (and TRR) shrink it by replaying the rollout's routes.
- ``rollout_old_free``: the rollout engine vs the trainer's *free* pi_old (``logp_old_free``,
  ``routes_old_free``) — the gap that routing creates, whatever the replay mode.

Without replay (and under R2) the two are the same numbers. The statistics are
:func:`moestab.metrics.mismatch.mismatch_stats` (k1, k3, f2 = F(2), chi2); the routing mismatch is
the volatility of the route pair of the same name (:mod:`moestab.analysis.volatility`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from moestab.analysis.volatility import run_volatility, volatility_table
from moestab.metrics.mismatch import MISMATCH_STATS, mismatch_stats
from moestab.run_folder import schema
from moestab.run_folder.errors import Skipped
from moestab.run_folder.reader import load_tokens

PAIRS = schema.LOGP_PAIRS
"""Mismatch pairs by name: ``(sampler log-prob column, trainer log-prob column)``."""

MISMATCH_COLUMNS = MISMATCH_STATS


def _check_pair(pair: str) -> tuple[str, str]:
    if pair not in PAIRS:
        raise ValueError(f"unknown mismatch pair {pair!r}; valid: {sorted(PAIRS)}")
    return PAIRS[pair]


def mismatch_by_step(tokens: pd.DataFrame, pair: str = "rollout_old") -> pd.DataFrame:
    """:func:`mismatch_stats` of ``pair`` per ``step`` of a per-token frame (``step``, ``seq``, the pair's columns)."""
    rollout, trainer = _check_pair(pair)
    needed = [schema.COL_STEP, schema.COL_SEQ, rollout, trainer]
    missing = [c for c in needed if c not in tokens.columns]
    if missing:
        raise KeyError(f"per-token frame lacks column(s) {missing}; has {list(tokens.columns)}")
    rows = []
    for step, part in tokens.groupby(schema.COL_STEP, sort=True):
        stats = mismatch_stats(part[trainer].to_numpy(), part[rollout].to_numpy(), part[schema.COL_SEQ].to_numpy())
        rows.append({"step": step, **stats})
    return pd.DataFrame(rows, columns=["step", *MISMATCH_COLUMNS])


def run_mismatch(
    run: str | Path,
    pair: str = "rollout_old",
    steps: Iterable[int] | None = None,
    skipped: list[Skipped] | None = None,
) -> tuple[pd.DataFrame, dict[str, float], pd.DataFrame | None]:
    """Mismatch ``pair`` of a run's recorded tokens: per step, over all steps, and routing mismatch by layer.

    Returns ``(by_step, overall, routing_by_layer)``; ``routing_by_layer`` is
    :func:`~moestab.analysis.volatility.volatility_table` of the route pair of the same name by layer,
    or ``None`` without readable route columns.
    """
    rollout, trainer = _check_pair(pair)
    steps = None if steps is None else list(steps)
    tokens = load_tokens(run, columns=[schema.COL_STEP, schema.COL_SEQ, rollout, trainer], steps=steps,
                         skipped=skipped)
    if len(tokens):
        by_step = mismatch_by_step(tokens, pair)
        sequence = tokens[schema.COL_STEP].to_numpy(np.int64) * (1 << 32) + tokens[schema.COL_SEQ].to_numpy(np.int64)
        overall = mismatch_stats(tokens[trainer].to_numpy(), tokens[rollout].to_numpy(), sequence)
    else:
        by_step = pd.DataFrame(columns=["step", *MISMATCH_COLUMNS])
        overall = mismatch_stats(np.array([]), np.array([]))
    counts = run_volatility(run, pair, steps=steps, skipped=skipped)
    routing = volatility_table(counts, by=["layer"]) if counts is not None else None
    return by_step, overall, routing
