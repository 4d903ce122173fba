"""Symbol-sequence tasks whose answer length is a parameter, for response-length studies.

``reverse``: prompt ``"rev abcd="`` answer ``"dcba"``. ``sort``: prompt ``"sort dbca="`` answer ``"abcd"``
(ordered by position in ``alphabet``). Symbols are drawn uniformly with replacement; the length is fixed
(``length=6``) or uniform over an inclusive range (``length=4-8``). The answer has exactly as many
characters as the sequence, so ``length`` sets the response length.
"""

from __future__ import annotations

import random
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from moestab.charset import CHARSET
from moestab.tasks.base import Example
from moestab.tasks.charset import describe_characters
from moestab.tasks.generated import GeneratedTask
from moestab.tasks.params import format_integer_range, integer_range, param, resolve_params

MAX_LENGTH = 128
# Whitespace would be stripped from answers, '=' ends the prompt and ',' separates spec parameters.
_FORBIDDEN_SYMBOLS = frozenset(" \n=,")
_ALPHABET_VALID = f"2-{len(CHARSET)} distinct characters of the tokenizer charset, without space, newline, '=' or ','"


def _alphabet(raw: Any) -> str:
    if not isinstance(raw, str):
        raise ValueError(f"expected a string, got {type(raw).__name__}")
    if len(set(raw)) < 2:
        raise ValueError("needs at least 2 distinct symbols")
    if len(set(raw)) != len(raw):
        raise ValueError("a symbol is repeated")
    bad = (set(raw) - set(CHARSET)) | (set(raw) & _FORBIDDEN_SYMBOLS)
    if bad:
        raise ValueError(f"symbols not allowed: {describe_characters(bad)}")
    return raw


def _length_param() -> Any:
    return param(
        (5, 5),
        parse=integer_range(1, MAX_LENGTH),
        format=format_integer_range,
        valid=f"integer 1-{MAX_LENGTH}, or an inclusive range LO-HI such as 4-8",
        doc="sequence (and answer) length, fixed or drawn uniformly from a range",
    )


def _alphabet_param() -> Any:
    return param("abcdefgh", parse=_alphabet, valid=_ALPHABET_VALID, doc="symbols the sequences are drawn from")


@dataclass(frozen=True)
class _SymbolSequenceTask(GeneratedTask):
    """Shared parameters and sampling of ``reverse`` and ``sort``; subclasses set the prompt and answer."""

    prefix: ClassVar[str]  # prompt is f"{prefix} {sequence}="

    length: tuple[int, int] = _length_param()
    """``(low, high)`` inclusive; ``length=6`` is ``(6, 6)``."""
    alphabet: str = _alphabet_param()
    """Symbols drawn uniformly with replacement."""

    def __post_init__(self) -> None:
        resolve_params(self)

    @abstractmethod
    def transform(self, sequence: str) -> str:
        """The answer to ``sequence``."""

    def draw(self, rng: random.Random) -> Example:
        size = rng.randint(*self.length)
        sequence = "".join(rng.choices(self.alphabet, k=size))
        return Example(prompt=f"{self.prefix} {sequence}=", answer=self.transform(sequence), metadata={"length": size})

    @property
    def space_size(self) -> int:
        low, high = self.length
        return sum(len(self.alphabet) ** size for size in range(low, high + 1))

    @property
    def max_answer_chars(self) -> int:
        return self.length[1]

    @property
    def max_prompt_chars(self) -> int:
        return len(self.prefix) + self.length[1] + 2  # prefix, space, sequence, "="


@dataclass(frozen=True)
class ReverseTask(_SymbolSequenceTask):
    """The sequence backwards: prompt ``"rev abcd="``, answer ``"dcba"``."""

    name: ClassVar[str] = "reverse"
    prefix: ClassVar[str] = "rev"

    def transform(self, sequence: str) -> str:
        return sequence[::-1]


@dataclass(frozen=True)
class SortTask(_SymbolSequenceTask):
    """The symbols in ``alphabet`` order: prompt ``"sort dbca="``, answer ``"abcd"``."""

    name: ClassVar[str] = "sort"
    prefix: ClassVar[str] = "sort"

    def transform(self, sequence: str) -> str:
        return "".join(sorted(sequence, key=self.alphabet.index))
