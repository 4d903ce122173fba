"""Errors raised by the registries of ``moestab.rl`` (losses, advantage estimators, presets)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

V = TypeVar("V")


class UnknownNameError(KeyError, ValueError):
    """A name looked up in a registry does not exist; the message lists the valid names.

    Subclasses both ``KeyError`` (it is a failed lookup) and ``ValueError`` (it is bad user input), so
    callers may catch either.
    """

    def __init__(self, kind: str, name: object, valid: Iterable[str]) -> None:
        self.kind = kind
        self.name = name
        self.valid = tuple(sorted(valid))
        super().__init__(f"unknown {kind} {name!r}; valid names: {', '.join(self.valid)}")

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message (adding quotes); show it as written.
        return str(self.args[0])


def lookup(table: Mapping[str, V], name: str, kind: str) -> V:
    """``table[name]``, or an ``UnknownNameError`` naming ``kind`` and listing ``table``'s keys."""
    try:
        return table[name]
    except (KeyError, TypeError):  # TypeError: unhashable name
        raise UnknownNameError(kind, name, table.keys()) from None
