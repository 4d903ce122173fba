"""Experiment trackers ``moestab train --report-to`` logs each step's metrics to: TensorBoard, W&B, trackio.

Every tracker gets the rows of metrics.jsonl under the same keys; a per-layer (or per-minibatch) list becomes one
series per entry, ``<key>/<index>`` (``routing/old_new/changed_by_layer/0``, ...), and ``null`` is left out. The
trackers are optional extras: a missing package is refused at start-up, before anything is written. TensorBoard
and W&B write under the run folder (``tensorboard/``, ``wandb/``); trackio into its own store ($TRACKIO_DIR).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from moestab.configs import ConfigError
from moestab.extras import MissingExtraError, require
from moestab.metrics import keys
from moestab.records import RunFolder


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """metrics.jsonl's row as flat numbers: lists spread over ``key/index``, ``None`` and non-numbers dropped."""
    out: dict[str, float] = {}

    def put(key: str, value: Any) -> None:
        if isinstance(value, int | float):  # bool included
            if math.isfinite(value):  # NaN / inf are null in metrics.jsonl
                out[key] = float(value)
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                put(f"{key}/{i}", item)

    for key, value in metrics.items():
        if key != keys.STEP:
            put(key, value)
    return out


@dataclass(frozen=True)
class TrackedRun:
    """What a tracker needs to know of the run it logs."""

    run_dir: Path
    config: dict
    run_id: str
    """Stable over --resume (derived from run.json's ``created``): W&B and trackio continue the same run."""
    start_step: int
    """The last step already logged (0 for a new run): a resumed run's later steps replace what was logged
    after it."""


class _TensorBoard:
    def __init__(self, run: TrackedRun) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: events of steps after the checkpoint resumed from (logged, then lost to a crash) are dropped
        self.writer = SummaryWriter(log_dir=str(RunFolder(run.run_dir).tensorboard_dir),
                                    purge_step=run.start_step + 1 if run.start_step else None)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _WandB:
    def __init__(self, run: TrackedRun) -> None:
        import wandb

        # Mode, project and entity come from the usual W&B environment (WANDB_MODE=offline, WANDB_PROJECT, ...).
        self.run = wandb.init(project="moestab", name=run.run_dir.name, id=run.run_id, resume="allow",
                              config=run.config, dir=str(run.run_dir), reinit="create_new")

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class _Trackio:
    def __init__(self, run: TrackedRun) -> None:
        import trackio

        self.run = trackio.init(project="moestab", name=f"{run.run_dir.name}-{run.run_id}", config=run.config,
                                resume="allow", embed=False)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


TRACKERS: dict[str, Callable[[TrackedRun], Tracker]] = {
    "tensorboard": _TensorBoard,
    "wandb": _WandB,
    "trackio": _Trackio,
}
"""``--report-to`` name -> its constructor; each name is also the optional extra that installs it
(``moestab.extras``)."""


def check_trackers(names: tuple[str, ...]) -> None:
    """Raise ``ConfigError`` for an unknown tracker or one whose extra is not installed."""
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(f"report_to: unknown tracker {name!r}; valid: {', '.join(TRACKERS)}")
        try:
            require(name, f"report_to: {name}")
        except MissingExtraError as exc:
            raise ConfigError(f"{exc}; or drop {name} from --report-to") from exc


def run_id(created: str, run_dir: Path) -> str:
    """A tracker run id for the run created at ``created`` (run.json) in ``run_dir``: the same on every resume."""
    return hashlib.sha1(f"{created}|{run_dir.resolve().name}".encode()).hexdigest()[:16]


@contextmanager
def open_trackers(names: tuple[str, ...], run: TrackedRun) -> Iterator[Callable[[dict, int], None]]:
    """The trackers ``names`` for ``run``, as one ``log(metrics_row, step)``; closed on exit."""
    opened: list[Tracker] = []
    try:
        for name in names:
            opened.append(TRACKERS[name](run))

        def log(metrics: dict, step: int) -> None:
            flat = scalars(metrics)
            for tracker in opened:
                tracker.log(flat, step)

        yield log
    finally:
        for tracker in opened:
            tracker.close()
