"""Where a recorded step's numbers go besides metrics.jsonl: experiment trackers (TensorBoard, W&B, trackio).

:func:`scalars` is the one rule for what a step sends, whoever sends it: ``moestab train --report-to`` and
``DiagnosticsRun(report_to=...)`` through :func:`open_trackers`, the TRL integration through TRL's own
``Trainer.log`` (so to whatever TRL's ``report_to`` names). Every key is metrics.jsonl's under one prefix,
``moestab/`` (``moestab/routing/old_new/changed``); a per-layer (or per-minibatch) list becomes one series per
entry, ``<key>/<index>`` (``moestab/routing/old_new/changed_by_layer/0``, ...), and ``null`` is left out. A
``[layers][experts]`` matrix (``experts/load``) would be a series per layer and expert, 6,144 a step for 48 layers of
128 experts: it goes as :func:`load_summary`'s three numbers, and the matrix itself only when asked for
(``expert_load_matrix=True``).

The trackers are optional extras: a missing package is refused at start-up, before anything is written. TensorBoard
and W&B write under the run folder (``tensorboard/``, ``wandb/``); trackio into its own store ($TRACKIO_DIR).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from moestab.configs import ConfigError
from moestab.extras import MissingExtraError, require
from moestab.metrics import keys
from moestab.metrics.experts import max_violation
from moestab.run_folder import RunFolder

PREFIX = "moestab/"
"""Every tracker key starts with it, so moestab's series sit apart from a host trainer's own (TRL's ``loss``, ...)."""


def load_summary(load: Any) -> dict[str, float]:
    """One step's expert load ``[layers][experts]`` (shares or counts, as ``experts/load``) in three numbers, over the
    layers that routed any slot: ``max_vio_max`` and ``max_vio_mean``, the largest and the mean load violation
    (:func:`~moestab.metrics.experts.max_violation`, 0 = uniform), and ``dead_experts``, the (layer, expert) pairs
    with load 0 (in metrics.jsonl's shares, rounded to 6 decimals: under 5e-7 of the layer's slots). Empty when no
    layer routed a slot."""
    load = np.asarray(load, dtype=np.float64)  # [layers, experts]; null -> NaN
    vio = max_violation(load)  # [layers], NaN for a layer with no routed slot
    routed = np.isfinite(vio)  # [layers]
    if not routed.any():
        return {}
    return {"max_vio_max": float(vio[routed].max()), "max_vio_mean": float(vio[routed].mean()),
            "dead_experts": float((load[routed] == 0).sum())}


def _is_matrix(key: str) -> bool:
    row = keys.KEYS.get(key)
    return row is not None and row.kind == keys.PER_LAYER_EXPERT


def scalars(metrics: Mapping[str, Any], *, expert_load_matrix: bool = False) -> dict[str, float]:
    """A metrics.jsonl row as the flat numbers a tracker gets, each under ``moestab/<key>``: lists spread over
    ``<key>/<index>``, ``None`` and non-finite numbers dropped, the step left out (it is the tracker's x axis). A
    ``[layers][experts]`` key becomes ``<key>/max_vio_max``, ``<key>/max_vio_mean`` and ``<key>/dead_experts``
    (:func:`load_summary`), plus ``<key>/<layer>/<expert>`` with ``expert_load_matrix``. The route-integrity checks'
    per-layer lists (``keys.INTEGRITY_LAYER_DETAIL``) stay in metrics.jsonl: a tracker gets their compact summary
    (``routes/integrity/coverage``, ``lift``, ``disagreeing``, ``failed``...)."""
    out: dict[str, float] = {}

    def put(key: str, value: Any) -> None:
        if isinstance(value, int | float):  # bool included
            if math.isfinite(value):  # NaN / inf are null in metrics.jsonl
                out[key] = float(value)
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                put(f"{key}/{i}", item)

    for key, value in metrics.items():
        if key == keys.STEP or key in keys.INTEGRITY_LAYER_DETAIL:
            continue
        if _is_matrix(key) and value is not None:
            for stat, number in load_summary(value).items():
                put(f"{PREFIX}{key}/{stat}", number)
            if not expert_load_matrix:
                continue
        put(PREFIX + key, value)
    return out


def mean_scalars(steps: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Several steps' :func:`scalars` as one log: each key's mean over the steps that have it (how TRL's ``log``
    merges its own numbers over ``logging_steps``)."""
    sums: dict[str, list[float]] = {}
    for step in steps:
        for key, value in step.items():
            sums.setdefault(key, []).append(value)
    return {key: math.fsum(values) / len(values) for key, values in sums.items()}


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


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
"""``--report-to`` / ``report_to`` name -> its constructor; each name is also the optional extra that installs it
(``moestab.extras``)."""


def check_trackers(names: tuple[str, ...]) -> None:
    """Raise ``ConfigError`` for an unknown tracker, one named twice (it would log every scalar twice) or one whose
    extra is not installed."""
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"report_to: {', '.join(twice)} named twice; name each tracker once (valid: "
                          f"{', '.join(TRACKERS)})")
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(f"report_to: unknown tracker {name!r}; valid: {', '.join(TRACKERS)}")
        try:
            require(name, f"report_to: {name}")
        except MissingExtraError as exc:
            raise ConfigError(f"{exc}; or drop {name} from report_to") from exc


def run_id(created: str, run_dir: Path) -> str:
    """A tracker run id for the run created at ``created`` (run.json) in ``run_dir``: the same on every resume."""
    return hashlib.sha1(f"{created}|{run_dir.resolve().name}".encode()).hexdigest()[:16]


@contextmanager
def open_trackers(names: tuple[str, ...], run: TrackedRun, *,
                  expert_load_matrix: bool = False) -> Iterator[Callable[[Mapping[str, Any], int], None]]:
    """The trackers ``names`` for ``run``, as one ``log(metrics_row, step)`` that sends :func:`scalars` of the row
    (``expert_load_matrix``: also every layer and expert of ``experts/load``); closed on exit."""
    opened: list[Tracker] = []
    RunFolder(run.run_dir).check_tracker_folders(names)  # no link followed out of the run, no file in the way
    try:
        for name in names:
            opened.append(TRACKERS[name](run))

        def log(metrics: Mapping[str, Any], step: int) -> None:
            flat = scalars(metrics, expert_load_matrix=expert_load_matrix)
            for tracker in opened:
                tracker.log(flat, step)

        yield log
    finally:
        for tracker in opened:
            tracker.close()
