"""Bounded echoes of user input in error messages.

An error names the value that was wrong, but a value can be anything a YAML file or a flag holds: a
megabyte string, a 5,000-digit integer, a list of nested aliases that expands to gigabytes when turned
into text. Every message that echoes a value goes through :func:`shown`, so it stays a line long.
"""

from __future__ import annotations

import reprlib
from pathlib import Path
from typing import Any

ECHO_LIMIT = 200
"""Characters of a value echoed in an error message; longer values are cut and end with "..."."""
MESSAGE_LIMIT = 4000
"""Characters of a whole error message a command prints: a net under the echoes, for a message nobody bounded."""


class _BoundedRepr(reprlib.Repr):
    """``repr`` that never expands more than a few levels and items of a nested value, nor a long string."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = self.maxdict = self.maxdeque = 5
        self.maxstring = self.maxother = self.maxlong = limit

    def repr_str(self, x: str, level: int) -> str:
        return repr(x) if len(x) <= self.maxstring else repr(x[: self.maxstring]) + "..."  # the head, not the middle

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 4 * self.maxlong:  # str() itself refuses 4,300 digits and more
            return f"<an integer of about {int(x.bit_length() * 0.30103) + 1} digits>"
        return repr(x)


_REPR = _BoundedRepr(ECHO_LIMIT)


def clip(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, then "..." when anything was cut."""
    return text if len(text) <= limit else text[:limit] + "..."


def shown(value: Any, limit: int = ECHO_LIMIT) -> str:
    """``repr(value)`` for an error message: at most ``limit`` characters, then "..." when it was longer."""
    return clip(_REPR.repr(value), limit)


class UserFileError(ValueError):
    """A file the user named cannot be read as text; the message says which and what was expected."""


def read_user_text(path: Path, *, what: str, expected: str) -> str:
    """The UTF-8 text of the file ``path`` a user gave as ``what`` (e.g. "config file"); :class:`UserFileError`
    naming it and ``expected`` (what a valid one is) when it is missing, a folder, unreadable or not text."""
    if not path.is_file():
        state = "is a folder" if path.is_dir() else "does not exist"
        raise UserFileError(f"{what} {path} {state}; {expected}")
    try:
        return path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise UserFileError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise UserFileError(f"{what} {path} is not text (byte {exc.start} is not UTF-8); {expected}") from exc
