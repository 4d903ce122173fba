"""Which function computes or measures each metrics.jsonl key: the functions marked with ``keys.computes`` (and the
measurements' declared ``keys``), collected for docs/metrics.md's "computed by" column and its test.

The key table (layer 2) cannot name code above it; the code names its keys instead, by importing them, so a reader or
a static tool follows a key to its function through an ordinary reference.
"""

from __future__ import annotations

from collections.abc import Callable

from moestab.metrics import keys
from moestab.recording import measurements
from moestab.recording.collapse_watch import collapse_keys
from moestab.recording.diagnostics import route_diagnostics
from moestab.recording.step_metrics import STEP_METRICS
from moestab.recording.step_records import write_step_metrics
from moestab.train import step
from moestab.train.evaluate import greedy_accuracy
from moestab.train.history import SolvedPrompts
from moestab.train.route_bases import base_route_distance
from moestab.train.step_sample import sample

TRAINER_MEASURED: tuple[Callable, ...] = (write_step_metrics, step.run_step, sample, route_diagnostics,
                                          SolvedPrompts.replace_solved, greedy_accuracy, base_route_distance,
                                          collapse_keys)
"""The functions that measure the keys a trainer hands over (rows with ``computed=False``)."""


def key_owners() -> dict[str, str]:
    """Each row's pattern -> ``module.qualname`` of the function (or measurement class) that computes or measures it.
    ``ValueError`` for a row with no owner, or with two."""
    owners: dict[str, str] = {}
    marked = [(keys.owned_keys(f), keys.owner_name(f)) for f in (*STEP_METRICS, *TRAINER_MEASURED)]
    marked += [(tuple(keys.KEYS[k].pattern for k in m.keys), keys.owner_name(m)) for m in measurements.MEASUREMENTS]
    for patterns, name in marked:
        for pattern in patterns:
            if pattern in owners:
                raise ValueError(f"{pattern}: marked by {owners[pattern]} and by {name}")
            owners[pattern] = name
    missing = [row.pattern for row in keys.TABLE if row.pattern not in owners]
    if missing:
        raise ValueError(f"{missing}: no function is marked to compute these rows (keys.computes)")
    return owners
