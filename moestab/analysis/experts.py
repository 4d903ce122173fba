"""Expert load over a run's records: streamed counts, and the per-layer lists of metrics.jsonl as tidy frames.

The definitions (load, load entropy, co-activation) are :mod:`moestab.metrics.experts`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from moestab.metrics import keys
from moestab.metrics.experts import coactivation, coactivation_counts, expert_counts, load_stats
from moestab.run_folder import schema
from moestab.run_folder.errors import Skipped
from moestab.run_folder.reader import iter_run_routes, read_run_info

__all__ = [
    "coactivation",
    "coactivation_counts",
    "expert_counts",
    "load_stats",
    "metrics_load",
    "metrics_per_layer",
    "run_expert_counts",
]


def run_expert_counts(
    run: str | Path,
    column: str = schema.COL_ROUTES_OLD_FREE,
    *,
    batch_rows: int | None = None,
    skipped: list[Skipped] | None = None,
) -> np.ndarray | None:
    """:func:`expert_counts` of a route column (default: pi_old's free routes) over a run's per-token
    tables, streamed (``None`` if none is readable)."""
    info = read_run_info(run)
    total = None
    for _, _, routes in iter_run_routes(run, [column], info.top_k, batch_rows=batch_rows, skipped=skipped,
                                       num_experts=info.num_experts):
        counts = expert_counts(routes[column], info.num_experts)
        total = counts if total is None else total + counts
    return total


def metrics_load(metrics: pd.DataFrame) -> pd.DataFrame:
    """The ``experts/load`` lists of metrics.jsonl as a tidy frame: ``step``, ``layer``, ``expert``, ``load``.

    ``layer`` is the index into the list (MoE-layer ordinal). Empty if the key is absent.
    """
    rows = []
    if keys.EXPERTS_LOAD in metrics:
        for step, load in zip(metrics[keys.STEP], metrics[keys.EXPERTS_LOAD], strict=True):
            if not isinstance(load, list):
                continue
            for layer, shares in enumerate(load):
                if isinstance(shares, list):
                    rows.extend({"step": step, "layer": layer, "expert": e, "load": v} for e, v in enumerate(shares))
    return pd.DataFrame(rows, columns=["step", "layer", "expert", "load"])


def metrics_per_layer(metrics: pd.DataFrame, key: str) -> pd.DataFrame:
    """A per-layer list key of metrics.jsonl (e.g. ``experts/load_entropy``,
    ``routing/old_new/changed_by_layer``, or a router-entropy key if the run logs one) as a tidy
    frame ``step``, ``layer``, ``value``. Empty if the key is absent."""
    rows = []
    if key in metrics:
        for step, values in zip(metrics[keys.STEP], metrics[key], strict=True):
            if isinstance(values, list):
                rows.extend({"step": step, "layer": layer, "value": v} for layer, v in enumerate(values))
    frame = pd.DataFrame(rows, columns=["step", "layer", "value"])
    frame["value"] = pd.to_numeric(frame["value"], errors="coerce")
    return frame
