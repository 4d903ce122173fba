"""One summary row per run: what it was, how far it got, and its stability numbers.

Every stability column is the mean over steps of one metrics.jsonl key (step aggregates over *all*
response tokens, docs/metrics.md), named in :data:`SUMMARY_KEYS`. When metrics.jsonl cannot be read,
the same per-step numbers are recomputed from the per-token tables (recorded tokens only) with the
same functions (:mod:`moestab.metrics`) and averaged over steps.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from moestab.analysis.mismatch import mismatch_by_step
from moestab.analysis.ratios import clip_fractions
from moestab.analysis.volatility import run_volatility, volatility_table
from moestab.metrics import keys
from moestab.metrics.sampling import mean_se
from moestab.run_folder import RunFolder, schema
from moestab.run_folder.errors import RunFileError, Skipped, skip
from moestab.run_folder.reader import (
    check_token_table,
    list_token_files,
    load_metrics,
    load_tokens,
    metrics_step_problem,
    read_run_info,
)
from moestab.run_folder.run_info import RunInfo

_ROUTE_STATS = ("changed", "router_flip", "token_flip")
"""The routing-change statistics the summary averages (``old_new`` all three; the rollout pairs the flips)."""
_CLIP_STATS = ("token_frac", "token_frac_later", "seq_frac", "seq_frac_later")

SUMMARY_KEYS: dict[str, str] = {
    **{f"old_new_{stat}": keys.ROUTE_CHANGE_KEYS[stat].format(pair="old_new") for stat in _ROUTE_STATS},
    **{
        f"{pair}_{stat}": patterns[stat].format(pair=pair)
        for pair in schema.LOGP_PAIRS
        for patterns, stats in ((keys.ROUTE_CHANGE_KEYS, _ROUTE_STATS[1:]), (keys.MISMATCH_KEYS, keys.MISMATCH_KEYS))
        for stat in stats
    },
    **{f"clip_{stat}": keys.CLIP_KEYS[stat] for stat in _CLIP_STATS},
    "routing_var_share": keys.ROUTING_SHARE_VAR,
}
"""Summary column -> the metrics.jsonl key (:mod:`moestab.metrics.keys`) averaged over steps (docs/metrics.md)."""

SAMPLING_ERRORS: dict[str, str] = {
    f"old_new_{stat}_se": keys.ROUTE_CHANGE_SE_KEYS[stat].format(pair="old_new") for stat in keys.ROUTE_CHANGE_SE_KEYS
}
"""Summary column -> the per-step sampling error whose combination (:func:`moestab.metrics.sampling.mean_se`) is the
sampling error of the step mean of the column without ``_se`` (runs under a measurement budget)."""

def column_key(column: str) -> str | None:
    """The metrics.jsonl key a summary column reports (its ``_se`` the same key's, the accuracies ``eval/accuracy``),
    so every surface shows the column in that key's unit (:func:`moestab.analysis.labels.is_percent`); None for a
    column that is no metric (``run``, ``steps``...)."""
    if column in SUMMARY_KEYS:
        return SUMMARY_KEYS[column]
    if column.endswith("_se") and column.removesuffix("_se") in SUMMARY_KEYS:
        return SUMMARY_KEYS[column.removesuffix("_se")]
    return keys.EVAL_ACCURACY if column in ("final_accuracy", "warm_start_accuracy") else None


SUMMARY_COLUMNS = (
    "run", "algo", "replay", "model", "status", "steps", "measured_steps", "final_accuracy", "warm_start_accuracy",
    *(c for column in SUMMARY_KEYS for c in (column, f"{column}_se") if c in SUMMARY_KEYS or c in SAMPLING_ERRORS),
    "capture_failed_steps", "damage", "path",
)
"""Columns of :func:`summarize_runs`, in order (each documented in docs/metrics.md, "moestab analyze"):

- ``run`` folder name; ``algo``, ``replay`` (off / R2 / R3 / TRR), ``model``, ``status`` from run.json (a
  ``running`` run whose writer is gone reads ``stopped``, see ``RunInfo.live_status``; a run whose metrics.jsonl
  steps repeat or go back reads ``damaged``, whatever run.json says);
- ``steps``: ``last_step``; ``measured_steps``: the steps whose old->new volatility was measured (all of them unless
  the measurement budget skips steps, ``measure_every``): the volatility columns are means over these;
  ``final_accuracy``: ``final.accuracy``, else the last ``eval/accuracy``;
  ``warm_start_accuracy``;
- the keys of :data:`SUMMARY_KEYS`: step means of metrics.jsonl keys;
- the keys of :data:`SAMPLING_ERRORS`, each beside its step mean: the sampling error of that mean under a
  measurement budget that samples sequences; NaN (no sampling error applies) when every measured step scored every
  sequence;
- ``damage``: why the run is ``damaged`` (:func:`~moestab.run_folder.reader.metrics_step_problem`), else ``None``;
- ``path``: the run folder.
"""


SUMMARY_METRIC_KEYS = (keys.ROUTING_CHANGED.format(pair="old_new"), keys.EVAL_ACCURACY, keys.INTEGRITY_FAILED,
                       *SUMMARY_KEYS.values(), *SAMPLING_ERRORS.values())
"""The metrics.jsonl keys a summary row reads (:func:`load_metrics` keeps only these)."""


def _step_means(metrics: pd.DataFrame) -> dict[str, float]:
    measured = keys.ROUTING_CHANGED.format(pair="old_new")
    out = {"measured_steps": int(pd.to_numeric(metrics[measured], errors="coerce").notna().sum())
           if measured in metrics else 0}
    for column, key in SUMMARY_KEYS.items():
        values = pd.to_numeric(metrics[key], errors="coerce") if key in metrics else pd.Series(dtype=float)
        out[column] = float(values.mean()) if values.notna().any() else np.nan
    failed = (pd.to_numeric(metrics[keys.INTEGRITY_FAILED], errors="coerce").dropna()
              if keys.INTEGRITY_FAILED in metrics else pd.Series(dtype=float))
    out["capture_failed_steps"] = float((failed > 0).sum()) if len(failed) else np.nan  # NaN: no check on record
    for column, key in SAMPLING_ERRORS.items():
        mean = out[column.removesuffix("_se")]
        # Measured on samples: the steps' errors combined. Without the key every measured step scored every
        # sequence: no sampling error applies, which is not an error of 0 (NaN: blank in the table, null in JSON).
        sampled = key in metrics and np.isfinite(mean)
        out[column] = mean_se(pd.to_numeric(metrics[key], errors="coerce").to_numpy(np.float64)) if sampled else np.nan
    return out


def _last_of(metrics: pd.DataFrame | None, key: str) -> float:
    if metrics is None or key not in metrics:
        return np.nan
    values = pd.to_numeric(metrics[key], errors="coerce").dropna()
    return float(values.iloc[-1]) if len(values) else np.nan


def step_metrics_from_tokens(run: str | Path, skipped: list[Skipped] | None = None) -> pd.DataFrame:
    """The :data:`SUMMARY_KEYS` metrics per step, recomputed from the per-token tables (recorded tokens only) by the
    functions the recording layer calls on the step's tensors.

    One row per step with a ``step`` column and the metrics.jsonl keys as columns.
    """
    frames = []
    for pair in keys.ROUTE_METRIC_PAIRS:
        counts = run_volatility(run, pair, skipped=skipped)
        if counts is not None:
            table = volatility_table(counts, by=["step"]).set_index("step")[list(_ROUTE_STATS)]
            frames.append(table.rename(columns=lambda stat, pair=pair: keys.ROUTE_CHANGE_KEYS[stat].format(pair=pair)))
    columns = [schema.COL_STEP, schema.COL_SEQ, schema.COL_MINIBATCH, schema.COL_CLIPPED,
               *dict.fromkeys(c for pair in schema.LOGP_PAIRS.values() for c in pair)]
    tokens = load_tokens(run, columns=columns, skipped=skipped)
    if len(tokens):
        for pair in schema.LOGP_PAIRS:
            mm = mismatch_by_step(tokens, pair).set_index("step")[list(keys.MISMATCH_KEYS)]
            frames.append(mm.rename(columns=lambda stat, pair=pair: keys.MISMATCH_KEYS[stat].format(pair=pair)))
        clip = clip_fractions(tokens).set_index("step")[list(keys.CLIP_KEYS)]
        frames.append(clip.rename(columns=keys.CLIP_KEYS))
    if not frames:
        return pd.DataFrame({"step": pd.Series([], dtype="int64")})
    return pd.concat(frames, axis=1).rename_axis("step").reset_index()


def _no_logged_step(run: str | Path, last_step: int, skipped: list[Skipped] | None) -> None:
    """Say (in ``skipped``) that metrics.jsonl holds no step of a run that reached ``last_step``; its numbers then
    come from the token tables, if any."""
    tokens = "stability numbers recomputed from the token tables" if len(list_token_files(run)) else \
        "and the run has no token tables, so it has no stability numbers"
    skip(skipped, RunFileError(RunFolder(run).metrics_file,
                               f"holds no step, though run.json says the run reached step {last_step}; {tokens}"))


TABLE_CHECKS = ("all", "ends")
"""How much of its per-token tables :func:`run_summary` checks when metrics.jsonl spares it from reading them:
``all``, every table's first rows; ``ends``, every table's file and route layout, and the first rows of the first and
the last table only (a table costs ~2-4 ms to check: the dashboard's Runs page over thousands of runs)."""


def _check_token_files(run: str | Path, info: RunInfo, skipped: list[Skipped] | None, how: str) -> None:
    """Put every per-token table that cannot be opened (truncated, not Parquet) or whose first rows hold damaged
    routes (an id outside the model, an expert named twice: a broken reference chain; ``check_token_table``) in
    ``skipped``, naming it: damage is said even when metrics.jsonl spares the summary from reading the tables.
    ``how``: one of :data:`TABLE_CHECKS`."""
    paths = list(list_token_files(run)["path"])
    for index, path in enumerate(paths):
        try:
            check_token_table(path, info.top_k, info.num_experts,
                              decisions=how == "all" or index in (0, len(paths) - 1))
        except RunFileError as exc:
            skip(skipped, exc)


def in_window(metrics: pd.DataFrame, steps: tuple[int, int] | None) -> pd.DataFrame:
    """The rows of a per-step frame whose ``step`` lies in ``steps`` (first, last; both included), all rows for
    ``None``."""
    if steps is None or not len(metrics):
        return metrics
    first, last = steps
    if first > last:
        raise ValueError(f"the step window must run forwards, got {first}..{last}")
    return metrics[(metrics[keys.STEP] >= first) & (metrics[keys.STEP] <= last)]


def run_summary(run: str | Path, skipped: list[Skipped] | None = None,
                steps: tuple[int, int] | None = None, check_tables: str = "all") -> dict[str, Any]:
    """The summary row of one run (keys of :data:`SUMMARY_COLUMNS`).

    Raises ``NotARunError`` / ``SchemaVersionError`` / ``RunFileError`` when run.json itself is
    unusable. Anything else unreadable goes to ``skipped`` (raises with ``skipped=None``); without a
    readable metrics.jsonl the stability columns come from the per-token tables. ``steps``: the step means (and
    ``measured_steps``) over these steps only (first, last; both included), so that runs of different lengths are
    compared over the same steps (the dashboard's Compare page does the same); ``None``: every step. ``check_tables``:
    how much of the per-token tables is checked when metrics.jsonl is read instead (:data:`TABLE_CHECKS`).
    """
    if check_tables not in TABLE_CHECKS:
        raise ValueError(f"check_tables must be one of {TABLE_CHECKS}, got {check_tables!r}")
    info = read_run_info(run)
    metrics: pd.DataFrame | None
    try:
        metrics = load_metrics(run, skipped, keys=SUMMARY_METRIC_KEYS)  # only what the row reads: bounded memory
    except RunFileError as exc:
        skip(skipped, RunFileError(exc.path, f"{exc.problem}; stability numbers recomputed from the token tables"))
        metrics = None
    if metrics is not None and metrics.empty and info.last_step > 0:  # its steps were lost: not a run of 0 steps
        _no_logged_step(run, info.last_step, skipped)
        metrics = None
    final = info.final_accuracy if info.final_accuracy is not None else _last_of(metrics, keys.EVAL_ACCURACY)
    damage = metrics_step_problem(run)
    row: dict[str, Any] = {
        "run": info.name,
        "algo": info.algo,
        "replay": info.replay_label,
        "model": info.model_name,
        # Two writers' records mixed: never shown as finished. A "running" run whose writer died reads "stopped".
        "status": schema.STATUS_DAMAGED if damage else info.live_status(),
        "steps": info.last_step,
        "final_accuracy": final,
        "warm_start_accuracy": np.nan if info.warm_start_accuracy is None else info.warm_start_accuracy,
        "damage": damage,
        "path": str(info.path),
    }
    if metrics is not None:  # the summary reads no token table then, but a corrupt one is said all the same
        _check_token_files(run, info, skipped, check_tables)
    if metrics is None and len(list_token_files(run)):
        metrics = step_metrics_from_tokens(run, skipped)
    row.update(_step_means(in_window(metrics, steps) if metrics is not None else pd.DataFrame()))
    return {name: row.get(name) for name in SUMMARY_COLUMNS}


def summarize_runs(runs: Iterable[str | Path], skipped: list[Skipped] | None = None,
                   steps: tuple[int, int] | None = None) -> pd.DataFrame:
    """:func:`run_summary` of each run, one row each (columns :data:`SUMMARY_COLUMNS`); errors propagate."""
    rows = [run_summary(run, skipped, steps) for run in runs]
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
