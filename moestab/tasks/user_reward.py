"""User reward functions: ``fn(prompt: str, completion: str, answer: str) -> float`` over any prompt source.

The function is named by ``"module.path:function"`` (an importable dotted module) or
``"path/to/file.py:function"`` (a file, imported under a private module name; its directory is not put
on ``sys.path``). It receives the raw completion (special tokens removed, cut at ``<eos>``), not the
extracted answer, so it decides how to parse it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import numbers
import random
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moestab.tasks.base import Example, Task
from moestab.tasks.errors import RewardFunctionError
from moestab.tasks.spec import format_task_spec, parse_task_spec

RewardFunction = Callable[[str, str, str], Any]
TARGET_FORMS = "'package.module:function' or 'path/to/file.py:function'"


def _is_file_target(module_part: str) -> bool:
    return module_part.endswith(".py") or "/" in module_part or "\\" in module_part


def load_reward_function(target: str) -> RewardFunction:
    """Import the function named by ``target`` and check it can be called with 3 positional arguments.

    Raises ``RewardFunctionError`` when the target is malformed, the module cannot be imported (or raises
    while importing), the attribute is missing, it is not callable, or its signature does not accept
    ``(prompt, completion, answer)``.
    """
    if not isinstance(target, str) or ":" not in target:
        raise RewardFunctionError(f"reward function {target!r} must be written as {TARGET_FORMS}")
    module_part, _, attribute = target.rpartition(":")
    if not module_part or not attribute.isidentifier():
        raise RewardFunctionError(f"reward function {target!r} must be written as {TARGET_FORMS}")
    module = _import_file(module_part, target) if _is_file_target(module_part) else _import_dotted(module_part, target)
    if not hasattr(module, attribute):
        available = sorted(name for name, value in vars(module).items() if callable(value) and not name.startswith("_"))
        raise RewardFunctionError(
            f"reward function {target!r}: module {module_part!r} has no attribute {attribute!r}; "
            f"public callables there: {', '.join(available) or 'none'}"
        )
    function = getattr(module, attribute)
    if not callable(function):
        raise RewardFunctionError(
            f"reward function {target!r}: {attribute} = {function!r:.60} ({type(function).__name__}) is not "
            "callable; expected fn(prompt, completion, answer) -> float"
        )
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # some builtins have no signature; the first call will tell
        signature = None
    if signature is not None:
        try:
            signature.bind("prompt", "completion", "answer")
        except TypeError as exc:
            raise RewardFunctionError(
                f"reward function {target!r}: {attribute}{signature} cannot be called as "
                f"fn(prompt, completion, answer) ({exc})"
            ) from None
    return function


def _import_dotted(module_name: str, target: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise RewardFunctionError(
            f"reward function {target!r}: cannot import module {module_name!r} ({exc}); give an importable "
            f"module (on sys.path) or a file path, as {TARGET_FORMS}"
        ) from None
    except Exception as exc:
        raise RewardFunctionError(
            f"reward function {target!r}: importing module {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc


def _import_file(file_name: str, target: str) -> Any:
    path = Path(file_name)
    if not path.is_file():
        raise RewardFunctionError(
            f"reward function {target!r}: file {file_name!r} does not exist (resolved to {str(path.resolve())!r})"
        )
    # A private, path-derived module name, registered in sys.modules so dataclasses etc. in it work.
    resolved = str(path.resolve())
    module_name = f"_moestab_user_reward_{path.stem}_{zlib.crc32(resolved.encode()):08x}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise RewardFunctionError(f"reward function {target!r}: {file_name!r} cannot be imported as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise RewardFunctionError(
            f"reward function {target!r}: importing {file_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    return module


def call_reward_function(function: RewardFunction, target: str, example: Example, completion: str) -> float:
    """``function(prompt, completion, answer)`` as a finite float; ``RewardFunctionError`` otherwise."""
    try:
        value = function(example.prompt, completion, example.answer)
    except Exception as exc:
        raise RewardFunctionError(
            f"reward function {target!r} raised {type(exc).__name__} on prompt {example.prompt!r}: {exc}"
        ) from exc
    if not isinstance(value, numbers.Real):
        raise RewardFunctionError(
            f"reward function {target!r} returned {type(value).__name__} {value!r:.80} on prompt "
            f"{example.prompt!r}; it must return a float (int and bool are accepted)"
        )
    reward = float(value)
    if not math.isfinite(reward):
        raise RewardFunctionError(
            f"reward function {target!r} returned {reward} on prompt {example.prompt!r}; rewards must be finite"
        )
    return reward


@dataclass(frozen=True)
class UserRewardTask(Task):
    """Prompts of ``source``, rewarded by a user function; built by the ``reward=`` spec parameter.

    ``is_correct`` is ``reward >= 1.0``, matching the trainer's "accuracy = reward 1" metric.
    """

    source: Task
    """The task that supplies prompts, answers and the eval set."""
    function: str
    """``"module.path:function"`` or ``"path/to/file.py:function"``."""
    _function: RewardFunction = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.source, UserRewardTask):
            raise RewardFunctionError("a task can have only one reward function; its source already has one")
        object.__setattr__(self, "_function", load_reward_function(self.function))

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.source.name

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        return self.source.sample(n, rng)

    def eval_set(self, n: int, seed: int) -> list[Example]:
        return self.source.eval_set(n, seed)

    @property
    def held_out(self) -> bool:
        return self.source.held_out

    @property
    def max_answer_chars(self) -> int:
        return self.source.max_answer_chars

    @property
    def max_prompt_chars(self) -> int:
        return self.source.max_prompt_chars

    def reward(self, example: Example, completion: str) -> float:
        return call_reward_function(self._function, self.function, example, completion)

    def is_correct(self, example: Example, completion: str) -> bool:
        return self.reward(example, completion) >= 1.0

    @property
    def params(self) -> dict[str, Any]:
        return {**self.source.params, "reward": self.function}

    @property
    def spec(self) -> str:
        name, params = parse_task_spec(self.source.spec)
        return format_task_spec(name, {**params, "reward": self.function})
