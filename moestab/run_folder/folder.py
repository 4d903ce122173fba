"""``RunFolder``: the one owner of a run folder's layout and lifetime (docs/run-format.md).

Every writer (``moestab train``, the TRL integration) and every reader (``moestab analyze``, the dashboard, the
probes) gets the paths of a run's files from here, and only here is a folder checked for a new run, cleared for
``--overwrite``, checked for ``--resume``, cleaned of what an interrupted write left behind, or given a checkpoint.
Its refusals are :class:`RunFolderError`, whose messages end with what the writer's user can do (:class:`Remedies`).

No torch and no model here: a checkpoint's training state comes serialised, and its weights are written by the
caller's function into the temporary folder it is given; the names, temporaries and atomic renames are the folder's.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from moestab.run_folder import schema
from moestab.run_folder.checkpoint_files import checkpoint_problem
from moestab.run_folder.errors import RunError, RunFileError, RunFolderError
from moestab.run_folder.files import atomic_write_bytes, created, refuse_link, remove
from moestab.run_folder.lock import folder_contents, run_lock
from moestab.run_folder.run_info import RunInfo, read_run_info

RUN_SUBFOLDERS = (schema.TOKENS_DIR, schema.CHECKPOINTS_DIR, schema.STATE_DIR)
"""The folders a writer makes in a run: per-token tables, checkpoints, training states. They never hold a run."""

DISK_ERRNOS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
               errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied"}
"""The ``OSError`` numbers of a folder that cannot take a write, with how :meth:`RunFolder.disk_failure` says so."""

_WRITE_PROBE = ".moestab-write-test"


@dataclass(frozen=True)
class Remedies:
    """How the user of a writer picks another folder, starts over and resumes: the words its refusals end with.

    The default is ``moestab train``'s flags; the TRL integration names its ``RecordSettings``.
    """

    folder: str = "--out"
    """What names the run folder."""
    overwrite: str = "--overwrite"
    """What deletes the run in it and starts over."""
    resume: str | None = "moestab train --resume"
    """The command that continues a run from its last checkpoint; ``None`` for a writer that cannot resume."""


TRAIN_REMEDIES = Remedies()
"""``moestab train``'s words."""


class RunFolder:
    """A run folder at ``path``: where each of its files lives, and every change to the folder as a whole.

    A run is identified by its contents (run.json), never by how its path was spelled: a relative or absolute path,
    a trailing slash, a folder moved or copied since, are the same run.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    # ---- layout ---------------------------------------------------------------------------------
    @property
    def run_json(self) -> Path:
        return self.path / schema.RUN_JSON

    @property
    def config_yaml(self) -> Path:
        return self.path / schema.CONFIG_YAML

    @property
    def metrics_file(self) -> Path:
        return self.path / schema.METRICS_JSONL

    @property
    def tokens_dir(self) -> Path:
        return self.path / schema.TOKENS_DIR

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / schema.CHECKPOINTS_DIR

    @property
    def tensorboard_dir(self) -> Path:
        return self.path / schema.TENSORBOARD_DIR

    def subfolders(self) -> list[Path]:
        """:data:`RUN_SUBFOLDERS`, in this run."""
        return [self.path / sub for sub in RUN_SUBFOLDERS]

    def tokens_file(self, step: int) -> Path:
        """The per-token table of ``step``."""
        return self.path / schema.tokens_file(step)

    def checkpoint_dir(self, step: int) -> Path:
        """The Hugging Face folder of the checkpoint written after ``step``."""
        return self.path / schema.checkpoint_dir(step)

    def state_file(self, step: int) -> Path:
        """The training state (optimizer, loop) saved with the checkpoint of ``step``."""
        return self.path / schema.state_file(step)

    def analyzed_files(self) -> list[Path]:
        """What the analyzers read: run.json, metrics.jsonl (both listed even when missing) and tokens/*.parquet."""
        files = [self.run_json, self.metrics_file]
        if self.tokens_dir.is_dir():
            files.extend(p for p in self.tokens_dir.iterdir() if p.suffix == ".parquet")
        return files

    # ---- status ---------------------------------------------------------------------------------
    @property
    def holds_run(self) -> bool:
        """Whether the folder has a run.json (readable or not): a run, for whoever lists runs."""
        return self.run_json.is_file()

    def info(self) -> RunInfo:
        """run.json (:func:`~moestab.run_folder.run_info.read_run_info`)."""
        return read_run_info(self.path)

    def saved_checkpoints(self) -> list[int]:
        """Steps with a checkpoint's model folder, ascending, with or without its training state."""
        if not self.checkpoints_dir.is_dir():
            return []
        steps = []
        for entry in self.checkpoints_dir.iterdir():
            step = schema.parse_step_name(entry.name)
            if step is not None and entry.is_dir():
                steps.append(step)
        return sorted(steps)

    def complete_checkpoints(self) -> list[int]:
        """Steps with a complete checkpoint, ascending: both the model folder and the training state exist (each is
        renamed into place when whole, so a kill never leaves a partial one)."""
        return [step for step in self.saved_checkpoints() if self.state_file(step).is_file()]

    def lock(self, *, note: Callable[[str], None]) -> AbstractContextManager[None]:
        """The folder's one-writer lock while inside (:func:`moestab.run_folder.lock.run_lock`)."""
        return run_lock(self.path, note=note)

    # ---- a new run ------------------------------------------------------------------------------
    def check_writable(self, *, remedy: str) -> None:
        """:class:`RunFolderError` unless files can be created in the folder (or, if it does not exist yet, in its
        nearest existing parent). Writes and removes a probe file; creates no folder."""
        self.refuse_links()
        target = self.path
        while not target.exists() and target != target.parent:
            target = target.parent
        probe = target / _WRITE_PROBE
        try:
            with created(probe) as f:  # never through a link planted at the probe's name
                f.write(b"ok")
        except OSError as exc:
            raise RunFolderError(f"cannot write to the run folder {self.path}: {exc.strerror or exc} ({target}); "
                                 f"{remedy}") from exc
        finally:
            with contextlib.suppress(OSError):  # a read-only target has no probe to remove
                probe.unlink(missing_ok=True)

    def refuse_links(self) -> None:
        """:class:`~moestab.run_folder.files.PlantedLinkError` when a name the run writes through (its lock file,
        metrics.jsonl, a subfolder) is a symbolic link: runs folders are shared, and a write would land on the link's
        target. Names replaced by a rename (run.json, a checkpoint) need no check."""
        for path in (self.path / schema.LOCK_FILE, self.metrics_file, *self.subfolders()):
            refuse_link(path)

    def check_new(self, *, overwrite: bool, remedies: Remedies = TRAIN_REMEDIES) -> bool:
        """Check that a new run may be written here: the folder is absent, empty (its lock file is no content), or
        (``overwrite``) holds a finished, failed or stopped run. Returns whether that run must be deleted first; the
        caller deletes it with :meth:`clear` once everything else has been checked, so a bad setting loses nothing."""
        if not self.path.exists():
            return False
        if not self.path.is_dir():
            raise RunFolderError(f"{remedies.folder} {self.path} is a file, not a folder; "
                                 f"choose another {remedies.folder}")
        info = self._readable_info()
        if info is None:
            if folder_contents(self.path):
                refusal = f"; {remedies.overwrite} deletes only run folders" if overwrite else ""
                raise RunFolderError(f"{remedies.folder} {self.path} is a non-empty folder that is not a moestab run; "
                                     f"choose another {remedies.folder}{refusal}")
            return False
        if info.live_status() == schema.STATUS_RUNNING:
            raise RunFolderError(f"{self._describe(info)} that is still being written by process "
                                 f"{info.writer.get('pid')} on {info.writer.get('host')}; stop it first")
        if overwrite:
            return True
        raise RunFolderError(self._refusal(info, remedies))

    def _readable_info(self) -> RunInfo | None:
        try:
            return self.info()
        except RunError:
            return None

    def _describe(self, info: RunInfo) -> str:
        return f"{self.path} already holds a run ({info.live_status()}, last step {info.last_step})"

    def _refusal(self, info: RunInfo, remedies: Remedies) -> str:
        """Why a run that is not being written is kept without ``overwrite``, and how to go on."""
        if remedies.resume is None:
            return f"{self._describe(info)}; choose another {remedies.folder} or start over with {remedies.overwrite}"
        if self.complete_checkpoints():
            return (f"{self._describe(info)}; continue it with `{remedies.resume} {self.path}` or start over with "
                    f"{remedies.overwrite}")
        return (f"{self._describe(info)} that stopped before its first checkpoint, so there is nothing to resume; "
                f"start over with {remedies.overwrite}")

    def clear(self) -> list[Path]:
        """Delete the run that :meth:`check_new` cleared for ``overwrite`` (checked again: still a run folder): what a
        run writes (:data:`~moestab.run_folder.schema.RUN_CONTENTS`) and temporaries an interrupted write left. Anything
        else there (a user's notes, analyses) stays, as do the folder and the lock file of the writer starting over.
        Returns what was kept, for the caller to name."""
        self.info()  # raises unless it still is a run folder
        kept = []
        for path in folder_contents(self.path):
            if path.name in schema.RUN_CONTENTS or _is_temporary(path.name):
                remove(path)  # a link is unlinked, never followed
            else:
                kept.append(path)
        return kept

    # ---- resuming -------------------------------------------------------------------------------
    def resume_point(self, *, note: Callable[[str], None]) -> tuple[RunInfo, int]:
        """The run to continue and the step of its last whole checkpoint; :class:`RunFolderError` when there is none
        (not a run, a run still being written, a run stopped before its step-0 checkpoint, every checkpoint damaged)
        or when metrics.jsonl has a line no resume may drop (:meth:`metric_lines`). A damaged last checkpoint (a
        copy cut short: :func:`~moestab.run_folder.checkpoint_files.checkpoint_problem`) is passed over for the one
        before, ``note`` saying so; the resumed run drops it (:meth:`drop_checkpoints_after`) as it drops the metric
        lines it recomputes."""
        try:
            info = self.info()
        except RunError as exc:
            raise RunFolderError(f"--resume {self.path}: {exc}") from exc
        if info.live_status() == schema.STATUS_RUNNING:
            raise RunFolderError(f"--resume {self.path}: the run is still being written by process "
                                 f"{info.writer.get('pid')} on {info.writer.get('host')}; stop it first")
        try:
            self.metric_lines()
        except RunFileError as exc:
            raise RunFolderError(f"--resume {self.path}: {exc}") from exc
        done = self.complete_checkpoints()
        if not done:
            raise RunFolderError(f"--resume {self.path}: it has no complete checkpoint (it stopped before step 0 was "
                                 "saved); start over with `moestab train --out ... --overwrite`")
        damaged = []
        for step in reversed(done):
            problem = checkpoint_problem(self.checkpoint_dir(step), self.state_file(step))
            if problem is None:
                for skipped, why in damaged:
                    note(f"checkpoint {skipped} is damaged ({why}); resuming from checkpoint {step}")
                return info, step
            damaged.append((step, problem))
        shown = "; ".join(f"step {step}: {why}" for step, why in damaged)
        raise RunFolderError(f"--resume {self.path}: every checkpoint is damaged ({shown}); start over with "
                             "`moestab train --out ... --overwrite`, or copy the run again")

    def drop_checkpoints_after(self, step: int) -> list[int]:
        """Delete the checkpoints (model folder and training state) of steps after ``step``: a resumed run's, which
        :meth:`resume_point` passed over as damaged and the run recomputes. Returns their steps."""
        later = [s for s in self.complete_checkpoints() if s > step]
        for later_step in later:
            self.drop_checkpoint(later_step)
        return later

    def drop_checkpoint(self, step: int) -> None:
        """Delete the checkpoint of ``step``: its training state first (the checkpoint is then no longer complete,
        so a kill in between leaves weights nobody resumes from), then its model folder."""
        self.drop_state(step)
        remove(self.checkpoint_dir(step))

    def drop_state(self, step: int) -> None:
        """Delete the training state of ``step``, keeping its model folder: only ``--resume`` reads a state, and
        the analyses, the dashboard and the checkpoint evaluations read the weights."""
        remove(self.state_file(step))

    def metric_lines(self) -> tuple[list[tuple[int, str]], list[int]]:
        """metrics.jsonl as ``([(step, line), ...], torn)``: ``torn`` the 1-based numbers of lines that are not JSON
        objects with a ``step`` (what a kill during an append leaves). Raises :class:`RunFileError` naming the line
        when a line is a JSON object whose ``step`` is not an integer: no kill writes that, so it is the user's to
        mend, never dropped. No file: ``([], [])``."""
        path = self.metrics_file
        if not path.exists():
            return [], []
        lines, torn = [], []
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                step = json.loads(line)["step"]
            except (json.JSONDecodeError, KeyError, TypeError):
                torn.append(number)
                continue
            if isinstance(step, bool) or not isinstance(step, int):
                raise RunFileError(path, f"line {number}: 'step' is {json.dumps(step)[:40]}, not an integer; "
                                   "mend or delete that line, then resume (nothing was changed)")
            lines.append((step, line))
        return lines, torn

    def leftover_temporaries(self) -> list[Path]:
        """Files and folders an interrupted write leaves: ``.*.tmp`` and ``.step_*.old``, in the folder and its
        :data:`RUN_SUBFOLDERS`."""
        found = []
        for folder in (self.path, *self.subfolders()):
            if folder.is_dir():
                found += [p for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith((".tmp", ".old"))]
        return sorted(found)

    def remove_temporaries(self) -> list[Path]:
        """Delete :meth:`leftover_temporaries`; returns what was removed."""
        removed = self.leftover_temporaries()
        for path in removed:
            remove(path)  # a planted link is unlinked, its target untouched
        return removed

    # ---- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(
        self, step: int, state: bytes | memoryview, write_weights: Callable[[Path], None], *, weights_bytes: int,
    ) -> Path:
        """Write the checkpoint of ``step``: ``state`` (the serialised training state) as :meth:`state_file`, then
        the model folder :meth:`checkpoint_dir`, which ``write_weights(folder)`` fills in a temporary folder renamed
        into place. Each is whole or absent; the checkpoint is complete once both exist.

        A write that fails for lack of space is an ``OSError(ENOSPC)`` naming the file: ``weights_bytes`` (the size
        of the weights) tells a full disk behind a weight writer's own exception types (safetensors') from another
        failure."""
        atomic_write_bytes(self.state_file(step), state)
        folder = self.checkpoint_dir(step)
        try:
            replace_folder(folder, write_weights)
        except OSError:
            raise
        except Exception as exc:
            if shutil.disk_usage(self.path).free < weights_bytes:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder)) from exc
            raise
        return folder

    def disk_failure(self, exc: OSError, checkpoint_bytes: int) -> str | None:
        """A message for an ``OSError`` raised while writing the run (disk full, read-only, ...), naming the file,
        what a checkpoint needs (``checkpoint_bytes``) and what is free; ``None`` for any other error."""
        if exc.errno not in DISK_ERRNOS:
            return None
        target = exc.filename or self.path
        try:
            free = f"{shutil.disk_usage(self.path).free / 2**20:.1f} MiB free"
        except OSError:
            free = "free space unknown"
        return (f"cannot write {target}: {DISK_ERRNOS[exc.errno]} ({os.strerror(exc.errno)}); a checkpoint of this "
                f"model needs about {checkpoint_bytes / 2**20:.1f} MiB, {free} on {self.path}")


def _is_temporary(name: str) -> bool:
    """A name only an interrupted write leaves: ``.NAME.tmp``, ``.NAME.old``, the write probe."""
    return name == _WRITE_PROBE or (name.startswith(".") and name.endswith((".tmp", ".old")))


def kept_note(kept: list[Path]) -> str:
    """`` (kept X, Y: not moestab's)`` for :meth:`RunFolder.clear`'s result, or ``""``."""
    if not kept:
        return ""
    return f" (kept {', '.join(p.name + ('/' if p.is_dir() else '') for p in kept)}: not moestab's)"


def replace_folder(path: Path, write: Callable[[Path], None]) -> None:
    """``write(folder)`` into a temporary folder beside ``path``, then renamed to ``path`` (a folder already there is
    moved aside first and deleted after), so a folder at ``path`` is always a whole one: a checkpoint's, or any model
    folder's (:func:`moestab.models.save_policy`). What an interrupted write leaves is ``.NAME.tmp`` / ``.NAME.old``."""
    tmp = path.with_name(f".{path.name}.tmp")
    remove(tmp)  # an interrupted write's, or a planted link (unlinked, never followed)
    write(tmp)
    if path.exists() or path.is_symlink():
        old = path.with_name(f".{path.name}.old")
        remove(old)
        path.rename(old)
        tmp.rename(path)
        remove(old)
    else:
        tmp.rename(path)
