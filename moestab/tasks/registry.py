"""Task registry: names -> task classes, ``make_task`` and ``task_from_spec``.

Besides its own parameters every task accepts ``reward=TARGET``, which keeps the task's prompts and eval
set and scores completions with a user function instead (``moestab.tasks.user_reward``).
"""

from __future__ import annotations

import shlex
from types import MappingProxyType
from typing import Any

from moestab.tasks.arithmetic import ArithmeticTask
from moestab.tasks.base import Task
from moestab.tasks.errors import TaskSpecError
from moestab.tasks.jsonl import JsonlTask
from moestab.tasks.params import ParamInfo, ParamSpec, declared_params, nonempty_text
from moestab.tasks.spec import parse_task_spec
from moestab.tasks.symbols import ReverseTask, SortTask
from moestab.tasks.user_reward import TARGET_FORMS, UserRewardTask
from moestab.text import shown

TASKS: MappingProxyType[str, type[Task]] = MappingProxyType(
    {cls.name: cls for cls in (ArithmeticTask, ReverseTask, SortTask, JsonlTask)}
)
"""Read-only map of task name -> class; ``list(TASKS)`` are the valid names."""
DEFAULT_TASK = "arithmetic"

REWARD_PARAM = ParamSpec(
    "reward",
    ParamInfo(parse=nonempty_text, valid=TARGET_FORMS, doc="score completions with a user function"),
    None,
)


def task_params(name: str) -> list[ParamSpec]:
    """Parameters accepted by task ``name``, ``reward`` last."""
    return [*declared_params(_task_class(name)), REWARD_PARAM]


def make_task(name: str, **params: Any) -> Task:
    """Build task ``name``; ``params`` may be Python values or spec strings (``length="4-8"``).

    Raises ``TaskSpecError`` (a ``ValueError``) for an unknown name or parameter, a missing required
    parameter or an invalid value, listing what is valid; ``TaskDataError`` / ``RewardFunctionError`` for
    bad data files and reward functions.
    """
    cls = _task_class(name)
    accepted = task_params(name)
    names = {spec.name for spec in accepted}
    unknown = [key for key in params if key not in names]
    if unknown:
        raise TaskSpecError(
            f"task {name!r} has no parameter {', '.join(map(shown, unknown))}; valid parameters: "
            + ", ".join(spec.describe() for spec in accepted)
        )
    missing = [spec for spec in accepted if spec.required and spec.name not in params]
    if missing:
        raise TaskSpecError(
            f"task {name!r} needs parameter {', '.join(spec.describe() for spec in missing)}, "
            f"e.g. '{name}:{missing[0].name}=...'"
        )
    reward = params.pop("reward", None)
    task = cls(**params)
    if reward is None:
        return task
    try:
        function = nonempty_text(reward)
    except ValueError as exc:
        raise TaskSpecError(f"task {name!r}: invalid reward={shown(reward)}: {exc}; valid: {TARGET_FORMS}") from None
    return UserRewardTask(task, function)


def task_from_spec(spec: str) -> Task:
    """Build a task from a CLI spec string, e.g. ``"sort:length=4-8"`` (grammar: ``moestab.tasks.spec``)."""
    name, params = parse_task_spec(spec)
    return make_task(name, **params)


def refuse_code_named_by(spec: str, source: str, flag: str = "--task") -> None:
    """:class:`TaskSpecError` when task ``spec``, read from ``source`` (a run folder's run.json), names a reward
    function (``reward=``): importing it would run code that only a file of a run folder asked for, and runs folders
    are shared. The user allows it by stating the same spec on the command line (``flag``)."""
    _, params = parse_task_spec(spec)
    target = params.get("reward")
    if target is not None:
        raise TaskSpecError(
            f"{source} names the reward function {shown(target)} (task {shown(spec)}); moestab does not import code "
            f"that a run folder names, since runs folders may be shared. If you trust that file, say so on the "
            f"command line: {flag} {shlex.quote(spec)}"
        )


def describe_task(name: str) -> str:
    """Multi-line help of task ``name``: its docstring summary and parameters with valid values."""
    cls = _task_class(name)
    summary = (cls.__doc__ or "").strip().splitlines()[0].replace("``", "")
    lines = [f"{name}: {summary}"]
    lines += [f"  {spec.describe()}: {spec.info.doc}" for spec in task_params(name)]
    return "\n".join(lines)


def describe_tasks() -> str:
    """Help of every registered task, for ``--help`` texts and error messages."""
    return "\n".join(describe_task(name) for name in TASKS)


def _task_class(name: str) -> type[Task]:
    if name not in TASKS:
        raise TaskSpecError(f"unknown task {shown(name)}; valid tasks: {', '.join(TASKS)}")
    return TASKS[name]
