"""Small readers the dashboard needs beyond the other analyzers: finding runs, a change key per run,
one overview row per run, streamed co-activation, histograms on bins shared across runs, and the tidy
frames its charts draw (and offer as CSV), shaped from what the analyzers return.

Pure functions over run folders (docs/run-format.md), arrays and frames; nothing here imports Streamlit.
The shaping functions select, stack and reshape values; every quantity is still computed by its analyzer.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from moestab.analysis.experts import metrics_per_layer
from moestab.analysis.ratios import histogram
from moestab.analysis.summary import run_summary
from moestab.metrics import keys
from moestab.metrics.collapse_warning import DEFAULT_RULE, collapse_onset, warnings_over
from moestab.metrics.experts import coactivation_counts
from moestab.run_folder import RunFolder, schema
from moestab.run_folder.errors import RunError, Skipped
from moestab.run_folder.folder import RUN_SUBFOLDERS
from moestab.run_folder.reader import iter_run_batches, load_metrics, read_run_info, route_array, route_layout

OVERVIEW_EXTRA_COLUMNS = ("planned_steps", "updated", "error", "first_step", "last_step")
"""Keys :func:`run_overview` adds to :func:`moestab.analysis.summary.run_summary`'s row."""


def find_runs(root: str | Path, max_depth: int = 3) -> list[Path]:
    """Run folders (folders with a run.json) at or under ``root``, sorted by path.

    ``root`` itself is returned alone when it is a run. Otherwise sub-folders are searched down to
    ``max_depth`` levels (``runs/sweep/gspo-off`` is depth 2), without descending into a run.
    Hidden folders (``.name``) are skipped. Raises ``FileNotFoundError`` / ``NotADirectoryError``
    when ``root`` is missing or not a folder.
    """
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"runs folder {root} does not exist")
    if not root.is_dir():
        raise NotADirectoryError(f"runs folder {root} is not a directory")
    if max_depth < 0:
        raise ValueError(f"max_depth must be >= 0, got {max_depth}")
    if RunFolder(root).holds_run:
        return [root]
    found: list[Path] = []

    def visit(folder: Path, depth: int) -> None:
        try:
            children = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:  # unreadable folder: nothing to list there
            return
        for child in children:
            if RunFolder(child).holds_run:
                found.append(child)
            elif depth < max_depth and child.name not in RUN_SUBFOLDERS:  # a run's own folders hold no run
                visit(child, depth + 1)

    if max_depth >= 1:
        visit(root, 1)
    return sorted(found)


def runs_too_deep(root: str | Path, max_depth: int = 3, further: int = 3) -> list[Path]:
    """Run folders that :func:`find_runs` ``(root, max_depth)`` leaves out because they lie deeper, looking
    ``further`` levels more (so that a large folder is not walked to the bottom), sorted by path.

    Why: runs below the search depth would otherwise vanish from the dashboard without a word (a sweep laid out as
    ``runs/controlled/evaluate/CONDITION/SEED`` is 4 levels down); the dashboard names them instead.
    """
    if further < 0:
        raise ValueError(f"further must be >= 0, got {further}")
    listed = set(find_runs(root, max_depth))
    return [run for run in find_runs(root, max_depth + further) if run not in listed]


def run_fingerprint(run: str | Path) -> tuple[tuple[str, int, int], ...]:
    """``(name, mtime_ns, size)`` of run.json and metrics.jsonl, and ``("tokens/", mtime_ns, tables)`` of the tokens
    folder (its time, and a CRC-32 of its ``.parquet`` names with their inode numbers), sorted: equal fingerprints mean
    nothing the analyzers read (run.json, metrics.jsonl, tokens/*.parquet) has changed.

    The tables are not stat'ed one by one (a runs folder of 10,000 runs holds ~600,000): every table is renamed into
    place whole (docs/run-format.md), so a table added, removed or replaced changes the folder's names or inodes (read
    with the listing, no stat each), even within one tick of the file system's clock. A table rewritten in place by
    another tool is not seen (the dashboard's Refresh re-reads everything). Missing files are left out (a run without
    metrics yet has a shorter fingerprint).
    """
    folder = RunFolder(run)
    out = []
    for path in (folder.run_json, folder.metrics_file):
        try:
            stat = path.stat()
        except OSError:
            continue
        out.append((path.name, stat.st_mtime_ns, stat.st_size))
    try:
        with os.scandir(folder.tokens_dir) as entries:
            tables = sorted(f"{entry.name}:{entry.inode()}" for entry in entries if entry.name.endswith(".parquet"))
        out.append((f"{folder.tokens_dir.name}/", folder.tokens_dir.stat().st_mtime_ns,
                    zlib.crc32("/".join(tables).encode())))
    except OSError:  # no tokens folder (yet)
        pass
    return tuple(sorted(out))


def run_overview(run: str | Path, skipped: list[Skipped] | None = None) -> dict[str, Any]:
    """:func:`~moestab.analysis.summary.run_summary`'s row plus ``planned_steps`` (``config.steps``),
    ``updated`` (run.json's ISO time), ``error`` (a failed run's message, else ``None``) and ``first_step`` /
    ``last_step``: the steps of metrics.jsonl, which the row's step means cover (``None`` without a readable step:
    then its means, if any, come from the token tables).

    Of the per-token tables, every file and route layout is checked and the first rows of the first and last only
    (``run_summary(check_tables="ends")``): the row costs ~the same for a run of 60 tables as for one of 1.
    Raises what ``run_summary`` raises when run.json is unusable.
    """
    row = run_summary(run, skipped, check_tables="ends")  # a Runs page of thousands of runs: tables' ends only
    info = read_run_info(run)
    row["planned_steps"] = info.planned_steps
    row["updated"] = info.updated or None
    row["error"] = info.error
    try:
        steps = load_metrics(run, skipped=[], keys=())[keys.STEP]  # what it skips, run_summary has said
    except RunError:
        steps = pd.Series(dtype=np.int64)
    row["first_step"], row["last_step"] = (int(steps.min()), int(steps.max())) if len(steps) else (None, None)
    return row


def run_coactivation(
    run: str | Path,
    layer: int,
    column: str = schema.COL_ROUTES_OLD_FREE,
    *,
    batch_rows: int | None = None,
    skipped: list[Skipped] | None = None,
) -> np.ndarray | None:
    """Co-activation ``C[i, j] = N(i and j) / N(i)`` of layer index ``layer`` of a route column over a
    run's per-token tables, streamed (as :func:`moestab.analysis.experts.coactivation` of all rows).

    float64 ``[experts, experts]``, NaN rows for experts never chosen; ``None`` without a readable
    table. ``layer`` indexes the route columns' layers (``RunInfo.recorded_layers`` gives labels).
    """
    info = read_run_info(run)
    total: np.ndarray | None = None
    for _, batch in iter_run_batches(run, [column], batch_rows=batch_rows, skipped=skipped):
        routes = route_array(batch.column(column), info.top_k, route_layout(batch.schema))  # [rows, layers, top_k]
        counts = coactivation_counts(routes, info.num_experts, layer)  # [experts, experts]
        total = counts if total is None else total + counts
    if total is None:
        return None
    counts = total.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return counts / np.diag(counts)[:, None]


def shared_histograms(values: Mapping[str, np.ndarray], bins: int = 60, limit: float | None = None) -> pd.DataFrame:
    """Histograms of several runs' values on the same bins, so they can be overlaid.

    Each run's histogram is :func:`moestab.analysis.ratios.histogram` over ``[-limit, limit]``
    (outliers counted in the end bins). ``limit`` defaults to the larger of ``|q0.001|`` and
    ``|q0.999|`` of all runs' finite values pooled, the convention of ``histogram`` for one run.
    Columns: ``run``, ``left``, ``right``, ``count``, ``share`` (count / the run's finite values;
    NaN for a run without any).
    """
    if limit is None:
        finite = [np.asarray(v, np.float64) for v in values.values()]
        pooled = np.concatenate(finite) if finite else np.array([], np.float64)
        pooled = pooled[np.isfinite(pooled)]
        limit = float(np.abs(np.quantile(pooled, [0.001, 0.999])).max()) if pooled.size else 1.0
    frames = []
    for name, vals in values.items():
        frame = histogram(np.asarray(vals), bins, limit)
        total = frame["count"].sum()
        frame["share"] = frame["count"] / total if total else np.nan
        frame.insert(0, "run", name)
        frames.append(frame)
    columns = ["run", "left", "right", "count", "share"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


# -- tidy frames of the dashboard's charts ----------------------------------------------------------


def stack_runs(frames: Mapping[str, pd.DataFrame], column: str = "run") -> pd.DataFrame:
    """The frames one under the other, each row labelled in a first column ``column`` by its key (a run or
    probe folder), in the mapping's order: one frame per chart of several runs."""
    parts = [frame.assign(**{column: label})[[column, *frame.columns.drop(column, errors="ignore")]]
             for label, frame in frames.items()]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=[column])


def metric_curve(metrics: pd.DataFrame, key: str, start: float | None = None) -> pd.DataFrame:
    """One metrics.jsonl key against step: columns ``step``, ``value``, one row per step that has a number for
    it (eval keys: the eval steps only).

    ``start`` (e.g. the starting policy's eval accuracy) is put first at step 0. Empty when ``key`` is absent.
    """
    if key not in metrics:
        return pd.DataFrame({"step": pd.Series(dtype=np.int64), "value": pd.Series(dtype=np.float64)})
    curve = pd.DataFrame({"step": metrics[keys.STEP].to_numpy(np.int64),
                          "value": pd.to_numeric(metrics[key], errors="coerce").to_numpy(np.float64)})
    curve = curve[curve["value"].notna()].reset_index(drop=True)
    if start is not None:
        curve = pd.concat([pd.DataFrame({"step": [0], "value": [float(start)]}), curve], ignore_index=True)
    return curve


COLLAPSE_MARK_KEYS = (keys.EVAL_ACCURACY, keys.COLLAPSE_WARNING, *DEFAULT_RULE.keys)
"""The metrics.jsonl keys :func:`collapse_marks` reads."""


def collapse_marks(metrics: pd.DataFrame, start: float | None) -> pd.DataFrame:
    """A run's collapse warnings and its collapse onset, as marks on its curves: columns ``step`` and ``mark``
    (``warning`` / ``collapse onset``). Warnings are the run's own ``collapse/warning`` steps where it recorded the
    key, else the default rule's over its metrics (a run written before the watch existed); the onset is
    :func:`~moestab.metrics.collapse_warning.collapse_onset` of its evaluations and ``start`` (the start accuracy)."""
    if keys.COLLAPSE_WARNING in metrics:
        warned = metrics.loc[pd.to_numeric(metrics[keys.COLLAPSE_WARNING], errors="coerce") == 1, keys.STEP]
        steps = [int(s) for s in warned]
    else:
        present = [k for k in DEFAULT_RULE.keys if k in metrics]
        rows = metrics[[keys.STEP, *present]].to_dict("records")
        steps = [w.step for w in warnings_over(DEFAULT_RULE, ((int(r[keys.STEP]), r) for r in rows))]
    marks = [(s, "warning") for s in steps]
    if keys.EVAL_ACCURACY in metrics:
        evals = metrics.dropna(subset=[keys.EVAL_ACCURACY])
        onset = collapse_onset(evals[keys.STEP].astype(int).tolist(), evals[keys.EVAL_ACCURACY].astype(float).tolist(),
                               start)
        if onset is not None:
            marks.append((onset, "collapse onset"))
    return pd.DataFrame(marks, columns=["step", "mark"]).astype({"step": np.int64})


METRICS_SOURCE = "all tokens"
"""Source of a chart drawn from metrics.jsonl (every response token of each step)."""
TOKENS_SOURCE = "recorded tokens"
"""Source of a chart drawn from the per-token tables (the recorded sequences and layers)."""


def changed_by_layer_step(
    metrics: pd.DataFrame | None, step_layer: pd.DataFrame | None, pair: str
) -> tuple[pd.DataFrame | None, str]:
    """Changed fraction of route pair ``pair`` by layer and step (``step``, ``layer``, ``changed``) and its source.

    metrics.jsonl's ``routing/{pair}/changed_by_layer`` (:data:`METRICS_SOURCE`; ``layer`` is the list index)
    when it has the key, else the per-token tables' ``step`` x ``layer`` volatility table (:data:`TOKENS_SOURCE`;
    ``layer`` is the recorded layer's label); ``(None, "")`` when neither has it.
    """
    if metrics is not None:
        tidy = metrics_per_layer(metrics, keys.ROUTING_CHANGED_BY_LAYER.format(pair=pair)).dropna()
        if len(tidy):
            return tidy.rename(columns={"value": "changed"}).reset_index(drop=True), METRICS_SOURCE
    if step_layer is not None and len(step_layer):
        return step_layer[["step", "layer", "changed"]].reset_index(drop=True), TOKENS_SOURCE
    return None, ""


def routing_by_step(
    metrics: pd.DataFrame | None, by_step: pd.DataFrame | None, pair: str, metric: str
) -> tuple[pd.DataFrame | None, str]:
    """Volatility ``metric`` of route pair ``pair`` against step (``step``, ``value``) and its source:
    metrics.jsonl's ``routing/{pair}/{metric}`` when it has the key, else the per-token tables' ``step``
    volatility table; ``(None, "")`` when neither has it."""
    pattern = keys.ROUTE_CHANGE_KEYS.get(metric)  # e.g. jaccard_distance: only the tables have it
    key = None if pattern is None else pattern.format(pair=pair)
    if metrics is not None and key in metrics:
        return metric_curve(metrics, key), METRICS_SOURCE
    if by_step is not None and len(by_step):
        frame = pd.DataFrame({"step": by_step["step"].to_numpy(),
                              "value": by_step[metric].to_numpy(np.float64)})
        return frame, TOKENS_SOURCE
    return None, ""


def margin_bin_centres(by_margin: pd.DataFrame) -> pd.DataFrame:
    """:func:`moestab.analysis.attribution.flip_rate_by_margin`'s table with ``margin``, the middle of each
    margin bin (where its flip rate is drawn), as first column."""
    centre = (by_margin["margin_low"].to_numpy(np.float64) + by_margin["margin_high"].to_numpy(np.float64)) / 2
    return by_margin.assign(margin=centre)[["margin", *by_margin.columns]].reset_index(drop=True)


def load_at_step(load: pd.DataFrame, step: int) -> tuple[int, pd.DataFrame]:
    """The expert load (:func:`moestab.analysis.experts.metrics_load`'s tidy frame) at ``step``, or at the last
    step before it that the run logged (its first step when it has none before): that step and its rows
    ``layer``, ``expert``, ``load``. Raises ``ValueError`` on an empty frame."""
    if not len(load):
        raise ValueError("no expert load to pick a step from")
    earlier = load.loc[load["step"] <= step, "step"]
    shown = int(earlier.max()) if len(earlier) else int(load["step"].min())
    rows = load.loc[load["step"] == shown, ["layer", "expert", "load"]]
    return shown, rows.reset_index(drop=True)


def matrix_frame(matrix: np.ndarray, row: str, column: str, value: str) -> pd.DataFrame:
    """A 2-D array as a tidy frame, one row per cell (``row``, ``column``: the indices; ``value``), NaN kept."""
    values = np.asarray(matrix, np.float64)
    if values.ndim != 2:
        raise ValueError(f"expected a 2-D array, got shape {values.shape}")
    rows, columns = np.indices(values.shape)
    return pd.DataFrame({row: rows.ravel(), column: columns.ravel(), value: values.ravel()})


def grid_frame(grid: pd.DataFrame, value: str) -> pd.DataFrame:
    """A grid (index on one axis, columns on the other) as a tidy frame: its index name, its columns' name
    (``row`` / ``column`` when unnamed) and ``value``, one row per cell in the grid's order, NaN kept."""
    row = grid.index.name or "row"
    column = grid.columns.name or "column"
    tidy = grid.rename_axis(index=row, columns=column).stack(future_stack=True)
    return tidy.rename(value).reset_index()
