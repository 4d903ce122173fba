"""The task spec string of ``moestab train --task``: ``NAME`` or ``NAME:KEY=VALUE[,KEY=VALUE...]``.

Grammar (whitespace around names, keys and values is ignored)::

    spec   := NAME [ ":" param ( "," param )* ]
    param  := KEY "=" VALUE
    NAME, KEY := [A-Za-z_][A-Za-z0-9_]*
    VALUE  := one or more characters other than ","   (":" and "=" are allowed, e.g. a.py:fn)

Only the first ``:`` separates the name, and only the first ``=`` of a parameter separates its key,
so values such as ``reward=rewards.py:score`` or ``path=C:/data/train.jsonl`` need no quoting. A value
cannot contain ``,``. This module only splits strings; ``moestab.tasks.registry`` turns them into tasks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from moestab.tasks.errors import TaskSpecError
from moestab.text import shown

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
GRAMMAR = "NAME or NAME:KEY=VALUE[,KEY=VALUE...], e.g. 'reverse:length=6'"


def parse_task_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``"sort:length=4-8,alphabet=abcd"`` into ``("sort", {"length": "4-8", "alphabet": "abcd"})``.

    Values stay strings; each task parameter parses its own. Raises ``TaskSpecError`` on a malformed spec.
    """
    return parse_spec(spec, "task", GRAMMAR)


def parse_spec(spec: str, kind: str, grammar: str) -> tuple[str, dict[str, str]]:
    """:func:`parse_task_spec` for any ``NAME:KEY=VALUE,...`` spec (e.g. ``--model embedded:layers=8``);
    ``kind`` and ``grammar`` word the errors."""
    if not isinstance(spec, str):
        raise TaskSpecError(f"{kind} spec must be a string, got {type(spec).__name__}; expected {grammar}")
    name, colon, rest = spec.partition(":")
    name = name.strip()
    if not _IDENTIFIER.fullmatch(name):
        what = "is empty" if not name else f"has an invalid task name {shown(name)}"
        raise TaskSpecError(f"{kind} spec {shown(spec)} {what}; expected {grammar}")
    params: dict[str, str] = {}
    if not colon:
        return name, params
    if not rest.strip():
        raise TaskSpecError(f"{kind} spec {shown(spec)} has ':' but no parameters; expected {grammar}")
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq:
            raise TaskSpecError(f"{kind} spec {shown(spec)}: parameter {shown(item.strip())} has no '='; expected "
                                "KEY=VALUE")
        if not _IDENTIFIER.fullmatch(key):
            raise TaskSpecError(f"{kind} spec {shown(spec)}: invalid parameter name {shown(key)} in "
                                f"{shown(item.strip())}")
        if not value:
            raise TaskSpecError(f"{kind} spec {shown(spec)}: parameter {key!r} has an empty value")
        if key in params:
            raise TaskSpecError(f"{kind} spec {shown(spec)}: parameter {key!r} is given twice")
        params[key] = value
    return name, params


def format_task_spec(name: str, params: Mapping[str, str]) -> str:
    """Inverse of ``parse_task_spec``: ``format_task_spec("reverse", {"length": "6"}) == "reverse:length=6"``.

    Raises ``TaskSpecError`` when a value cannot be written in the grammar (empty, contains ``,``, or has
    surrounding whitespace, which parsing would drop).
    """
    if not _IDENTIFIER.fullmatch(name):
        raise TaskSpecError(f"invalid task name {name!r}; names match {_IDENTIFIER.pattern}")
    items = []
    for key, value in params.items():
        if not _IDENTIFIER.fullmatch(key):
            raise TaskSpecError(f"invalid parameter name {key!r}; names match {_IDENTIFIER.pattern}")
        if not isinstance(value, str) or not value or "," in value or value != value.strip():
            raise TaskSpecError(
                f"parameter {key}={value!r} cannot be written in a task spec: values are non-empty strings "
                "without ',' or surrounding whitespace"
            )
        items.append(f"{key}={value}")
    return f"{name}:{','.join(items)}" if items else name
