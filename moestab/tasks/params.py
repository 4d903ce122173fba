"""Task parameters: dataclass fields that parse both Python values and the strings of a CLI spec.

A task is a frozen dataclass; each parameter is declared with ``param(...)``, which records how to
parse it, its valid range (quoted in errors) and a one-line doc. ``resolve_params`` (called from the
task's ``__post_init__``) replaces every raw value by its parsed form, so ``ReverseTask(length="4-8")``
and ``ReverseTask(length=(4, 8))`` build the same task.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass
from typing import Any

from moestab.tasks.errors import TaskSpecError
from moestab.text import shown

_PARAM_KEY = "moestab.tasks.param"


@dataclass(frozen=True)
class ParamInfo:
    """How one task parameter is parsed, described and written back into a spec string."""

    parse: Callable[[Any], Any]
    """Raw value (a Python value or a spec string) -> parsed value; raises ``ValueError`` with a reason."""
    valid: str
    """Human-readable valid values, e.g. ``"integer 1-6"``; quoted in every error about the parameter."""
    doc: str
    """One line on what the parameter does."""
    format: Callable[[Any], str] = str
    """Parsed value -> spec string; ``parse(format(v)) == v``."""


def param(
    default: Any = MISSING,
    *,
    parse: Callable[[Any], Any],
    valid: str,
    doc: str,
    format: Callable[[Any], str] = str,
) -> Any:
    """Declare a task parameter (a dataclass field); leave ``default`` out for a required one."""
    info = ParamInfo(parse=parse, valid=valid, doc=doc, format=format)
    return dataclasses.field(default=default, metadata={_PARAM_KEY: info})


@dataclass(frozen=True)
class ParamSpec:
    """A declared parameter of a task class, as listed in errors and in ``describe_task``."""

    name: str
    info: ParamInfo
    default: Any  # dataclasses.MISSING when required

    @property
    def required(self) -> bool:
        return self.default is MISSING

    def describe(self) -> str:
        """``length (integer 1-128 or a range LO-HI; default 5)``."""
        default = "required" if self.required else f"default {self.format(self.default)}"
        return f"{self.name} ({self.info.valid}; {default})"

    def format(self, value: Any) -> str:
        return "none" if value is None else self.info.format(value)


def declared_params(task_cls: type) -> list[ParamSpec]:
    """The parameters a task class declares with ``param``, in declaration order."""
    if not dataclasses.is_dataclass(task_cls):
        return []
    return [
        ParamSpec(f.name, f.metadata[_PARAM_KEY], f.default)
        for f in dataclasses.fields(task_cls)
        if _PARAM_KEY in f.metadata
    ]


def resolve_params(task: Any) -> None:
    """Parse every declared parameter of the (frozen dataclass) ``task`` in place."""
    for spec in declared_params(type(task)):
        raw = getattr(task, spec.name)
        try:
            value = spec.info.parse(raw)
        except (ValueError, TypeError) as exc:
            raise TaskSpecError(
                f"task {task.name!r}: invalid {spec.name}={shown(raw)}: {exc}; valid: {spec.info.valid}"
            ) from None
        object.__setattr__(task, spec.name, value)


def iter_param_values(task: Any) -> Iterator[tuple[ParamSpec, Any]]:
    """(parameter, current value) pairs of ``task``."""
    for spec in declared_params(type(task)):
        yield spec, getattr(task, spec.name)


# ---- parsers: each takes a Python value or a spec string and raises ValueError with a reason ----


def integer(lo: int, hi: int) -> Callable[[Any], int]:
    """Parser of an integer in ``[lo, hi]``; accepts ``int`` or a decimal string (not ``bool``)."""

    def parse(raw: Any) -> int:
        value = _to_int(raw)
        if not lo <= value <= hi:
            raise ValueError(f"{shown(value)} is out of range")
        return value

    return parse


def integer_range(lo: int, hi: int) -> Callable[[Any], tuple[int, int]]:
    """Parser of a fixed value or inclusive range in ``[lo, hi]``: ``6``, ``"6"``, ``"4-8"``, ``(4, 8)``.

    Always returns a ``(low, high)`` tuple; a fixed value ``6`` becomes ``(6, 6)``.
    """

    def parse(raw: Any) -> tuple[int, int]:
        cut = raw.strip().find("-", 1) if isinstance(raw, str) else -1  # a leading '-' is a sign: "-3" is one value
        if cut > 0:
            pair = (_to_int(raw.strip()[:cut]), _to_int(raw.strip()[cut + 1 :]))
        elif isinstance(raw, (tuple, list)):
            if len(raw) != 2:
                raise ValueError(f"a range has 2 ends, got {len(raw)} values")
            pair = (_to_int(raw[0]), _to_int(raw[1]))
        else:
            value = _to_int(raw)
            pair = (value, value)
        if pair[0] > pair[1]:
            raise ValueError(f"range {shown(pair[0])}-{shown(pair[1])} is empty (low > high)")
        if pair[0] < lo or pair[1] > hi:
            raise ValueError("out of range")
        return pair

    return parse


def format_integer_range(pair: tuple[int, int]) -> str:
    """``(6, 6)`` -> ``"6"``, ``(4, 8)`` -> ``"4-8"``."""
    return str(pair[0]) if pair[0] == pair[1] else f"{pair[0]}-{pair[1]}"


def real(lo: float, hi: float, *, hi_open: bool = False) -> Callable[[Any], float]:
    """Parser of a finite float in ``[lo, hi]`` (``[lo, hi)`` with ``hi_open``); accepts numbers or strings."""

    def parse(raw: Any) -> float:
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            raise ValueError(f"expected a number, got {type(raw).__name__}")
        try:
            value = float(raw)
        except ValueError:
            raise ValueError("not a number") from None
        if not math.isfinite(value):
            raise ValueError("not finite")
        if value < lo or value > hi or (hi_open and value == hi):
            raise ValueError("out of range")
        return value

    return parse


_TRUE = ("true", "yes", "1", "on")
_FALSE = ("false", "no", "0", "off")


def boolean(raw: Any) -> bool:
    """Parser of a flag: ``bool`` or one of true/false, yes/no, 1/0, on/off (any case)."""
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in _TRUE + _FALSE:
        return raw.strip().lower() in _TRUE
    raise ValueError("not a boolean")


def format_boolean(value: bool) -> str:
    return "true" if value else "false"


def choice(*options: str) -> Callable[[Any], str]:
    """Parser of one of ``options`` (exact string)."""

    def parse(raw: Any) -> str:
        if not isinstance(raw, str) or raw.strip() not in options:
            raise ValueError("not one of the options")
        return raw.strip()

    return parse


def nonempty_text(raw: Any) -> str:
    """Parser of a non-empty string (``os.PathLike`` accepted and turned into ``str``)."""
    if hasattr(raw, "__fspath__"):
        raw = str(raw.__fspath__())
    if not isinstance(raw, str):
        raise ValueError(f"expected a string, got {type(raw).__name__}")
    if not raw.strip():
        raise ValueError("empty")
    return raw.strip()


def _to_int(raw: Any) -> int:
    if isinstance(raw, bool):
        raise ValueError("expected an integer, got a bool")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        try:
            return int(raw.strip())
        except ValueError:
            raise ValueError(f"{shown(raw.strip())} is not an integer") from None
    raise ValueError(f"expected an integer, got {type(raw).__name__}")
