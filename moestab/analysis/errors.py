"""Errors and warnings raised while reading run folders (docs/run-format.md).

Readers raise an error when nothing useful can be read from what was asked (not a run, a newer
schema, the one file asked for is missing or corrupt) and emit a :class:`RunReadWarning` when they
skip part of a run but still return what was readable (a corrupt line of metrics.jsonl, one corrupt
per-token file among several). Every message names the file.
"""

from __future__ import annotations

from pathlib import Path


class AnalysisError(Exception):
    """Base class of the errors raised by ``moestab.analysis``."""


class NotARunError(AnalysisError):
    """The folder is not a moestab run folder (it has no run.json)."""


class SchemaVersionError(AnalysisError):
    """run.json declares a schema_version newer than this reader understands."""


class RunFileError(AnalysisError):
    """A file of a run folder is missing, unreadable or does not follow the run format.

    ``path`` is the offending file, so that callers can report it.
    """

    def __init__(self, path: str | Path, problem: str):
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class RunReadWarning(UserWarning):
    """Part of a run could not be read and was skipped; the rest of the result is still valid."""
