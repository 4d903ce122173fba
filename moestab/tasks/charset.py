"""Checking that text fits the character tokenizer, so no prompt or answer silently becomes ``<unk>``."""

from __future__ import annotations

from moestab.charset import CHARSET, unsupported_characters
from moestab.tasks.errors import TaskDataError


def describe_characters(chars: set[str]) -> str:
    """``'é' (U+00E9), '\\t' (U+0009)``: each character quoted and with its code point, sorted."""
    return ", ".join(f"{c!r} (U+{ord(c):04X})" for c in sorted(chars))


def check_charset(text: str, *, where: str, charset: str = CHARSET) -> None:
    """Raise ``TaskDataError`` naming ``where`` and the offending characters if ``text`` leaves ``charset``.

    ``where`` says which text it is, e.g. ``"data.jsonl line 3: 'prompt'"``.
    """
    bad = unsupported_characters(text, charset)
    if bad:
        raise TaskDataError(
            f"{where} has characters outside the tokenizer charset: {describe_characters(bad)}; "
            f"allowed characters: {charset!r}"
        )
