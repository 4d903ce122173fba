"""The errors of reading run folders, as the analyzers raise them (defined in :mod:`moestab.records.errors`).

``AnalysisError`` is the base class of all of them (an alias of ``RunError``).
"""

from moestab.records.errors import NotARunError, RunError, RunFileError, SchemaVersionError, Skipped

AnalysisError = RunError

__all__ = ["AnalysisError", "NotARunError", "RunError", "RunFileError", "SchemaVersionError", "Skipped"]
