"""``arithmetic``: integer addition / subtraction, e.g. prompt ``"37+45="`` answer ``"82"``."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from moestab.tasks.base import Example
from moestab.tasks.errors import TaskSpecError
from moestab.tasks.generated import GeneratedTask
from moestab.tasks.params import boolean, format_boolean, integer, param, resolve_params

OPERATIONS = "+-"


def _operations(raw: Any) -> str:
    if not isinstance(raw, str) or not raw:
        raise ValueError("expected a non-empty string of operation symbols")
    bad = sorted(set(raw) - set(OPERATIONS))
    if bad:
        raise ValueError(f"unknown operation(s) {', '.join(map(repr, bad))}")
    if len(set(raw)) != len(raw):
        raise ValueError("an operation is repeated")
    return raw


@dataclass(frozen=True)
class ArithmeticTask(GeneratedTask):
    """Integer addition / subtraction: prompt ``"37+45="``, answer ``"82"``.

    Operands are uniform in ``[0, 10**digits - 1]``, the operation uniform among ``ops``.
    The default (2 digits, ``+``) is learnable by a 4-layer character model: a short supervised warm start
    gets part of the sums right (mostly those without carries) and leaves RL room to improve.
    """

    name: ClassVar[str] = "arithmetic"

    digits: int = param(2, parse=integer(1, 6), valid="integer 1-6", doc="maximum number of digits per operand")
    """Operands are drawn uniformly from 0 to ``10**digits - 1``."""
    ops: str = param(
        "+",
        parse=_operations,
        valid="non-empty string of distinct symbols from '+-', e.g. '+' or '+-'",
        doc="operations to draw from, uniformly",
    )
    """Symbols of the operations, each drawn with equal probability."""
    negative: bool = param(
        False,
        parse=boolean,
        format=format_boolean,
        valid="true or false",
        doc="allow negative differences; if false, a - b is drawn with a >= b",
    )
    """Whether subtraction may give a negative answer (written ``"-8"``)."""

    def __post_init__(self) -> None:
        resolve_params(self)
        if self.negative and "-" not in self.ops:
            raise TaskSpecError(
                f"task 'arithmetic': negative=true needs '-' in ops (ops={self.ops!r}); "
                "valid: ops containing '-', or negative=false"
            )

    def draw(self, rng: random.Random) -> Example:
        op = rng.choice(self.ops)
        top = 10**self.digits - 1
        a, b = rng.randint(0, top), rng.randint(0, top)
        if op == "-" and not self.negative and a < b:
            a, b = b, a
        result = a + b if op == "+" else a - b
        return Example(prompt=f"{a}{op}{b}=", answer=str(result), metadata={"a": a, "b": b, "op": op})

    @property
    def space_size(self) -> int:
        return len(self.ops) * 10 ** (2 * self.digits)

    @property
    def max_answer_chars(self) -> int:
        top = 10**self.digits - 1
        extremes = {"+": [2 * top], "-": [top, -top] if self.negative else [top]}
        return max(len(str(value)) for op in self.ops for value in extremes[op])

    @property
    def max_prompt_chars(self) -> int:
        return 2 * self.digits + 2  # two operands, the operation and "="
