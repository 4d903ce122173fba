"""Verifiable-reward tasks for the RL loop: prompts, reference answers, rewards (docs/tasks.md).

Build one by name (``make_task("reverse", length=6)``) or from a CLI spec (``task_from_spec("sort:length=4-8")``).
Every task implements ``Task``: ``sample`` (training examples from an RNG), ``eval_set`` (a fixed held-out
set), ``reward`` / ``is_correct`` on a decoded completion, and ``max_answer_chars`` / ``max_prompt_chars``.
"""

from moestab.tasks.arithmetic import ArithmeticTask
from moestab.tasks.base import Example, Task, extract_answer, parse_number
from moestab.tasks.charset import check_charset
from moestab.tasks.errors import RewardFunctionError, TaskDataError, TaskError, TaskSpecError
from moestab.tasks.generated import GeneratedTask
from moestab.tasks.jsonl import JsonlTask, load_jsonl
from moestab.tasks.registry import (
    DEFAULT_TASK,
    TASKS,
    describe_task,
    describe_tasks,
    make_task,
    refuse_code_named_by,
    task_from_spec,
    task_params,
)
from moestab.tasks.spec import format_task_spec, parse_task_spec
from moestab.tasks.symbols import ReverseTask, SortTask
from moestab.tasks.user_reward import UserRewardTask, load_reward_function

__all__ = [
    "DEFAULT_TASK",
    "TASKS",
    "ArithmeticTask",
    "Example",
    "GeneratedTask",
    "JsonlTask",
    "ReverseTask",
    "RewardFunctionError",
    "SortTask",
    "Task",
    "TaskDataError",
    "TaskError",
    "TaskSpecError",
    "UserRewardTask",
    "check_charset",
    "describe_task",
    "describe_tasks",
    "extract_answer",
    "format_task_spec",
    "load_jsonl",
    "load_reward_function",
    "make_task",
    "parse_number",
    "parse_task_spec",
    "refuse_code_named_by",
    "task_from_spec",
    "task_params",
]
