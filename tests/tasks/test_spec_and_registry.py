"""Spec strings: parsing, formatting, round trips through tasks; registry errors."""

import pytest

from moestab.tasks import (
    DEFAULT_TASK,
    TASKS,
    ArithmeticTask,
    ReverseTask,
    SortTask,
    TaskSpecError,
    describe_tasks,
    format_task_spec,
    make_task,
    parse_task_spec,
    task_from_spec,
    task_params,
)


@pytest.mark.parametrize(
    ("spec", "name", "params"),
    [
        ("arithmetic", "arithmetic", {}),
        ("  reverse : length = 6 ", "reverse", {"length": "6"}),
        ("sort:length=4-8,alphabet=abcd", "sort", {"length": "4-8", "alphabet": "abcd"}),
        ("jsonl:path=data.jsonl,match=numeric", "jsonl", {"path": "data.jsonl", "match": "numeric"}),
        # only the first ':' and the first '=' of a parameter split
        ("jsonl:path=C:/d/x.jsonl,reward=r.py:score", "jsonl", {"path": "C:/d/x.jsonl", "reward": "r.py:score"}),
        ("x:k=a=b", "x", {"k": "a=b"}),
    ],
)
def test_parse_task_spec(spec, name, params):
    assert parse_task_spec(spec) == (name, params)
    assert parse_task_spec(format_task_spec(name, params)) == (name, params)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "task spec '' is empty; expected NAME or NAME:KEY=VALUE"),
        (":length=3", "task spec ':length=3' is empty"),
        ("rev erse", "has an invalid task name 'rev erse'"),
        ("reverse:", "task spec 'reverse:' has ':' but no parameters"),
        ("reverse:length", "parameter 'length' has no '='; expected KEY=VALUE"),
        ("reverse:length=6,", "parameter '' has no '='"),
        ("reverse:=6", "invalid parameter name '' in '=6'"),
        ("reverse:length=", "parameter 'length' has an empty value"),
        ("reverse:length=6,length=7", "parameter 'length' is given twice"),
    ],
)
def test_malformed_specs(spec, message):
    with pytest.raises(TaskSpecError) as info:
        parse_task_spec(spec)
    assert message in str(info.value)


def test_non_string_spec():
    with pytest.raises(TaskSpecError, match="task spec must be a string, got int"):
        parse_task_spec(3)


@pytest.mark.parametrize("value", ["a,b", "", " padded", 3])
def test_format_rejects_unwritable_values(value):
    with pytest.raises(TaskSpecError, match="cannot be written in a task spec"):
        format_task_spec("jsonl", {"path": value})


@pytest.mark.parametrize(
    ("spec", "expected", "canonical"),
    [
        ("arithmetic", ArithmeticTask(), "arithmetic"),
        ("arithmetic:digits=2,ops=+", ArithmeticTask(), "arithmetic"),  # defaults left out
        (
            "arithmetic:negative=yes,ops=-+,digits=3",
            ArithmeticTask(3, "-+", True),
            "arithmetic:digits=3,ops=-+,negative=true",
        ),
        ("reverse:length=6", ReverseTask(length=(6, 6)), "reverse:length=6"),
        ("reverse:length=6-6", ReverseTask(length=6), "reverse:length=6"),
        ("sort:length=4-8", SortTask(length=(4, 8)), "sort:length=4-8"),
        ("sort:alphabet=01", SortTask(alphabet="01"), "sort:alphabet=01"),
    ],
)
def test_spec_round_trip_through_tasks(spec, expected, canonical):
    task = task_from_spec(spec)
    assert task == expected
    assert task.spec == canonical
    assert task_from_spec(task.spec) == task


def test_jsonl_spec_round_trip(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    task = task_from_spec(f"jsonl:path={path},match=numeric,tolerance=0.5,eval_fraction=0")
    assert task.spec == f"jsonl:path={path},match=numeric,tolerance=0.5,eval_fraction=0.0"
    assert task.params == {"path": str(path), "match": "numeric", "tolerance": 0.5, "eval_fraction": 0.0}
    assert task_from_spec(task.spec) == task


def test_params_lists_every_value():
    assert ArithmeticTask().params == {"digits": 2, "ops": "+", "negative": False}
    assert SortTask(length="2-3").params == {"length": (2, 3), "alphabet": "abcdefgh"}


def test_registry_names():
    assert list(TASKS) == ["arithmetic", "reverse", "sort", "jsonl"]
    assert DEFAULT_TASK in TASKS
    with pytest.raises(TypeError):
        TASKS["mine"] = ArithmeticTask  # read-only
    for name in TASKS:
        assert f"{name}: " in describe_tasks()
    assert [p.name for p in task_params("reverse")] == ["length", "alphabet", "reward"]


def test_unknown_task_lists_valid_names():
    with pytest.raises(TaskSpecError) as info:
        task_from_spec("addition:digits=2")
    assert str(info.value) == "unknown task 'addition'; valid tasks: arithmetic, reverse, sort, jsonl"
    assert isinstance(info.value, ValueError)


def test_unknown_parameter_lists_valid_parameters_and_ranges():
    with pytest.raises(TaskSpecError) as info:
        task_from_spec("reverse:lenght=6")
    assert str(info.value) == (
        "task 'reverse' has no parameter 'lenght'; valid parameters: "
        "length (integer 1-128, or an inclusive range LO-HI such as 4-8; default 5), "
        "alphabet (2-85 distinct characters of the tokenizer charset, without space, newline, '=' or ','; "
        "default abcdefgh), "
        "reward ('package.module:function' or 'path/to/file.py:function'; default none)"
    )


def test_make_task_accepts_typed_and_string_values():
    assert make_task("reverse", length=(4, 8)) == make_task("reverse", length="4-8") == ReverseTask(length="4-8")
    assert make_task("arithmetic", digits=3, negative="false") == ArithmeticTask(digits=3)
