"""One writer per run folder: ``RUN/.moestab.lock`` (docs/run-format.md, "One writer at a time").

The lock is ``fcntl.flock`` on that file, which the OS releases when its holder exits however it exits (SIGKILL
included), so a dead writer never leaves a folder locked. The file names its holder (pid, host, start time): a
refused writer says who holds the folder, and a file left behind by a holder that died (its lock already released)
is taken over with a note. A holder that ends normally empties and removes the file.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from moestab.run_folder import schema
from moestab.run_folder.errors import RunError
from moestab.run_folder.files import open_fd
from moestab.run_folder.run_info import now

NAME_WAIT_S = 1.0
"""How long a refused writer waits for a holder that has just locked the file to write its name there."""


class RunLockedError(RunError):
    """Another process holds the run folder's lock; the message names it (pid, host, since when)."""

    def __init__(self, run_dir: Path, holder: dict[str, Any]) -> None:
        self.run_dir, self.holder = run_dir, holder
        who = (f"process {holder.get('pid')} on host {holder.get('host')} (since {holder.get('started')})"
               if holder else "another process (it has not written its name in the lock file yet)")
        super().__init__(f"{run_dir} is being written by {who}; wait for it to end or stop it, or choose another "
                         "run folder")

    def __reduce__(self) -> tuple:  # pickled (e.g. between processes) with the arguments it was made from
        return type(self), (self.run_dir, self.holder)


def lock_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / schema.LOCK_FILE


def folder_contents(folder: str | Path) -> list[Path]:
    """What ``folder`` holds besides its lock file: a folder that holds only the lock counts as empty."""
    return sorted(p for p in Path(folder).iterdir() if p.name != schema.LOCK_FILE)


@contextmanager
def run_lock(run_dir: str | Path, *, note: Callable[[str], None]) -> Iterator[None]:
    """Hold ``run_dir``'s lock while inside; :class:`RunLockedError` when another live process holds it.

    Creates ``run_dir`` (and missing parents) to hold the lock file; on the way out the file is removed, and so are
    the folders created here if nothing else was put in them, so a refused or failed start leaves nothing behind.
    ``note(message)`` is told when the lock of a holder that died is taken over.
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "a file, not a folder", str(run_dir))
    created = [p for p in (run_dir, *run_dir.parents) if not p.exists()][::-1]  # outermost first
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = _acquire(lock_path(run_dir), note)
    except BaseException:
        _remove_if_empty(created)
        raise
    try:
        yield
    finally:
        try:
            _release(fd, lock_path(run_dir))
        finally:
            _remove_if_empty(created)


def _acquire(path: Path, note: Callable[[str], None]) -> int:
    """The open, locked lock file, with this process's name written in it."""
    while True:  # until the file locked is the one at ``path`` (a holder removes it when it ends)
        try:
            fd = open_fd(path, os.O_RDWR | os.O_CREAT)  # a planted link is refused: the lock truncates its file
        except FileNotFoundError:  # a holder that created the folder removed it as it ended: make it again
            path.parent.mkdir(parents=True, exist_ok=True)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd, wait=NAME_WAIT_S)
            os.close(fd)
            raise RunLockedError(path.parent, holder) from None
        except OSError as exc:
            os.close(fd)
            raise OSError(exc.errno, f"its file system does not support flock ({exc.strerror})", str(path)) from exc
        try:
            here = os.stat(path)
        except FileNotFoundError:
            here = None
        mine = os.fstat(fd)
        if here is not None and (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino):
            break
        os.close(fd)  # locked a file its holder had just removed: lock the one now at ``path``
    try:
        previous = _holder(fd, wait=0.0)
        if previous:
            note(f"took over the lock of process {previous.get('pid')} on host {previous.get('host')} (since "
                 f"{previous.get('started')}), which is no longer running")
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": now()})
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{record}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _holder(fd: int, *, wait: float) -> dict[str, Any]:
    """The holder named in the lock file (``{}`` if none), waiting up to ``wait`` s for one that just locked it."""
    deadline = time.monotonic() + wait
    while True:
        text = os.pread(fd, 4096, 0).decode("utf-8", errors="replace").strip()
        if text or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    if not text:
        return {}
    try:
        holder = json.loads(text)
    except json.JSONDecodeError:
        return {"pid": "?", "host": "?", "started": f"unreadable lock file: {text[:80]!r}"}
    return holder if isinstance(holder, dict) else {}


def _release(fd: int, path: Path) -> None:
    """Empty and remove the lock file while still holding it, then let go (closing releases the flock)."""
    try:
        os.ftruncate(fd, 0)  # even if the removal fails, the file names nobody
        path.unlink(missing_ok=True)  # a writer that opened it meanwhile sees it gone and locks a new one
    finally:
        os.close(fd)


def _remove_if_empty(folders: list[Path]) -> None:
    """Remove the ``folders`` (outermost first) that :func:`run_lock` created, innermost first, while empty."""
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                return  # the run was written there (or someone else removed it): keep it and what holds it
            raise
