"""A grid of ``moestab train`` runs: axes x seeds, each run in its own folder, finished runs reused."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from moestab.configs import build_config, config_to_dict
from moestab.run_folder import RunFolder, schema
from moestab.run_folder.errors import RunError
from moestab.run_folder.lock import RunLockedError
from moestab.run_folder.reader import load_metrics, read_run_info
from moestab.train import TrainConfig, train

logger = logging.getLogger(__name__)
"""The grid's notes (run started, run skipped) when :func:`run_grid` is given no ``log``."""


@dataclass(frozen=True)
class GridRun:
    """One run of a grid: its axis values (seed included) and its config."""

    values: dict[str, Any]
    config: TrainConfig = field(compare=False)

    @property
    def run_dir(self) -> Path:
        return Path(self.config.run_dir)


def _slug(value: Any) -> str:
    return str(value).replace("/", "-").replace(":", "-").replace("=", "-").replace(",", "-")


def grid_runs(
    base: Mapping[str, Any], axes: Mapping[str, Sequence[Any]], seeds: Sequence[int], out: str | Path
) -> list[GridRun]:
    """Every combination of ``axes`` (TrainConfig fields) and ``seeds`` over ``base`` fields, each in
    ``out/<field>-<value>_..._seed-<seed>``. Configs are validated here, before anything runs.

    Every step is measured (``measure_every`` 1) unless ``base`` or ``axes`` say otherwise: experiments compare runs
    step by step, and ``moestab train``'s default budget measures one step in 4."""
    if not seeds:
        raise ValueError("seeds is empty; give at least one seed")
    runs = []
    names = list(axes)
    for combo in itertools.product(*(axes[n] for n in names), seeds):
        values = {**dict(zip(names, combo[:-1], strict=True)), "seed": combo[-1]}
        folder = "_".join(f"{k}-{_slug(v)}" for k, v in values.items())
        fields = {"measure_every": 1, **base, **values, "out": str(Path(out) / folder), "progress": False}
        runs.append(GridRun(values, build_config(TrainConfig, fields)))
    return runs


def is_finished(run: GridRun) -> bool:
    try:
        return read_run_info(run.run_dir).status == schema.STATUS_FINISHED
    except RunError:
        return False


def shard(runs: Sequence[GridRun], index: int, count: int) -> list[GridRun]:
    """Every ``count``-th run from ``index``: ``count`` processes, one per shard, train a grid together without two
    ever writing one folder (each run's result depends on its config only, not on the process that ran it)."""
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard {index}/{count} is not valid: need 0 <= index < count, count >= 1")
    return list(runs[index::count])


def _locked(error: BaseException | None) -> RunLockedError | None:
    """The :class:`RunLockedError` in ``error``'s chain of causes, if any."""
    while error is not None:
        if isinstance(error, RunLockedError):
            return error
        error = error.__cause__ or error.__context__
    return None


def run_grid(runs: Sequence[GridRun], *, log: Callable[[str], None] = logger.info) -> list[Path]:
    """Train every run that has not finished (an unfinished folder is started over); returns the run folders.

    A run another process is training (its folder's lock is held) is skipped with a note, so several processes may
    walk one grid together: each trains what is neither finished nor taken. A run stopped by Ctrl-C or SIGTERM stops
    the grid too (it would otherwise go on to the next run)."""
    for i, run in enumerate(runs, start=1):
        if is_finished(run):
            continue
        log(f"[{i}/{len(runs)}] {run.run_dir.name}")
        overwrite = RunFolder(run.run_dir).holds_run
        try:
            result = train(build_config(TrainConfig, {**config_to_dict(run.config), "overwrite": overwrite}),
                           log=lambda s: None)
        except Exception as error:
            held = _locked(error)
            if held is None:
                raise
            log(f"[{i}/{len(runs)}] {run.run_dir.name}: skipped, another process is training it ({held})")
            continue
        if result.stop_signal:  # Ctrl-C / SIGTERM: the run saved its last step; the grid stops with it
            log(f"[{i}/{len(runs)}] {run.run_dir.name}: interrupted (signal {result.stop_signal}); the grid stops "
                "here, and resumes from its finished runs when started again")
            break
    return [run.run_dir for run in runs]


def quiet_process(threads: int) -> None:
    """What a launcher that trains many runs in one process sets first: ``threads`` torch threads (a float result
    depends on them; runs register it) and no transformers progress bars in its log."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(threads)


def grid_metrics(runs: Sequence[GridRun]) -> pd.DataFrame:
    """metrics.jsonl of every run, one row per step, with the run's axis values as columns."""
    frames = [load_metrics(run.run_dir).assign(**run.values) for run in runs]
    return pd.concat(frames, ignore_index=True)
