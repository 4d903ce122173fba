"""Typed errors of the tasks package; all are ``ValueError`` subclasses so callers can catch one type."""

from __future__ import annotations


class TaskError(ValueError):
    """Base class of every error raised by ``moestab.tasks``."""


class TaskSpecError(TaskError):
    """Unknown task name, unknown or invalid parameter, or a malformed spec string."""


class TaskDataError(TaskError):
    """User data (a jsonl file, a prompt or answer) is missing, malformed or outside the charset."""


class RewardFunctionError(TaskError):
    """A user reward function cannot be loaded, or it returned something other than a finite number."""
