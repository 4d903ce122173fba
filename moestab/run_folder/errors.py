"""Errors raised while reading run folders, and :class:`Skipped`, what a tolerant reader left out.

A reader raises when nothing useful can be read from what was asked (not a run, a schema it does
not read, the one file asked for is missing or corrupt). Readers that go over many files or lines
take a ``skipped`` list: without one (``None``) the first unreadable part raises
:class:`RunFileError`; with one, the part is appended as a :class:`Skipped` (file, line, reason) and
the rest is still read. Nothing is reported through process-wide warnings, so concurrent readers
(the dashboard's sessions) never see each other's problems.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class RunError(Exception):
    """Base class of the errors raised while reading run folders."""


class NotARunError(RunError):
    """The folder is not a moestab run folder (it has no run.json)."""


class SchemaVersionError(RunError):
    """run.json declares a schema_version this moestab does not read (newer, or an old one without upgrade)."""


class RunFolderError(RunError):
    """A folder cannot take a new run, be overwritten or be resumed; the message says why and what to do."""


class RunFileError(RunError):
    """A file of a run folder is missing, unreadable or does not follow the run format.

    ``path`` is the offending file, so that callers can report it.
    """

    def __init__(self, path: str | Path, problem: str):
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


@dataclass(frozen=True)
class Skipped:
    """A part of a run that a reader could not read and left out; the rest of its result is valid."""

    file: Path
    """The file the part belongs to."""
    reason: str
    """What was wrong, and how much was left out."""
    line: int | None = None
    """1-based line of a text file (metrics.jsonl), when the part is a line."""

    def __str__(self) -> str:
        where = f"{self.file}" if self.line is None else f"{self.file}, line {self.line}"
        return f"{where}: {self.reason}"


def skip(skipped: list[Skipped] | None, error: RunFileError, *, line: int | None = None) -> None:
    """Record ``error`` in ``skipped``, or raise it when the caller asked for a strict read (``None``)."""
    if skipped is None:
        raise error
    skipped.append(Skipped(error.path, error.problem, line))
