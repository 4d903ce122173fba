"""Where a run lives: choosing, checking and cleaning its folder before anything is loaded or written.

A run folder is identified by its contents (run.json), never by how its path was spelled: ``--resume
RUN_DIR`` works with a relative or absolute path, a trailing slash, or a folder that was moved or
copied since.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Any

from moestab.records import schema
from moestab.records.errors import RunError
from moestab.records.lock import folder_contents
from moestab.records.run_info import RunInfo, read_run_info
from moestab.records.writer import clear_run_folder, remove_temporaries
from moestab.train.checkpoint import complete_checkpoints


class TrainingError(RuntimeError):
    """A run could not start or continue; the message says why and what to do."""


RESUMABLE_FIELDS = ("steps", "threads", "progress", "save_every", "eval_every", "report_to", "resume", "out",
                    "overwrite")
"""Settings a resumed run may change; every other one must equal the run's own (it shapes the numbers)."""

_DISK_ERRNOS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
                errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied"}


def check_writable(folder: Path, *, remedy: str = "choose a writable --out") -> None:
    """:class:`TrainingError` unless files can be created in ``folder`` (or, if it does not exist yet, in its
    nearest existing parent). Writes and removes a probe file; creates no folder."""
    target = folder
    while not target.exists() and target != target.parent:
        target = target.parent
    probe = target / ".moestab-write-test"
    try:
        probe.write_bytes(b"ok")
    except OSError as exc:
        raise TrainingError(f"cannot write to the run folder {folder}: {exc.strerror or exc} ({target}); "
                            f"{remedy}") from exc
    finally:
        with contextlib.suppress(OSError):  # a read-only target has no probe to remove
            probe.unlink(missing_ok=True)


def _describe(info: RunInfo, run_dir: Path) -> str:
    status = info.live_status()
    return f"{run_dir} already holds a run ({status}, last step {info.last_step})"


def prepare_new(run_dir: Path, *, overwrite: bool) -> bool:
    """Check that a new run may be written to ``run_dir``: absent, empty, or (``overwrite``) a finished,
    failed or stopped run. Returns whether that run must be deleted first; the caller deletes it (with
    :func:`clear_run`) only once everything else has been checked, so a bad setting loses nothing."""
    if not run_dir.exists():
        return False
    if not run_dir.is_dir():
        raise TrainingError(f"--out {run_dir} is a file, not a folder; choose another --out")
    try:
        info = read_run_info(run_dir)
    except RunError:
        info = None
    if info is None:
        if folder_contents(run_dir):  # the lock file of the writer checking it is no content
            refusal = "; --overwrite deletes only run folders" if overwrite else ""
            raise TrainingError(f"--out {run_dir} is a non-empty folder that is not a moestab run; "
                                f"choose another --out{refusal}")
        return False
    if info.live_status() == schema.STATUS_RUNNING:
        raise TrainingError(f"{_describe(info, run_dir)} that is still being written by process "
                            f"{info.writer.get('pid')} on {info.writer.get('host')}; stop it first")
    if overwrite:
        return True
    if complete_checkpoints(run_dir):
        raise TrainingError(f"{_describe(info, run_dir)}; continue it with `moestab train --resume {run_dir}` "
                            "or start over with --overwrite")
    raise TrainingError(f"{_describe(info, run_dir)} that stopped before its first checkpoint, so there is "
                        "nothing to resume; start over with --overwrite")


def clear_run(run_dir: Path) -> None:
    """Delete the run in a folder that :func:`prepare_new` cleared for ``--overwrite`` (checked again: a run folder);
    the folder and the lock file of the writer starting over stay."""
    read_run_info(run_dir)  # raises unless it still is a run folder
    clear_run_folder(run_dir)


def prepare_resume(
    run_dir: Path, config: dict[str, Any], defaults: dict[str, Any] | None = None,
) -> tuple[RunInfo, int, list[str]]:
    """Check that ``run_dir`` can be resumed with ``config``; returns its info, the step to resume from and
    notes on what was cleaned up. Removes temporaries an interrupted write left behind. ``defaults``: the value of
    a setting the run did not record (it predates the setting)."""
    try:
        info = read_run_info(run_dir)
    except RunError as exc:
        raise TrainingError(f"--resume {run_dir}: {exc}") from exc
    if info.live_status() == schema.STATUS_RUNNING:
        raise TrainingError(f"--resume {run_dir}: the run is still being written by process "
                            f"{info.writer.get('pid')} on {info.writer.get('host')}; stop it first")
    done = complete_checkpoints(run_dir)
    if not done:
        raise TrainingError(f"--resume {run_dir}: it has no complete checkpoint (it stopped before step 0 was "
                            "saved); start over with `moestab train --out ... --overwrite`")
    recorded = {**(defaults or {}), **info.config}
    differ = {k: (recorded.get(k), v) for k, v in config.items()
              if k not in RESUMABLE_FIELDS and recorded.get(k) != v}
    if differ:
        shown = ", ".join(f"{k}: run has {old!r}, asked {new!r}" for k, (old, new) in differ.items())
        raise TrainingError(f"--resume {run_dir}: settings differ from the run's ({shown}); only "
                            f"{', '.join(f for f in RESUMABLE_FIELDS if f not in ('resume', 'out', 'overwrite'))} "
                            "may change on resume")
    check_writable(run_dir, remedy="copy the run to a writable folder and resume the copy")  # before any cleanup
    notes = [f"removed the leftover {p.relative_to(run_dir)}" for p in remove_temporaries(run_dir)]
    return info, done[-1], notes


def write_failure(exc: OSError, run_dir: Path, checkpoint_bytes: int) -> str | None:
    """A message for an OSError raised while writing the run (disk full, read-only, ...), else ``None``."""
    if exc.errno not in _DISK_ERRNOS:
        return None
    target = exc.filename or run_dir
    try:
        free = f"{shutil.disk_usage(run_dir).free / 2**20:.1f} MiB free"
    except OSError:
        free = "free space unknown"
    return (f"cannot write {target}: {_DISK_ERRNOS[exc.errno]} ({os.strerror(exc.errno)}); a checkpoint of this "
            f"model needs about {checkpoint_bytes / 2**20:.1f} MiB, {free} on {run_dir}")
