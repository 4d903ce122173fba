"""The errors of reading run folders, as the analyzers raise them (defined in :mod:`moestab.run_folder.errors`).

``AnalysisError`` is the base class of all of them (an alias of ``RunError``).
"""

from moestab.run_folder.errors import NotARunError, RunError, RunFileError, SchemaVersionError, Skipped

AnalysisError = RunError

__all__ = ["AnalysisError", "NotARunError", "RunError", "RunFileError", "SchemaVersionError", "Skipped"]
