"""Small readers the dashboard needs beyond the other analyzers: finding runs, a change key per run,
one overview row per run, streamed co-activation, and histograms on bins shared across runs.

Pure functions over run folders (docs/run-format.md) and arrays; nothing here imports Streamlit.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from moestab.analysis.ratios import histogram
from moestab.analysis.summary import run_summary
from moestab.metrics.experts import coactivation_counts
from moestab.records import schema
from moestab.records.errors import Skipped
from moestab.records.reader import iter_run_batches, read_run_info, route_array

# Folders of a run that never hold another run: not descended into while looking for runs.
_RUN_SUBFOLDERS = (schema.TOKENS_DIR, schema.CHECKPOINTS_DIR, schema.STATE_DIR)

OVERVIEW_EXTRA_COLUMNS = ("planned_steps", "updated", "error")
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
    if (root / schema.RUN_JSON).is_file():
        return [root]
    found: list[Path] = []

    def visit(folder: Path, depth: int) -> None:
        try:
            children = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:  # unreadable folder: nothing to list there
            return
        for child in children:
            if (child / schema.RUN_JSON).is_file():
                found.append(child)
            elif depth < max_depth and child.name not in _RUN_SUBFOLDERS:
                visit(child, depth + 1)

    if max_depth >= 1:
        visit(root, 1)
    return sorted(found)


def run_fingerprint(run: str | Path) -> tuple[tuple[str, int, int], ...]:
    """``(relative path, mtime_ns, size)`` of every file the analyzers read (run.json, metrics.jsonl,
    tokens/*.parquet), sorted: equal fingerprints mean nothing read from the run has changed.

    Missing files are left out (a run without metrics yet has a shorter fingerprint).
    """
    run = Path(run)
    files = [run / schema.RUN_JSON, run / schema.METRICS_JSONL]
    tokens = run / schema.TOKENS_DIR
    if tokens.is_dir():
        files.extend(p for p in tokens.iterdir() if p.suffix == ".parquet")
    out = []
    for path in files:
        try:
            stat = path.stat()
        except OSError:
            continue
        out.append((path.relative_to(run).as_posix(), stat.st_mtime_ns, stat.st_size))
    return tuple(sorted(out))


def run_overview(run: str | Path, skipped: list[Skipped] | None = None) -> dict[str, Any]:
    """:func:`~moestab.analysis.summary.run_summary`'s row plus ``planned_steps`` (``config.steps``),
    ``updated`` (run.json's ISO time) and ``error`` (a failed run's message, else ``None``).

    Raises what ``run_summary`` raises when run.json is unusable.
    """
    row = run_summary(run, skipped)
    info = read_run_info(run)
    row["planned_steps"] = info.planned_steps
    row["updated"] = info.updated or None
    row["error"] = info.error
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
        routes = route_array(batch.column(column), info.top_k)  # [rows, layers, top_k]
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
