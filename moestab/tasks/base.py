"""``Example``, the ``Task`` interface, and how a completion is read as an answer.

Completion parsing, shared by every answer-matching task (``extract_answer``): the completion is the
decoded response with special tokens removed, cut by the trainer at the first ``<eos>``. Its answer is
the text up to the first newline after leading whitespace, stripped of surrounding whitespace. So
``" 82\\n17+3="`` answers ``"82"`` (junk after a newline is ignored), while ``"82 junk"`` and ``"821"``
answer ``"82 junk"`` and ``"821"`` (wrong): the model must stop with ``<eos>`` or a newline.
"""

from __future__ import annotations

import random
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, ClassVar

from moestab.tasks.errors import TaskError
from moestab.tasks.params import iter_param_values
from moestab.tasks.spec import format_task_spec


@dataclass(frozen=True)
class Example:
    """One prompt with its reference answer; the warm start trains on ``prompt + answer + <eos>``."""

    prompt: str
    """Text the model is conditioned on, e.g. ``"37+45="``."""
    answer: str
    """Reference answer, single-line and without surrounding whitespace, e.g. ``"82"``."""
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """Task-specific facts (operands, length, source line); compared by ``==`` but not hashed."""

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str) or not isinstance(self.answer, str):
            raise TypeError(
                f"Example prompt and answer must be str, got {type(self.prompt).__name__} "
                f"and {type(self.answer).__name__}"
            )


def extract_answer(completion: str) -> str:
    """The answer a completion gives: its first non-blank line, stripped (see the module docstring)."""
    return completion.strip().split("\n", 1)[0].strip()


# A plain decimal number: optional sign, digits with an optional fraction, optional exponent. Stricter than
# float(): no "nan", "inf", "1_000" or hex.
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def parse_number(text: str) -> Fraction | None:
    """``text`` as an exact number (``"0.1"`` -> ``Fraction(1, 10)``), or ``None`` if it is not a number."""
    text = text.strip()
    if not _NUMBER.fullmatch(text):
        return None
    return Fraction(text)


def check_count(n: int) -> None:
    """Raise ``TaskError`` unless ``n`` is a non-negative int (a number of examples to return)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise TaskError(f"number of examples must be a non-negative int, got {n!r}")


class Task(ABC):
    """A source of prompts with a verifiable reward; see docs/tasks.md.

    Subclasses are frozen dataclasses whose fields are their parameters (declared with
    ``moestab.tasks.params.param``), so a task is immutable, comparable and rebuilt from ``spec``.
    """

    name: ClassVar[str]
    """Registry name, the ``NAME`` of the spec string."""

    @abstractmethod
    def sample(self, n: int, rng: random.Random) -> list[Example]:
        """``n`` training examples drawn with ``rng`` only (same RNG state -> same examples)."""

    @abstractmethod
    def eval_set(self, n: int, seed: int) -> list[Example]:
        """A fixed held-out set: the same ``(n, seed)`` always gives the same examples.

        Returns ``n`` examples, or fewer when the task has fewer held-out examples (a data file).
        Disjoint from what ``sample`` returns when ``held_out`` is true.
        """

    @property
    @abstractmethod
    def max_answer_chars(self) -> int:
        """Longest reference answer in characters (= tokens); the trainer bounds ``max_new_tokens`` by it."""

    @property
    @abstractmethod
    def max_prompt_chars(self) -> int:
        """Longest prompt in characters (= tokens)."""

    @property
    def held_out(self) -> bool:
        """Whether ``eval_set`` prompts never appear in ``sample`` (false for tiny problem spaces)."""
        return True

    def is_correct(self, example: Example, completion: str) -> bool:
        """Whether ``completion`` answers ``example``: by default ``extract_answer`` equals the answer."""
        return extract_answer(completion) == example.answer

    def reward(self, example: Example, completion: str) -> float:
        """1.0 when ``is_correct``, else 0.0 (tasks with partial credit override this)."""
        return 1.0 if self.is_correct(example, completion) else 0.0

    @property
    def params(self) -> dict[str, Any]:
        """Every parameter with its resolved value (defaults included), for run.json."""
        return {spec.name: value for spec, value in iter_param_values(self)}

    @property
    def spec(self) -> str:
        """Canonical spec string: ``task_from_spec(task.spec) == task``; default-valued parameters left out."""
        explicit = {spec.name: spec.format(value) for spec, value in iter_param_values(self) if value != spec.default}
        return format_task_spec(self.name, explicit)
