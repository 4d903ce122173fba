"""An index of run folders' overview rows, kept in an SQLite file of the user's cache, so that a runs folder of
thousands of runs opens in seconds: a row is computed once per version of the run's files (its fingerprint) and read
back from the index afterwards, by every dashboard process and session of that user.

SQLite (in Python's standard library) is the query engine: no dependency to install, safe for several processes
reading and writing one file, and one query answers which of 10,000 runs have a row for their current fingerprint.
The file lives in ``$MOESTAB_CACHE`` (else ``~/.cache/moestab``), never in the runs folder: runs folders are shared
and their files untrusted, and a reader writes nothing there. Where the cache cannot be written (a read-only home),
the index lives in memory for the process and :attr:`RunIndex.note` says so.

An entry is what reading the run gave: a JSON object (the row), the parts left out, and the error when nothing could
be read; :func:`read_within` computes the missing entries for a time budget and says which runs are still unread.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moestab import __version__
from moestab.configs import cache_root

INDEX_FILE = "runs-index.sqlite3"
"""The index's file name in the cache folder."""
FORMAT = 1
"""Bumped when an entry's meaning changes; entries written by another format (or moestab version) are recomputed."""

Fingerprint = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True)
class Entry:
    """What reading one run gave."""

    value: dict[str, Any] | None
    skipped: tuple[str, ...] = ()
    error: str | None = None
    trace: str | None = None


def _plain(value: Any) -> Any:
    """numpy scalars as Python numbers (the rows come from pandas and numpy)."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _encode(entry: Entry) -> str:
    return json.dumps({"value": entry.value, "skipped": list(entry.skipped), "error": entry.error,
                       "trace": entry.trace}, default=_plain, allow_nan=True)


def _decode(text: str) -> Entry:
    data = json.loads(text)
    return Entry(data["value"], tuple(data["skipped"]), data["error"], data["trace"])


class RunIndex:
    """Overview rows of run folders by ``(absolute path, fingerprint)``, in an SQLite file (``None``: in memory).

    One object may be shared by threads (Streamlit sessions): calls are serialised by a lock. Use as a context
    manager, or :meth:`close` it.
    """

    def __init__(self, file: str | Path | None = None, *, timeout_s: float = 10.0) -> None:
        self.note: str | None = None
        """Why the index is in memory although a file was asked for (``None`` otherwise)."""
        self._lock = threading.Lock()
        self._version = f"{FORMAT}:{__version__}"
        self._db = self._connect(file, timeout_s)

    def _connect(self, file: str | Path | None, timeout_s: float) -> sqlite3.Connection:
        if file is not None:
            try:
                Path(file).parent.mkdir(parents=True, exist_ok=True)
                db = sqlite3.connect(str(file), timeout=timeout_s, check_same_thread=False)
                self._create(db)
                return db
            except (OSError, sqlite3.Error) as exc:  # said in .note: the dashboard still works, without memory
                self.note = (f"the run index {file} cannot be used ({exc}); runs are read again in every dashboard "
                             "process")
        db = sqlite3.connect(":memory:", check_same_thread=False)
        self._create(db)
        return db

    @staticmethod
    def _create(db: sqlite3.Connection) -> None:
        with db:
            db.execute("CREATE TABLE IF NOT EXISTS runs (path TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, "
                       "version TEXT NOT NULL, entry TEXT NOT NULL)")

    @classmethod
    def in_cache(cls) -> RunIndex:
        """The index of the user's cache folder (:func:`moestab.configs.cache_root`)."""
        return cls(cache_root() / INDEX_FILE)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> RunIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def known(self, runs: Mapping[str, Fingerprint]) -> dict[str, Entry]:
        """The entries of ``runs`` (path -> fingerprint) whose fingerprint (and moestab version) is the indexed one."""
        wanted = {str(Path(path).absolute()): (path, json.dumps(fingerprint)) for path, fingerprint in runs.items()}
        out: dict[str, Entry] = {}
        with self._lock:
            # One query for the lot: a temporary table of the wanted paths, joined (10,000 runs: ~0.1 s).
            self._db.execute("CREATE TEMP TABLE IF NOT EXISTS wanted (path TEXT PRIMARY KEY, fingerprint TEXT)")
            self._db.execute("DELETE FROM wanted")
            self._db.executemany("INSERT OR REPLACE INTO wanted VALUES (?, ?)",
                                 [(absolute, fp) for absolute, (_, fp) in wanted.items()])
            found = self._db.execute(
                "SELECT runs.path, runs.entry FROM runs JOIN wanted ON runs.path = wanted.path "
                "AND runs.fingerprint = wanted.fingerprint WHERE runs.version = ?", (self._version,)).fetchall()
            self._db.commit()
        for absolute, text in found:
            try:
                out[wanted[absolute][0]] = _decode(text)
            except (ValueError, KeyError, TypeError):  # a damaged entry: read the run again
                continue
        return out

    def clear(self) -> None:
        """Forget every entry (the dashboard's Refresh: every run is read again)."""
        with self._lock, self._db:
            self._db.execute("DELETE FROM runs")

    def put(self, path: str, fingerprint: Fingerprint, entry: Entry) -> None:
        """Keep ``entry`` for ``path`` at ``fingerprint`` (replacing what was kept for the path)."""
        self.put_many([(path, fingerprint, entry)])

    def put_many(self, entries: list[tuple[str, Fingerprint, Entry]]) -> None:
        """Keep each ``(path, fingerprint, entry)``, in one transaction (one write to disk, not one a run)."""
        rows = [(str(Path(path).absolute()), json.dumps(fp), self._version, _encode(entry))
                for path, fp, entry in entries]
        with self._lock:
            try:
                with self._db:
                    self._db.executemany("INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?)", rows)
            except sqlite3.OperationalError as exc:  # locked past the timeout, disk full: the entries are recomputed
                self.note = f"the run index could not keep {len(rows)} entries ({exc}); those runs are read again"


@dataclass(frozen=True)
class IndexRead:
    """What :func:`read_within` got."""

    entries: dict[str, Entry]
    """Path -> entry, for every run read (from the index or now)."""
    pending: tuple[str, ...]
    """Runs not read yet (the budget ran out), in the order asked."""
    computed: int
    """How many of ``entries`` were computed in this call (the rest came from the index)."""


def read_within(index: RunIndex, runs: Mapping[str, Fingerprint], compute: Callable[[str], Entry],
                budget_s: float | None, clock: Callable[[], float] = time.monotonic) -> IndexRead:
    """The entries of ``runs`` (path -> fingerprint, in the order to read them): from ``index`` where it holds the
    current fingerprint, else ``compute(path)`` (kept in the index), until ``budget_s`` seconds have passed (``None``:
    no limit; 0: none, only what the index holds; a positive budget computes at least one run, so that every call
    makes progress)."""
    entries = index.known(runs)
    start = clock()
    pending = [path for path in runs if path not in entries]
    done: list[tuple[str, Fingerprint, Entry]] = []
    for path in pending:
        if budget_s is not None and (budget_s <= 0 or (done and clock() - start >= budget_s)):
            break
        done.append((path, runs[path], compute(path)))
    if done:
        index.put_many(done)  # the call's reads kept together
    entries.update({path: entry for path, _, entry in done})
    return IndexRead(entries, tuple(pending[len(done):]), len(done))
