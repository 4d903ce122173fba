"""Completion parsing, number parsing, Example and the charset check."""

from fractions import Fraction

import pytest

from moestab.models.tokenizer import CHARSET
from moestab.tasks import Example, TaskDataError, check_charset, extract_answer, parse_number


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("82", "82"),
        ("  82  ", "82"),  # surrounding whitespace stripped
        ("82\n17+3=20", "82"),  # junk after the first newline ignored
        ("\n\n82\njunk", "82"),  # leading blank lines skipped
        ("82 junk", "82 junk"),  # junk on the same line kept: the model must stop
        ("", ""),
        ("\n", ""),
    ],
)
def test_extract_answer(completion, answer):
    assert extract_answer(completion) == answer


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", Fraction(42)),
        ("-3.5", Fraction(-7, 2)),
        ("+.5", Fraction(1, 2)),
        ("1e-3", Fraction(1, 1000)),
        ("0.1", Fraction(1, 10)),  # exact, not the binary float 0.1000000000000000055...
        ("7.", Fraction(7)),
        (" 12 ", Fraction(12)),
    ],
)
def test_parse_number_accepts_decimals(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize("text", ["", "abc", "nan", "inf", "1_000", "0x10", "1/2", "4 2", "--1", "1e", "."])
def test_parse_number_rejects_non_numbers(text):
    assert parse_number(text) is None


def test_example_equality_includes_metadata_and_hash_ignores_it():
    a = Example("1+1=", "2", {"a": 1})
    assert a == Example("1+1=", "2", {"a": 1})
    assert a != Example("1+1=", "2", {"a": 2})
    assert hash(a) == hash(Example("1+1=", "2", {"other": [1]}))  # unhashable metadata is fine


def test_example_rejects_non_strings():
    with pytest.raises(TypeError, match="must be str, got str and int"):
        Example("1+1=", 2)


def test_check_charset_names_characters_and_place():
    check_charset(CHARSET, where="all of it")  # the whole charset passes
    with pytest.raises(TaskDataError) as info:
        check_charset("caf\u00e9\tok@", where="data.jsonl line 3: 'prompt'")
    message = str(info.value)
    assert message.startswith("data.jsonl line 3: 'prompt' has characters outside the tokenizer charset: ")
    # sorted by code point: tab U+0009, '@' U+0040, 'é' U+00E9
    assert "'\\t' (U+0009), '@' (U+0040), 'é' (U+00E9)" in message
    assert "allowed characters: " in message
