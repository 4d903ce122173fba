"""A ``moestab train`` run in its folder, from the first check to the last status (docs/run-format.md).

Before anything is loaded, rank 0 locks the folder and checks it (:meth:`TrainRun.lock_and_check`); once the policy
is loaded, it opens the run (:meth:`TrainRun.open`: run.json ``running``); the steps run inside
:meth:`TrainRun.recording_the_end`, which defers Ctrl-C / SIGTERM to the end of a step, renews the heartbeat and
records how any stop ended; :meth:`TrainRun.finish` writes the last status. What a run folder is (its paths, its
refusals, deleting, cleaning, checkpoints) is :class:`moestab.run_folder.RunFolder`'s; this module adds ``moestab
train``'s settings, words and errors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import yaml

from moestab.configs import config_to_dict
from moestab.recording.environment import environment as run_environment
from moestab.recording.measure_budget import RULE as MEASURE_RULE
from moestab.run_folder import RunFolder, RunFolderError, schema
from moestab.run_folder.folder import kept_note
from moestab.run_folder.lock import RunLockedError
from moestab.run_folder.run_info import ModelInfo, RunInfo
from moestab.run_folder.writer import RunWriter
from moestab.train.config import BEFORE_THE_SETTING, TrainConfig
from moestab.train.distributed import World
from moestab.train.interrupt import GracefulInterrupt
from moestab.train.step_update import NonFiniteLossError


class TrainingError(RuntimeError):
    """A run could not start or continue; the message says why and what to do."""


class RunCrashedError(TrainingError):
    """The steps raised what moestab did not foresee (a bug, the environment); the run is recorded ``failed`` and the
    cause is chained, whose traceback the command prints. Every other TrainingError's message is the whole story."""


class NothingToLearnError(RuntimeError):
    """Every advantage was 0 for several steps in a row: the rewards give RL nothing to learn from."""


RESUMABLE_FIELDS = ("steps", "threads", "progress", "save_every", "eval_every", "report_to",
                    "report_expert_load_matrix", "route_integrity", "on_collapse_warning", "resume", "out",
                    "overwrite")
"""Settings a resumed run may change; every other one must equal the run's own (it shapes the numbers)."""

NEW_RUN_REMEDY = "choose a writable --out"
RESUME_REMEDY = "copy the run to a writable folder and resume the copy"


def config_defaults() -> dict:
    """What a run that did not record a TrainConfig field ran with: its default, or the value it had before the field
    existed (:data:`~moestab.train.config.BEFORE_THE_SETTING`)."""
    return {**{f.name: f.default for f in fields(TrainConfig)}, **BEFORE_THE_SETTING}


@contextmanager
def refusals() -> Iterator[None]:
    """A run folder's refusal (:class:`~moestab.run_folder.RunFolderError`) raised inside, as a :class:`TrainingError`
    with its message."""
    try:
        yield
    except RunFolderError as exc:
        raise TrainingError(str(exc)) from exc


def prepare_run_folder(config: TrainConfig, log: Callable[[str], None]) -> tuple[int, bool]:
    """Check the run folder before anything is loaded: ``(step to start from, whether --overwrite must delete the
    run there first)``; resuming removes temporaries an interrupted write left behind."""
    folder = RunFolder(config.run_dir)
    with refusals():
        if not config.resume:
            folder.check_writable(remedy=NEW_RUN_REMEDY)
            return 0, folder.check_new(overwrite=config.overwrite)
        folder.check_tracker_folders(config.report_to)  # before run.json or anything else is touched
        info, step = folder.resume_point(note=lambda message: log(f"resume: {message}"))
        check_resumed_settings(folder.path, info, config_to_dict(config), defaults=config_defaults())
        if config.steps < step or (config.steps == step and info.status == schema.STATUS_FINISHED):
            raise TrainingError(f"--resume {folder.path} --steps {config.steps}: the run has finished step {step} "
                                f"(of {info.config.get('steps')}); a resumed run goes on to a later step: give --steps "
                                f"above {step}, or copy the run's checkpoint {step} elsewhere to branch from it")
        folder.check_writable(remedy=RESUME_REMEDY)  # before any cleanup
        for path in folder.remove_temporaries():
            log(f"resume: removed the leftover {path.relative_to(folder.path)}")
    return step, False


def check_resumed_settings(run_dir: Path, info: RunInfo, config: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Refuse a resume whose ``config`` differs from the run's own in a setting outside :data:`RESUMABLE_FIELDS`.
    ``defaults``: the value of a setting the run did not record (it predates the setting)."""
    recorded = {**defaults, **info.config}
    differ = {k: (recorded.get(k), v) for k, v in config.items()
              if k not in RESUMABLE_FIELDS and recorded.get(k) != v}
    if differ:
        shown = ", ".join(f"{k}: run has {old!r}, asked {new!r}" for k, (old, new) in differ.items())
        raise TrainingError(f"--resume {run_dir}: settings differ from the run's ({shown}); only "
                            f"{', '.join(f for f in RESUMABLE_FIELDS if f not in ('resume', 'out', 'overwrite'))} "
                            "may change on resume")


@contextmanager
def run_folder_lock(config: TrainConfig, log: Callable[[str], None]) -> Iterator[None]:
    """The run folder's lock (:mod:`moestab.run_folder.lock`); a folder another live process writes is refused, naming
    it, as is a folder where no lock can be taken."""
    folder = RunFolder(config.run_dir)
    # A read-only folder is refused as such (prepare_run_folder's check), before the lock creates anything there.
    with refusals():
        if not config.resume:
            folder.check_writable(remedy=NEW_RUN_REMEDY)
        elif folder.path.is_dir():  # else prepare_run_folder says it is no run
            folder.check_writable(remedy=RESUME_REMEDY)
    with ExitStack() as held:
        try:
            held.enter_context(folder.lock(note=lambda message: log(f"lock: {message}")))
        except RunLockedError as exc:
            raise TrainingError(str(exc)) from exc
        except OSError as exc:
            raise TrainingError(f"cannot lock the run folder {folder.path}: {exc.strerror or exc} ({exc.filename}); "
                                "choose another run folder") from exc
        yield


def environment(world: World) -> dict:
    """What a run's numbers depend on besides its config (run.json ``environment``)."""
    return run_environment(world_size=world.size, measure_rule=MEASURE_RULE)


class TrainRun:
    """One run of ``moestab train`` in its folder, and how it ended: ``step`` (the step in flight, or the last one
    done), ``status``, ``final_accuracy``, ``stop_signal``. Rank 0 writes the folder; the other ranks keep the same
    state and write nothing."""

    def __init__(self, config: TrainConfig, world: World, log: Callable[[str], None]) -> None:
        self.config, self.world, self.log = config, world, log
        self.main = world.is_main
        self.folder = RunFolder(config.run_dir)
        self.writer = RunWriter(self.folder.path)
        self.interrupt = GracefulInterrupt()
        self.step, self.status, self.stop_signal = 0, schema.STATUS_FINISHED, 0
        self.collapse_stop, self.stop_message = False, ""
        self.final_accuracy: float | None = None

    @property
    def run_dir(self) -> Path:
        return self.folder.path

    # ---- before anything is loaded ---------------------------------------------------------------
    def lock_and_check(self, lock: ExitStack) -> tuple[int, bool]:
        """Rank 0's: take the folder's lock (held in ``lock`` until the run ends, however it ends) before anything
        there is read, written or deleted (--overwrite), then :func:`prepare_run_folder`."""
        lock.enter_context(run_folder_lock(self.config, self.log))
        return prepare_run_folder(self.config, self.log)

    # ---- once the policy is loaded and every setting checked ------------------------------------
    def open(self, model: ModelInfo, start_step: int, delete_first: bool) -> float | None:
        """Rank 0's: run.json ``running``. A resumed run drops its metric lines after ``start_step`` (and a torn
        one) and returns its start eval accuracy; a new one deletes the old run first when ``delete_first``
        (--overwrite: only now that every setting has been checked) and writes run.json and config.yaml."""
        if self.config.resume:
            for step in self.folder.drop_checkpoints_after(start_step):
                self.log(f"resume: deleted the damaged checkpoint {step} (this run writes that step again)")
            torn = self.writer.truncate_metrics(start_step)
            if torn:
                lines = ", ".join(map(str, torn))
                self.log(f"resume: dropped {len(torn)} torn line(s) of {schema.METRICS_JSONL} (line {lines})")
            return self.writer.update(status=schema.STATUS_RUNNING, last_step=start_step, error=None,
                                      environment=environment(self.world)).warm_start_accuracy
        if delete_first:
            kept = self.folder.clear()
            self.log(f"overwrite: deleted the previous run in {self.run_dir}{kept_note(kept)}")
        resolved = config_to_dict(replace(self.config, out=str(self.run_dir), resume=None, overwrite=False))
        self.writer.start(config=resolved, model=model, environment=environment(self.world),
                          config_yaml=yaml.safe_dump(resolved, sort_keys=False))
        return None

    # ---- the steps ------------------------------------------------------------------------------
    @contextmanager
    def recording_the_end(self, start_step: int, checkpoint_bytes: int) -> Iterator[ExitStack]:
        """Around the steps, from ``start_step``: the first Ctrl-C / SIGTERM deferred to the end of the step in flight
        (:meth:`stop_requested`), the heartbeat renewed, and every way out recorded in run.json, never ``running``:
        an error as ``failed``, a second signal as ``interrupted``, each with a message (a :class:`TrainingError`
        saying what to do, its cause chained). Yields an ExitStack for what must close after the end is recorded.
        ``checkpoint_bytes``: what a checkpoint needs, for a full disk's message."""
        self.step = start_step
        with self.interrupt, (self.writer.beating() if self.main else nullcontext()), ExitStack() as closing:
            try:
                yield closing
            except NothingToLearnError as exc:
                self._record(schema.STATUS_FAILED, str(exc), self.step)
                raise TrainingError(str(exc)) from exc
            except NonFiniteLossError as exc:
                last_good = self.folder.complete_checkpoints()[-1]
                message = (f"step {self.step}: {exc}; stopped, the last good checkpoint is step {last_good} "
                           "(not overwritten)")
                self._record(schema.STATUS_FAILED, message, self.step - 1)
                raise TrainingError(message) from exc
            except BaseException as exc:  # a crash, a full disk, a second Ctrl-C: never leave "running"
                if not self.main:
                    raise
                self._record_stop(exc, checkpoint_bytes)

    def stop_requested(self) -> bool:
        """Whether a Ctrl-C / SIGTERM reached any process (every rank asks at the same points, and stops together)."""
        return self.world.any(self.interrupt.requested)

    def interrupted(self, what: str) -> None:
        """The run stops ``interrupted`` after the step it is at (``what``: where it stopped, for the log)."""
        self.status, self.stop_signal = schema.STATUS_INTERRUPTED, self.interrupt.signum
        self.log(f"\ninterrupted ({self.interrupt.signal_name or 'on another rank'}){what}; "
                 f"continue with `moestab train --resume {self.run_dir}`")

    def stopped_by_warning(self, message: str) -> None:
        """The run stops ``interrupted`` after the step it is at, because a collapse warning fired under
        ``--on-collapse-warning stop``; ``message`` (logged already: the step, the signal, how to go on) is kept as
        run.json's ``error``."""
        self.status, self.collapse_stop, self.stop_message = schema.STATUS_INTERRUPTED, True, message

    def finish(self) -> None:
        """Rank 0's: the status the steps ended with, the last step and the final eval accuracy."""
        if self.main and self.collapse_stop:
            self.writer.update(status=self.status, last_step=self.step, final_accuracy=self.final_accuracy,
                               error=self.stop_message)
        elif self.main:
            self.writer.update(status=self.status, last_step=self.step, final_accuracy=self.final_accuracy)

    def _record(self, status: str, error: str, last_step: int) -> None:
        if self.main:
            self.writer.update(status=status, error=error, last_step=last_step)

    def _record_stop(self, exc: BaseException, checkpoint_bytes: int) -> None:
        """Mark the run ``interrupted`` (Ctrl-C) or ``failed`` with a message, clean temporaries, and re-raise."""
        hard_stop = isinstance(exc, KeyboardInterrupt)
        disk = self.folder.disk_failure(exc, checkpoint_bytes) if isinstance(exc, OSError) else None
        what = disk or f"{type(exc).__name__}: {exc}"
        how = (f"continue with `moestab train --resume {self.run_dir}`" if self.folder.complete_checkpoints()
               else "it stopped before its first checkpoint; start over with --overwrite")
        message = f"step {self.step}: {what}; {how}"
        self.folder.remove_temporaries()
        try:
            self.writer.update(status=schema.STATUS_INTERRUPTED if hard_stop else schema.STATUS_FAILED,
                               error=message, last_step=max(self.step - 1, 0))
        except OSError as write_exc:  # e.g. the disk is full even for run.json: say both
            raise RunCrashedError(f"{message} (and run.json could not be updated: {write_exc})") from exc
        if isinstance(exc, Exception):  # the message says what happened and what to do; the cause is chained
            raise RunCrashedError(message) from exc
        raise exc  # a second Ctrl-C / SIGTERM, or the interpreter exiting
