"""jsonl: exact and numeric matching, the deterministic split, and every data error."""

import json
import random

import pytest

from moestab.tasks import JsonlTask, TaskDataError, TaskSpecError, load_jsonl, make_task, task_from_spec
from moestab.tasks.jsonl import is_eval_row


def write_rows(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def qa_file(tmp_path):
    rows = [{"prompt": f"{a}*{b}=", "answer": str(a * b), "level": a % 3} for a in range(10) for b in range(10)]
    return write_rows(tmp_path / "mul.jsonl", rows)


def test_exact_match(tmp_path):
    path = write_rows(tmp_path / "d.jsonl", [{"prompt": "capital of France?", "answer": "Paris"}])
    task = JsonlTask(path=str(path), eval_fraction=0)
    (example,) = task.sample(1, random.Random(0))
    assert (example.prompt, example.answer) == ("capital of France?", "Paris")
    assert example.metadata == {"line": 1}
    assert task.reward(example, "Paris") == 1.0
    assert task.reward(example, " Paris\nand more") == 1.0
    assert task.reward(example, "paris") == 0.0  # case matters
    assert task.reward(example, "Paris!") == 0.0
    assert not task.held_out
    assert task.eval_set(5, seed=0) == [example]  # fewer rows than asked: all of them
    assert task.max_answer_chars == 5
    assert task.max_prompt_chars == len("capital of France?")


def test_numeric_match_with_tolerance(tmp_path):
    rows = [{"prompt": "1/4=", "answer": 0.25}, {"prompt": "big=", "answer": 12345678901234567890}]
    path = write_rows(tmp_path / "n.jsonl", rows)
    task = make_task("jsonl", path=str(path), match="numeric", tolerance="0.01", eval_fraction=0)
    quarter, big = task.eval_set(2, seed=0)
    assert (quarter.answer, big.answer) == ("0.25", "12345678901234567890")  # JSON numbers -> text
    assert task.is_correct(quarter, "0.25")
    assert task.is_correct(quarter, "+.25\njunk")
    assert task.is_correct(quarter, "2.5e-1")
    assert task.is_correct(quarter, "0.26")  # |0.26 - 0.25| = 0.01 <= tolerance
    assert not task.is_correct(quarter, "0.2601")
    assert not task.is_correct(quarter, "0.25 apples")  # not a number: wrong, not an error
    assert task.reward(quarter, "quarter") == 0.0
    assert task.reward(quarter, "nan") == 0.0
    # Exact rational comparison: a float would round both to the same 1.2345678901234567e19.
    assert task.is_correct(big, "12345678901234567890")
    assert not task.is_correct(big, "12345678901234567891")  # off by 1 > 0.01
    exact = JsonlTask(path=str(path), eval_fraction=0)
    assert not exact.is_correct(quarter, "0.250")  # exact match compares strings


def test_split_is_deterministic_disjoint_and_by_prompt(qa_file):
    task = JsonlTask(path=str(qa_file), eval_fraction=0.3)
    evals = task.eval_set(1000, seed=0)
    assert evals == [e for e in load_jsonl(qa_file) if is_eval_row(e.prompt, 0.3)]  # all, in file order
    assert 15 <= len(evals) <= 45  # about 30 of 100
    train = task.sample(2000, random.Random(0))
    assert not {e.prompt for e in evals} & {e.prompt for e in train}
    assert len({e.prompt for e in train}) == 100 - len(evals)  # 2000 draws reach every training row
    assert task.sample(50, random.Random(4)) == task.sample(50, random.Random(4))
    subset = task.eval_set(10, seed=1)
    assert subset == task.eval_set(10, seed=1)
    assert len(subset) == 10 and set(map(id, subset)) <= set(map(id, evals))
    assert subset[0].metadata["level"] in (0, 1, 2)  # extra keys kept
    # The split does not depend on row order.
    lines = qa_file.read_text().splitlines(keepends=True)
    qa_file.write_text("".join(reversed(lines)))
    reordered = JsonlTask(path=str(qa_file), eval_fraction=0.3).eval_set(1000, seed=0)
    assert {e.prompt for e in reordered} == {e.prompt for e in evals}


def test_blank_lines_are_skipped_and_lines_counted(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_text('\n{"prompt": "a", "answer": "b"}\n   \n{"prompt": "c", "answer": "d"}\n\n')
    assert [e.metadata["line"] for e in load_jsonl(path)] == [2, 4]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "has no examples (it is empty)"),
        ("\n  \n", "has no examples (only blank lines)"),
        ('{"prompt": "a", "answer": "b"}\n{"prompt": "a" "answer": "b"}\n', "line 2: not valid JSON (Expecting ','"),
        ('["a", "b"]\n', 'line 1: expected a JSON object {"prompt": ..., "answer": ...}, got an array'),
        ('{"prompt": "a", "ans": "b"}\n', "line 1: missing key 'answer' (keys present: 'prompt', 'ans')"),
        ("{}\n", "line 1: missing key 'prompt' and 'answer' (keys present: none)"),
        ('{"prompt": 3, "answer": "b"}\n', "line 1: 'prompt' must be a non-empty string, got a number"),
        ('{"prompt": "", "answer": "b"}\n', "line 1: 'prompt' must be a non-empty string, got an empty string"),
        ('{"prompt": "a", "answer": null}\n', "line 1: 'answer' must be a string or a number, got null"),
        ('{"prompt": "a", "answer": true}\n', "line 1: 'answer' must be a string or a number, got a boolean"),
        ('{"prompt": "a", "answer": "  "}\n', "line 1: 'answer' is empty"),
        ('{"prompt": "a", "answer": "b\\nc"}\n', "line 1: 'answer' has a newline"),
        ('{"prompt": "a", "answer": " b"}\n', "line 1: 'answer' ' b' has surrounding whitespace"),
        ('{"prompt": "a", "answer": NaN}\n', "line 1: 'answer' must be a finite number, got nan"),
        ('{"prompt": "caf\\u00e9?", "answer": "b"}\n', "line 1: 'prompt' has characters outside the tokenizer"),
        ('{"prompt": "a", "answer": "b@c"}\n', "line 1: 'answer' has characters outside the tokenizer charset: '@'"),
    ],
)
def test_data_errors(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(TaskDataError) as info:
        JsonlTask(path=str(path), eval_fraction=0)
    assert message in str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(("ending", "last"), [("\n", "\n"), ("\r\n", "\r\n"), ("\n", "")])
@pytest.mark.parametrize(
    ("bad", "error"),
    [
        # '{"prompt": ' is 11 characters, so the stray x is at column 12.
        ('{"prompt": x, "answer": "b"}', "Expecting value at column 12"),
        # Cut off after '{"prompt": ': the value is missing at column 12, just past the line's end (the
        # parser, given the line ending, put this at column 1 of a following line).
        ('{"prompt": ', "Expecting value at column 12"),
        ('{"prompt": "a", "answer": "b"', "Expecting ',' delimiter at column 30"),  # 29 characters, then the end
        # Columns count characters as an editor does: 'é' is one column (two bytes in UTF-8), so the
        # missing comma before "answer" is at column 16, not 17.
        ('{"prompt": "é" "answer": "b"}', "Expecting ',' delimiter at column 16"),
    ],
)
def test_invalid_json_names_line_and_column(tmp_path, ending, last, bad, error):
    path = tmp_path / "bad.jsonl"
    lines = ['{"prompt": "a", "answer": "b"}', "", bad]  # the blank line 2 still counts: bad is line 3
    path.write_bytes((ending.join(lines) + last).encode("utf-8"))
    with pytest.raises(TaskDataError) as info:
        load_jsonl(path)
    assert str(info.value) == f"{path} line 3: not valid JSON ({error})"


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "a", "answer": "b"}\n{"prompt": "caf\xe9", "answer": "b"}\n')
    with pytest.raises(TaskDataError, match=r"latin1.jsonl line 2: not valid UTF-8 \(invalid continuation byte"):
        load_jsonl(path)


def test_numeric_answers_must_be_numbers(tmp_path):
    path = write_rows(tmp_path / "n.jsonl", [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "12a"}])
    with pytest.raises(TaskDataError, match=r"n.jsonl line 2: 'answer' '12a' is not a number, which match=numeric"):
        JsonlTask(path=str(path), match="numeric", eval_fraction=0)
    assert len(JsonlTask(path=str(path), eval_fraction=0).sample(3, random.Random(0))) == 3  # fine for exact


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(TaskDataError, match=r"jsonl file '.*nope.jsonl' does not exist \(resolved to"):
        task_from_spec(f"jsonl:path={tmp_path / 'nope.jsonl'}")
    with pytest.raises(TaskDataError, match="is a directory, not a file"):
        JsonlTask(path=str(tmp_path))


def test_split_with_an_empty_side(tmp_path):
    path = write_rows(tmp_path / "one.jsonl", [{"prompt": "only", "answer": "row"}])
    held = is_eval_row("only", 0.5)  # whichever side the single row lands on, the other is empty
    side = "training" if held else "eval"
    with pytest.raises(
        TaskDataError, match=f"no row fell on the {side} side of the split \\(1 rows, eval_fraction=0.5\\)"
    ):
        JsonlTask(path=str(path), eval_fraction=0.5)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"match": "fuzzy"}, "invalid match='fuzzy': not one of the options; valid: exact or numeric"),
        ({"match": "numeric", "tolerance": -1}, "invalid tolerance=-1: out of range; valid: number >= 0"),
        ({"match": "numeric", "tolerance": "nan"}, "invalid tolerance='nan': not finite"),
        ({"tolerance": 0.5}, "tolerance=0.5 only applies to match=numeric"),
        ({"eval_fraction": 1}, "invalid eval_fraction=1: out of range; valid: number in [0, 1)"),
        ({"eval_fraction": "x"}, "invalid eval_fraction='x': not a number"),
        ({"path": "a,b.jsonl"}, "invalid path='a,b.jsonl': contains ','; valid: path of a JSON-lines file (no ',')"),
        ({"path": "  "}, "invalid path='  ': empty"),
    ],
)
def test_invalid_parameters(qa_file, params, message):
    with pytest.raises(TaskSpecError) as info:
        make_task("jsonl", **{"path": str(qa_file), **params})
    assert message in str(info.value)


def test_path_is_required():
    with pytest.raises(TaskSpecError, match=r"task 'jsonl' needs parameter path \(path of a JSON-lines file"):
        make_task("jsonl")
