"""``jsonl``: prompts and answers from a JSON-lines file, matched exactly or numerically.

Each non-blank line is an object ``{"prompt": "...", "answer": "..."}``; other keys are kept in
``Example.metadata`` together with ``"line"`` (1-based line number). The answer may be a JSON number.
The train/eval split is a property of the prompt: a row is held out when
``crc32(prompt) / 2**32 < eval_fraction``, so it does not depend on row order and duplicated prompts
always land on the same side.
"""

from __future__ import annotations

import json
import math
import os
import random
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from moestab.tasks.base import Example, Task, check_count, extract_answer, parse_number
from moestab.tasks.charset import check_charset
from moestab.tasks.errors import TaskDataError, TaskSpecError
from moestab.tasks.params import choice, nonempty_text, param, real, resolve_params

MATCH_MODES = ("exact", "numeric")
DEFAULT_TOLERANCE = 1e-6


def load_jsonl(path: str | os.PathLike[str], *, numeric: bool = False) -> list[Example]:
    """Read and validate every example of a JSON-lines file (see the module docstring).

    Raises ``TaskDataError`` naming the file and line for: a missing file, invalid UTF-8 or JSON, a line
    that is not an object, a missing key, a prompt that is not a non-empty string, an answer that is not
    a non-empty single-line string or number without surrounding whitespace, characters outside the
    tokenizer charset, a non-numeric answer when ``numeric``, and a file without examples.
    """
    file = Path(path)
    if not file.is_file():
        what = "is a directory, not a file" if file.is_dir() else "does not exist"
        raise TaskDataError(f"jsonl file {str(file)!r} {what} (resolved to {str(file.resolve())!r})")
    examples = []
    with file.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            where = f"{file} line {number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TaskDataError(f"{where}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
            if line.strip():
                examples.append(_parse_line(line, where, number, numeric=numeric))
    if not examples:
        content = "only blank lines" if file.stat().st_size else "it is empty"
        raise TaskDataError(
            f"jsonl file {str(file)!r} has no examples ({content}); "
            'expected one object {"prompt": ..., "answer": ...} per line'
        )
    return examples


def _parse_line(line: str, where: str, number: int, *, numeric: bool) -> Example:
    # Parse without the line ending: the parser skips "\r\n" as whitespace, so an error at the end of
    # a cut-off line would otherwise be placed on the "next line", at column 1. Without it, exc.pos is
    # 0-based within this line, counted in characters as an editor counts them.
    text = line.removesuffix("\n").removesuffix("\r")
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TaskDataError(f"{where}: not valid JSON ({exc.msg} at column {exc.pos + 1})") from None
    if not isinstance(row, dict):
        raise TaskDataError(f'{where}: expected a JSON object {{"prompt": ..., "answer": ...}}, got {_json_type(row)}')
    missing = [key for key in ("prompt", "answer") if key not in row]
    if missing:
        present = ", ".join(map(repr, row)) or "none"
        raise TaskDataError(f"{where}: missing key {' and '.join(map(repr, missing))} (keys present: {present})")
    prompt, answer = row.pop("prompt"), row.pop("answer")
    if not isinstance(prompt, str) or not prompt:
        got = "an empty string" if prompt == "" else _json_type(prompt)
        raise TaskDataError(f"{where}: 'prompt' must be a non-empty string, got {got}")
    answer = _answer_text(answer, where)
    check_charset(prompt, where=f"{where}: 'prompt'")
    check_charset(answer, where=f"{where}: 'answer'")
    if numeric and parse_number(answer) is None:
        raise TaskDataError(
            f"{where}: 'answer' {answer!r} is not a number, which match=numeric needs "
            "(e.g. 42, -3.5, 1e-3); use match=exact for text answers"
        )
    return Example(prompt=prompt, answer=answer, metadata={**row, "line": number})


def _answer_text(answer: Any, where: str) -> str:
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        if not math.isfinite(answer):
            raise TaskDataError(f"{where}: 'answer' must be a finite number, got {answer}")
        return repr(answer) if isinstance(answer, float) else str(answer)
    if not isinstance(answer, str):
        raise TaskDataError(f"{where}: 'answer' must be a string or a number, got {_json_type(answer)}")
    if not answer.strip():
        raise TaskDataError(f"{where}: 'answer' is empty")
    if "\n" in answer:
        raise TaskDataError(
            f"{where}: 'answer' has a newline; answers are single-line, as a completion's answer ends at "
            "its first newline"
        )
    if answer != answer.strip():
        raise TaskDataError(
            f"{where}: 'answer' {answer!r} has surrounding whitespace, which completions are stripped of, "
            "so it could never match; remove it"
        )
    return answer


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _path(raw: Any) -> str:
    path = nonempty_text(raw)
    if "," in path:  # the spec grammar separates parameters with ","; task.spec must stay writable
        raise ValueError("contains ','")
    return path


def is_eval_row(prompt: str, eval_fraction: float) -> bool:
    """Whether a row with ``prompt`` is on the eval side of a ``jsonl`` split."""
    return zlib.crc32(prompt.encode("utf-8")) / 2**32 < eval_fraction


@dataclass(frozen=True)
class JsonlTask(Task):
    """Prompts and answers of a JSON-lines file, matched exactly or as numbers.

    The file is loaded and validated once, when the task is built.
    """

    name: ClassVar[str] = "jsonl"

    path: str = param(
        parse=_path,
        valid="path of a JSON-lines file (no ',')",
        doc='file with one {"prompt": ..., "answer": ...} object per line',
    )
    """File path as given (relative paths resolve against the working directory)."""
    match: str = param(
        "exact",
        parse=choice(*MATCH_MODES),
        valid=" or ".join(MATCH_MODES),
        doc="exact: answer string equality; numeric: numbers equal within tolerance",
    )
    """How a completion's answer is compared with the reference answer."""
    tolerance: float = param(
        DEFAULT_TOLERANCE,
        parse=real(0.0, math.inf),
        valid="number >= 0 (only with match=numeric)",
        doc="absolute tolerance of match=numeric",
    )
    """Correct when ``|completion - answer| <= tolerance`` (exact rational arithmetic)."""
    eval_fraction: float = param(
        0.1,
        parse=real(0.0, 1.0, hi_open=True),
        valid="number in [0, 1)",
        doc="expected fraction of rows held out for evaluation; 0 evaluates on the training rows",
    )
    """Fraction of prompts (by hash) held out for ``eval_set``; 0 means no split (``held_out`` is false)."""

    _train: tuple[Example, ...] = field(init=False, repr=False, compare=False)
    _eval: tuple[Example, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        resolve_params(self)
        if self.match == "exact" and self.tolerance != DEFAULT_TOLERANCE:
            raise TaskSpecError(
                f"task 'jsonl': tolerance={self.tolerance} only applies to match=numeric; "
                "valid: add match=numeric, or drop tolerance"
            )
        examples = load_jsonl(self.path, numeric=self.match == "numeric")
        if self.eval_fraction == 0:
            train, held = examples, examples
        else:
            held = [ex for ex in examples if is_eval_row(ex.prompt, self.eval_fraction)]
            train = [ex for ex in examples if not is_eval_row(ex.prompt, self.eval_fraction)]
            if not held or not train:
                side = "eval" if not held else "training"
                raise TaskDataError(
                    f"jsonl file {self.path!r}: no row fell on the {side} side of the split "
                    f"({len(examples)} rows, eval_fraction={self.eval_fraction}); "
                    f"{'raise' if not held else 'lower'} eval_fraction, add rows, or set eval_fraction=0 "
                    "to evaluate on the training rows"
                )
        object.__setattr__(self, "_train", tuple(train))
        object.__setattr__(self, "_eval", tuple(held))

    @property
    def held_out(self) -> bool:
        return self.eval_fraction > 0

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        """``n`` training rows drawn uniformly with replacement."""
        check_count(n)
        return rng.choices(self._train, k=n)

    def eval_set(self, n: int, seed: int) -> list[Example]:
        """All eval rows in file order when there are at most ``n``, else ``n`` of them chosen by ``seed``."""
        check_count(n)
        if n >= len(self._eval):
            return list(self._eval)
        return random.Random(seed).sample(self._eval, n)

    def is_correct(self, example: Example, completion: str) -> bool:
        if self.match == "exact":
            return super().is_correct(example, completion)
        given = parse_number(extract_answer(completion))
        if given is None:
            return False  # not a number: a wrong answer, not an error
        expected = parse_number(example.answer)
        assert expected is not None  # checked by load_jsonl
        return abs(given - expected) <= self.tolerance

    @property
    def max_answer_chars(self) -> int:
        return max(len(ex.answer) for ex in (*self._train, *self._eval))

    @property
    def max_prompt_chars(self) -> int:
        return max(len(ex.prompt) for ex in (*self._train, *self._eval))
