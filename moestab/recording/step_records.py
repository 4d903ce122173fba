"""Writing a step through :mod:`moestab.run_folder`: its per-token table (the sampled rows) and its metrics line.

Both trainers call these, in their own order (``moestab train``: the table before its evaluation, the line after it;
the TRL integration: both at the end of a generation batch); neither lays out a table or a line itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import pyarrow as pa
import torch

from moestab.metrics import keys
from moestab.recording.step_tensors import StepTensors
from moestab.recording.token_table import record_rows, token_table


class StepWriter(Protocol):
    """Where a step's records go (``moestab.run_folder.writer.RunWriter``)."""

    def write_tokens(self, step: int, table: pa.Table) -> None: ...

    def append_metrics(self, metrics: dict[str, Any]) -> None: ...


def write_step_tokens(
    writer: StepWriter, step: int, t: StepTensors, *, record_fraction: float, seed: int, layer_slots: list[int],
) -> None:
    """Write the per-token table of ``step``: the sequences :func:`~moestab.recording.token_table.record_rows` draws
    with ``seed`` (all of them at ``record_fraction`` 1) among those the measurement budget scored (every one
    without a budget: ``t.measured``), route columns on the routes' layer positions ``layer_slots``."""
    t = t.to("cpu")  # a no-op for a host record (moestab train's); a trainer's record may still be on its GPU
    pool = torch.arange(t.batch.batch_size) if t.measured is None else torch.nonzero(t.measured).flatten()  # [n]
    if not len(pool):
        return
    rows = pool[record_rows(len(pool), record_fraction, seed)]
    writer.write_tokens(step, token_table(step, t, rows=rows, layer_slots=layer_slots))


def metrics_line(step: int, metrics: Mapping[str, object]) -> dict[str, object]:
    """The metrics.jsonl object of ``step``: ``step`` and ``metrics`` in the key table's order; a key the table does
    not declare is refused (:class:`~moestab.metrics.keys.UndeclaredKeyError`)."""
    return keys.in_table_order({keys.STEP: step, **metrics})


@keys.computes(keys.STEP)
def write_step_metrics(writer: StepWriter, step: int, metrics: Mapping[str, object]) -> None:
    """Append :func:`metrics_line` of ``step`` to metrics.jsonl."""
    writer.append_metrics(metrics_line(step, metrics))
