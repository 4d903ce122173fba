"""arithmetic / reverse / sort: determinism, answers checked against independent code, split, rewards."""

import random
import re
from collections import Counter

import pytest

from moestab.models.tokenizer import CHARSET
from moestab.tasks import ArithmeticTask, ReverseTask, SortTask, TaskError, TaskSpecError, make_task
from moestab.tasks.generated import HELD_OUT_BUCKETS, is_held_out_prompt

TASK_SPECS = [
    ("arithmetic", {}),
    ("arithmetic", {"digits": 3, "ops": "+-", "negative": True}),
    ("arithmetic", {"digits": 1, "ops": "-"}),
    ("reverse", {}),
    ("reverse", {"length": "2-9", "alphabet": "xyz01"}),
    ("sort", {"length": 6}),
    ("sort", {"length": (1, 3), "alphabet": "dcba"}),
]


def independent_answer(task, prompt):
    """A second implementation of each task's answer, from the prompt text alone."""
    if task.name == "arithmetic":
        a, op, b = re.fullmatch(r"(\d+)([+-])(\d+)=", prompt).groups()
        return str(int(a) + int(b) if op == "+" else int(a) - int(b))
    prefix, sequence = prompt[:-1].split(" ")
    assert prompt.endswith("=")
    if task.name == "reverse":
        assert prefix == "rev"
        return "".join(reversed(list(sequence)))
    assert prefix == "sort"
    counts = Counter(sequence)  # counting sort over the alphabet's order
    return "".join(symbol * counts[symbol] for symbol in task.alphabet)


@pytest.mark.parametrize(("name", "params"), TASK_SPECS)
def test_examples_are_deterministic_correct_and_in_bounds(name, params):
    task = make_task(name, **params)
    train = task.sample(300, random.Random(7))
    assert train == task.sample(300, random.Random(7))
    assert train != task.sample(300, random.Random(8))
    evals = task.eval_set(100, seed=3)
    assert evals == task.eval_set(100, seed=3)
    assert len(evals) == 100
    for example in train + evals:
        assert example.answer == independent_answer(task, example.prompt)
        assert set(example.prompt + example.answer) <= set(CHARSET)
        assert 1 <= len(example.answer) <= task.max_answer_chars
        assert len(example.prompt) <= task.max_prompt_chars
        assert task.reward(example, example.answer) == 1.0


@pytest.mark.parametrize(
    ("task", "max_answer", "max_prompt"),
    [
        (ArithmeticTask(), 3, 6),  # 99+99=198 ; "99+99="
        (ArithmeticTask(digits=3, ops="-"), 3, 8),  # 999-0=999 ; a >= b so no sign
        (ArithmeticTask(digits=3, ops="-", negative=True), 4, 8),  # 0-999=-999
        (ArithmeticTask(digits=1, ops="+-", negative=True), 2, 4),  # 9+9=18 and 0-9=-9 both 2 chars
        (ReverseTask(length="4-8"), 8, 13),  # "rev " + 8 symbols + "="
        (SortTask(length=5), 5, 11),  # "sort " + 5 symbols + "="
    ],
)
def test_length_bounds_hand_worked(task, max_answer, max_prompt):
    assert task.max_answer_chars == max_answer
    assert task.max_prompt_chars == max_prompt


def test_bounds_are_reached():
    # 1-digit addition has only 100 prompts: 2000 draws see 9+9=18 and the longest prompt.
    task = ArithmeticTask(digits=1)
    examples = task.sample(2000, random.Random(0))
    assert max(len(e.answer) for e in examples) == task.max_answer_chars
    assert max(len(e.prompt) for e in examples) == task.max_prompt_chars


def test_sort_uses_alphabet_order_and_reverse_hand_worked():
    sort = SortTask(alphabet="dcba")
    reverse = ReverseTask()
    assert sort.transform("abcd") == "dcba"  # 'd' comes first in alphabet "dcba"
    assert sort.transform("badc") == "dcba"
    assert reverse.transform("abcd") == "dcba"


def test_subtraction_without_negative_never_goes_below_zero():
    examples = ArithmeticTask(digits=2, ops="-").sample(500, random.Random(1))
    assert all(int(e.answer) >= 0 for e in examples)
    with_negative = ArithmeticTask(digits=2, ops="-", negative=True).sample(500, random.Random(1))
    assert any(e.answer.startswith("-") for e in with_negative)


def test_length_range_covers_every_length():
    examples = ReverseTask(length="2-5").sample(400, random.Random(0))
    assert {len(e.answer) for e in examples} == {2, 3, 4, 5}
    assert all(e.metadata["length"] == len(e.answer) for e in examples)


@pytest.mark.parametrize("task", [ArithmeticTask(), ReverseTask(length=6), SortTask(length="4-8")])
def test_eval_set_is_held_out_from_training(task):
    assert task.held_out
    evals = task.eval_set(200, seed=0)
    train = task.sample(2000, random.Random(0))
    assert all(is_held_out_prompt(e.prompt) for e in evals)
    assert not {e.prompt for e in evals} & {e.prompt for e in train}
    assert len({e.prompt for e in evals}) == 200  # distinct
    assert task.eval_set(50, seed=0) == evals[:50]  # prefix property
    assert task.eval_set(50, seed=1) != evals[:50]


def test_held_out_split_takes_about_one_bucket():
    prompts = [f"{a}+{b}=" for a in range(100) for b in range(100)]
    fraction = sum(map(is_held_out_prompt, prompts)) / len(prompts)
    assert abs(fraction - 1 / HELD_OUT_BUCKETS) < 0.02


def test_tiny_space_is_not_split_and_eval_repeats_what_exists():
    task = SortTask(length=2, alphabet="abc")  # 3**2 = 9 prompts
    assert not task.held_out
    evals = task.eval_set(20, seed=0)
    assert len(evals) == 20
    assert len({e.prompt for e in evals}) == 9  # every prompt found, then repeated in order
    assert evals[9:18] == evals[:9]


def test_reward_on_correct_wrong_and_junk_completions():
    task = ArithmeticTask()
    example = task.sample(1, random.Random(0))[0]
    assert (example.prompt, example.answer) == ("97+53=", "150")  # first draw of Random(0), pinned
    assert task.reward(example, "150") == 1.0
    assert task.reward(example, " 150 \n97+1=98 junk") == 1.0
    assert task.reward(example, "151") == 0.0
    assert task.reward(example, "1500") == 0.0
    assert task.reward(example, "150 junk") == 0.0
    assert task.reward(example, "") == 0.0
    assert task.is_correct(example, "150\n") is True
    assert task.is_correct(example, "15") is False


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("arithmetic", {"digits": 0}, "invalid digits=0: 0 is out of range; valid: integer 1-6"),
        ("arithmetic", {"digits": "two"}, "invalid digits='two': 'two' is not an integer; valid: integer 1-6"),
        ("arithmetic", {"digits": True}, "invalid digits=True: expected an integer, got a bool"),
        ("arithmetic", {"ops": "*"}, "invalid ops='*': unknown operation(s) '*'; valid: non-empty string"),
        ("arithmetic", {"ops": "++"}, "invalid ops='++': an operation is repeated"),
        ("arithmetic", {"ops": ""}, "invalid ops='': expected a non-empty string"),
        ("arithmetic", {"negative": "maybe"}, "invalid negative='maybe': not a boolean; valid: true or false"),
        ("arithmetic", {"negative": True}, "negative=true needs '-' in ops (ops='+')"),
        ("reverse", {"length": 0}, "invalid length=0: out of range; valid: integer 1-128, or an inclusive range"),
        ("reverse", {"length": "8-4"}, "invalid length='8-4': range 8-4 is empty (low > high)"),
        ("reverse", {"length": "4-x"}, "invalid length='4-x': 'x' is not an integer"),
        ("reverse", {"length": (1, 2, 3)}, "a range has 2 ends, got 3 values"),
        ("sort", {"alphabet": "a"}, "invalid alphabet='a': needs at least 2 distinct symbols; valid: 2-"),
        ("sort", {"alphabet": "abca"}, "invalid alphabet='abca': a symbol is repeated"),
        ("sort", {"alphabet": "ab=c"}, "symbols not allowed: '=' (U+003D)"),
        ("sort", {"alphabet": "ab\u00e9"}, "symbols not allowed: 'é' (U+00E9)"),
    ],
)
def test_invalid_parameters(name, params, message):
    with pytest.raises(TaskSpecError) as info:
        make_task(name, **params)
    assert isinstance(info.value, ValueError)
    assert message in str(info.value)
    assert str(info.value).startswith(f"task {name!r}: ")


@pytest.mark.parametrize("n", [-1, 1.5, True, "3"])
def test_bad_counts(n):
    with pytest.raises(TaskError, match="number of examples must be a non-negative int"):
        ArithmeticTask().sample(n, random.Random(0))
    with pytest.raises(TaskError, match="number of examples must be a non-negative int"):
        ReverseTask().eval_set(n, seed=0)


def test_zero_examples():
    assert ArithmeticTask().sample(0, random.Random(0)) == []
    assert SortTask().eval_set(0, seed=0) == []
