"""User reward functions loaded from a file or a dotted module, wrapping embedded and jsonl tasks."""

import json
import random
import sys
import textwrap

import pytest

from moestab.tasks import (
    ArithmeticTask,
    RewardFunctionError,
    TaskSpecError,
    UserRewardTask,
    load_reward_function,
    make_task,
    task_from_spec,
)

REWARDS = '''
import math

def partial(prompt, completion, answer):
    """Fraction of answer characters matched position by position."""
    given = completion.strip().split("\\n")[0]
    return sum(a == b for a, b in zip(given, answer)) / len(answer)

def length_bonus(prompt, completion, answer, scale=1.0):
    return scale * len(completion)

def as_string(prompt, completion, answer):
    return "1.0"

def as_nan(prompt, completion, answer):
    return math.nan

def as_bool(prompt, completion, answer):
    return completion == answer

def boom(prompt, completion, answer):
    raise KeyError("no such thing")

def two_args(prompt, completion):
    return 0.0

NOT_CALLABLE = 3
'''


@pytest.fixture
def rewards_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(REWARDS)
    return path


def test_file_reward_wraps_an_embedded_task(rewards_file):
    task = make_task("arithmetic", reward=f"{rewards_file}:partial")
    assert isinstance(task, UserRewardTask)
    assert task.name == "arithmetic"
    source = ArithmeticTask()
    assert task.sample(20, random.Random(1)) == source.sample(20, random.Random(1))  # prompts unchanged
    assert task.eval_set(20, seed=2) == source.eval_set(20, seed=2)
    assert (task.max_answer_chars, task.held_out) == (source.max_answer_chars, True)
    example = task.sample(1, random.Random(0))[0]
    assert example.answer == "150"
    assert task.reward(example, "150") == 1.0
    assert task.reward(example, "159") == pytest.approx(2 / 3)  # "1","5" match, "9" != "0"
    assert task.reward(example, "  999") == 0.0
    assert task.is_correct(example, "150\njunk")  # reward 1.0 counts as correct
    assert not task.is_correct(example, "159")


def test_dotted_module_reward_and_bool_return(tmp_path, monkeypatch):
    package = tmp_path / "userpkg_for_moestab_tests"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "rewards.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        task = task_from_spec("reverse:length=3,reward=userpkg_for_moestab_tests.rewards:as_bool")
        example = task.sample(1, random.Random(0))[0]
        assert task.reward(example, example.answer) == 1.0  # True -> 1.0
        assert task.reward(example, example.answer + "\n") == 0.0  # raw completion is passed through
    finally:
        for name in [n for n in sys.modules if n.startswith("userpkg_for_moestab_tests")]:
            del sys.modules[name]


def test_reward_over_a_jsonl_source(tmp_path, rewards_file):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "say hi", "answer": "hi"}) + "\n")
    task = task_from_spec(f"jsonl:path={data},eval_fraction=0,reward={rewards_file}:length_bonus")
    (example,) = task.eval_set(1, seed=0)
    assert task.reward(example, "hello") == 5.0  # scale 1 * len("hello")
    assert task.spec == f"jsonl:path={data},eval_fraction=0.0,reward={rewards_file}:length_bonus"
    assert task.params["reward"] == f"{rewards_file}:length_bonus"
    assert task_from_spec(task.spec) == task


@pytest.mark.parametrize(
    ("function", "completion", "message"),
    [
        ("as_string", "1", "returned str '1.0' on prompt '97+53='; it must return a float"),
        ("as_nan", "1", "returned nan on prompt '97+53='; rewards must be finite"),
        ("boom", "1", "raised KeyError on prompt '97+53=': 'no such thing'"),
    ],
)
def test_bad_returns_raise_at_call(rewards_file, function, completion, message):
    task = make_task("arithmetic", reward=f"{rewards_file}:{function}")
    example = task.sample(1, random.Random(0))[0]
    with pytest.raises(RewardFunctionError) as info:
        task.reward(example, completion)
    assert message in str(info.value)
    assert f"reward function '{rewards_file}:{function}'" in str(info.value)


def test_load_errors(tmp_path, rewards_file):
    cases = [
        ("no_colon_here", "must be written as 'package.module:function' or 'path/to/file.py:function'"),
        (f"{rewards_file}:", "must be written as"),
        (f"{tmp_path / 'missing.py'}:f", "file '" + str(tmp_path / "missing.py") + "' does not exist"),
        ("moestab_no_such_module_xyz:f", "cannot import module 'moestab_no_such_module_xyz' (No module named"),
        (f"{rewards_file}:nope", "has no attribute 'nope'; public callables there: as_bool, as_nan, as_string"),
        (f"{rewards_file}:NOT_CALLABLE", "NOT_CALLABLE = 3 (int) is not callable"),
        (f"{rewards_file}:two_args", "two_args(prompt, completion) cannot be called as fn(prompt, completion, answer)"),
        ("math:pi", "pi = 3.14159"),
    ]
    for target, message in cases:
        with pytest.raises(RewardFunctionError) as info:
            load_reward_function(target)
        assert message in str(info.value), target


def test_import_error_inside_the_file(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import moestab_no_such_dependency\n")
    with pytest.raises(RewardFunctionError, match=r"importing '.*broken\.py' raised ModuleNotFoundError"):
        make_task("sort", reward=f"{broken}:f")


def test_reward_parameter_validation(rewards_file):
    with pytest.raises(TaskSpecError, match=r"invalid reward=3: expected a string, got int; valid: 'package"):
        make_task("arithmetic", reward=3)
    with pytest.raises(RewardFunctionError, match="only one reward function"):
        UserRewardTask(make_task("arithmetic", reward=f"{rewards_file}:partial"), f"{rewards_file}:partial")


def test_file_module_can_define_dataclasses(tmp_path):
    path = tmp_path / "dc.py"
    path.write_text(
        textwrap.dedent(
            """
            from dataclasses import dataclass

            @dataclass
            class Scale:
                factor: float = 0.5

            def score(prompt, completion, answer):
                return Scale().factor
            """
        )
    )
    task = make_task("arithmetic", reward=f"{path}:score")
    assert task.reward(task.sample(1, random.Random(0))[0], "x") == 0.5
