"""How moestab writes files inside a run folder: never through a symbolic link.

Runs folders are shared (a lab's NFS, a bucket synced to a laptop), so every name in one is untrusted: a link planted
at a name moestab writes (``.moestab.lock``, ``metrics.jsonl``, a ``.NAME.tmp``) would send the write, or a
truncation, to the link's target. Files are therefore opened with ``O_NOFOLLOW``; a temporary is created with
``O_EXCL`` after whatever was left at its name is removed (removing a link removes the link, never its target); a
file or folder moved into place with a rename replaces a link at that name instead of writing through it. A link at a
name moestab appends to or locks is refused, with its path, by :class:`PlantedLinkError`. The run folder itself may be
a link (``--out`` pointing at a bigger disk is the user's own choice); only the names inside it are not followed.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from moestab.run_folder.errors import RunFolderError

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class PlantedLinkError(RunFolderError):
    """A name moestab writes inside a run folder is a symbolic link; nothing was written through it."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            target = f" (to {os.readlink(self.path)})"
        except OSError:
            target = ""
        super().__init__(f"{self.path} is a symbolic link{target}; moestab never writes through a link inside a run "
                         f"folder (runs folders may be shared): remove the link (rm {self.path}) and run again")


def refuse_link(path: Path) -> None:
    """:class:`PlantedLinkError` when ``path`` is a symbolic link (dangling or not)."""
    if Path(path).is_symlink():
        raise PlantedLinkError(path)


def read_only_above(path: Path) -> Path | None:
    """The nearest existing path at or above ``path`` when this process may not write there (a read-only mount, or
    another user's folder), so that creating ``path`` would fail; None when it may. ``os.access`` reports a read-only
    mount for root too, which permissions alone do not stop."""
    here = next((p for p in (path, *path.parents) if p.exists()), None)
    return here if here is not None and not os.access(here, os.W_OK) else None


def remove(path: Path) -> None:
    """Delete ``path``: a link or file is unlinked (a link's target is untouched), a real folder removed whole."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def created(path: Path) -> Iterator[BinaryIO]:
    """A new file at ``path`` open for binary writing: whatever was left at the name (a temporary of an interrupted
    write, a planted link) is removed first, and the file is created exclusively without following links."""
    remove(path)
    fd = os.open(path, _CREATE, 0o644)
    with os.fdopen(fd, "wb") as f:
        yield f


def atomic_write_bytes(path: Path, data: bytes | memoryview) -> None:
    """``data`` as the whole of ``path``: written to ``.NAME.tmp`` (see :func:`created`), then renamed over ``path``
    (a link at ``path`` is replaced, not written through). A failed write leaves neither a partial file nor the
    temporary behind; its ``OSError`` names the file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with created(tmp) as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(exc.filename or tmp)) from exc
    finally:
        if tmp.is_symlink() or tmp.exists():
            remove(tmp)


def atomic_write_text(path: Path, text: str) -> None:
    """``text`` (UTF-8) as the whole of ``path``; :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode())


def open_fd(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags | O_NOFOLLOW)``; :class:`PlantedLinkError` when ``path`` is a link."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.EEXIST and Path(path).is_symlink()):
            raise PlantedLinkError(Path(path)) from None
        raise


def open_append(path: Path) -> BinaryIO:
    """``path`` open for appending in binary (created if absent), refusing a link (:class:`PlantedLinkError`)."""
    return os.fdopen(open_fd(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab")
