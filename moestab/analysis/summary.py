"""One summary row per run: what it was, how far it got, and its stability numbers.

Volatility and mismatch come from metrics.jsonl (step aggregates over *all* response tokens, see
docs/run-format.md), averaged over steps; clip fractions from the per-token tables (recorded
tokens). Where a source is missing or corrupt the row keeps what is readable: the gap is a
:class:`~moestab.analysis.errors.RunReadWarning`, the value NaN, and volatility / mismatch fall back
to the per-token tables when metrics.jsonl cannot be read.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from moestab.analysis.errors import RunFileError, RunReadWarning
from moestab.analysis.load import iter_run_batches, list_token_files, load_metrics, load_run_info
from moestab.records import schema

SUMMARY_COLUMNS = (
    "run",
    "algo",
    "replay",
    "model",
    "status",
    "steps",
    "final_accuracy",
    "warm_start_accuracy",
    "old_new_changed",
    "old_new_token_flip",
    "rollout_old_changed",
    "rollout_old_token_flip",
    "token_clip",
    "seq_clip",
    "mismatch_k3",
    "path",
)
"""Columns of :func:`summarize_runs`, in order:

- ``run`` folder name; ``algo``, ``replay`` (off / R2 / R3), ``model``, ``status`` from run.json;
- ``steps``: ``last_step`` (else the last step of metrics.jsonl or of the per-token tables);
- ``final_accuracy``: ``final.accuracy``, else the last ``eval/accuracy``; ``warm_start_accuracy``;
- ``old_new_changed`` / ``rollout_old_changed``: slot-level changed fraction, and
  ``..._token_flip``: share of tokens with any flipped layer, averaged over steps (metrics.jsonl);
- ``token_clip`` / ``seq_clip``: clipped share of recorded tokens / of recorded sequences with a
  clipped token (per-token tables);
- ``mismatch_k3``: ``mismatch/k3`` averaged over steps; ``path``: the run folder.
"""


def _mean_of(metrics: pd.DataFrame | None, key: str) -> float:
    if metrics is None or key not in metrics:
        return np.nan
    values = pd.to_numeric(metrics[key], errors="coerce")
    return float(values.mean()) if values.notna().any() else np.nan


def _last_of(metrics: pd.DataFrame | None, key: str) -> float:
    if metrics is None or key not in metrics:
        return np.nan
    values = pd.to_numeric(metrics[key], errors="coerce").dropna()
    return float(values.iloc[-1]) if len(values) else np.nan


def token_clip_fractions(run: str | Path) -> dict[str, float]:
    """Clipped share of recorded tokens (``token_clip``) and of recorded sequences with a clipped
    token (``seq_clip``), streamed over the run's per-token tables (NaN without readable tables)."""
    tokens = clipped = 0
    sequences = sequences_clipped = 0
    # Per sequence index of the current step's file: tokens seen, tokens clipped.
    seen = np.zeros(0, np.int64)
    hit = np.zeros(0, np.int64)
    current: int | None = None
    for step, batch in iter_run_batches(run, [schema.COL_SEQ, schema.COL_CLIPPED]):
        if step != current:
            sequences += int((seen > 0).sum())
            sequences_clipped += int((hit > 0).sum())
            seen, hit, current = np.zeros(0, np.int64), np.zeros(0, np.int64), step
        seq = batch.column(schema.COL_SEQ).to_numpy(zero_copy_only=False).astype(np.int64)  # [rows]
        clip = batch.column(schema.COL_CLIPPED).to_numpy(zero_copy_only=False).astype(bool)  # [rows]
        tokens += clip.size
        clipped += int(clip.sum())
        if seq.size:
            size = max(seen.size, int(seq.max()) + 1)
            seen = np.bincount(seq, minlength=size) + np.pad(seen, (0, size - seen.size))
            hit = np.bincount(seq[clip], minlength=size) + np.pad(hit, (0, size - hit.size))
    sequences += int((seen > 0).sum())
    sequences_clipped += int((hit > 0).sum())
    return {
        "token_clip": clipped / tokens if tokens else np.nan,
        "seq_clip": sequences_clipped / sequences if sequences else np.nan,
    }


def run_summary(run: str | Path) -> dict[str, Any]:
    """The summary row of one run (keys of :data:`SUMMARY_COLUMNS`).

    Raises :class:`~moestab.analysis.errors.NotARunError` / ``SchemaVersionError`` /
    ``RunFileError`` only when run.json itself is unusable; anything else missing is a warning.
    """
    info = load_run_info(run)
    metrics: pd.DataFrame | None
    try:
        metrics = load_metrics(run)
    except RunFileError as exc:
        warnings.warn(RunReadWarning(f"{exc}; steps, volatility and mismatch from the other files"), stacklevel=2)
        metrics = None
    steps = info.last_step
    if steps is None and metrics is not None and len(metrics):
        steps = int(metrics["step"].max())
    final = info.final_accuracy
    if final is None:
        final = _last_of(metrics, "eval/accuracy")
    row: dict[str, Any] = {
        "run": info.name,
        "algo": info.algo,
        "replay": info.replay,
        "model": info.model,
        "status": info.status,
        "steps": steps,
        "final_accuracy": final,
        "warm_start_accuracy": np.nan if info.warm_start_accuracy is None else info.warm_start_accuracy,
        "old_new_changed": _mean_of(metrics, "routing/old_new/changed"),
        "old_new_token_flip": _mean_of(metrics, "routing/old_new/token_flip"),
        "rollout_old_changed": _mean_of(metrics, "routing/rollout_old/changed"),
        "rollout_old_token_flip": _mean_of(metrics, "routing/rollout_old/token_flip"),
        "mismatch_k3": _mean_of(metrics, "mismatch/k3"),
        "path": str(info.path),
    }
    row.update(token_clip_fractions(run))
    if metrics is None and len(list_token_files(run)):
        row.update(_from_token_tables(run))
    if steps is None and len(list_token_files(run)):
        row["steps"] = int(list_token_files(run)["step"].max())
    return {name: row.get(name) for name in SUMMARY_COLUMNS}


def _from_token_tables(run: str | Path) -> dict[str, float]:
    """Volatility and mismatch of the recorded tokens, when metrics.jsonl is unusable."""
    from moestab.analysis.load import load_tokens
    from moestab.analysis.mismatch import mismatch_stats
    from moestab.analysis.volatility import run_volatility, volatility_table

    out: dict[str, float] = {}
    for pair in ("old_new", "rollout_old"):
        try:
            counts = run_volatility(run, pair)
        except ValueError as exc:
            warnings.warn(RunReadWarning(f"{run}: no {pair} volatility ({exc})"), stacklevel=3)
            continue
        if counts is not None:
            table = volatility_table(counts).iloc[0]
            out[f"{pair}_changed"] = float(table["changed"])
            out[f"{pair}_token_flip"] = float(table["token_flip"])
    tokens = load_tokens(run, columns=[schema.COL_LOGP_OLD, schema.COL_LOGP_ROLLOUT])
    if len(tokens):
        out["mismatch_k3"] = mismatch_stats(
            tokens[schema.COL_LOGP_OLD].to_numpy(), tokens[schema.COL_LOGP_ROLLOUT].to_numpy()
        )["k3"]
    return out


def summarize_runs(runs: Iterable[str | Path]) -> pd.DataFrame:
    """:func:`run_summary` of each run, one row each (columns :data:`SUMMARY_COLUMNS`); errors propagate."""
    rows = [run_summary(run) for run in runs]
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
