"""Characters of moestab's character-level tokenizer (kept apart so tasks import it without torch)."""

# Every character a prompt or answer of the embedded tasks may use.
CHARSET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ +-*/=?:;,.!()[]<>_'\"#\n"


def unsupported_characters(text: str, charset: str = CHARSET) -> set[str]:
    """Characters of ``text`` that the character tokenizer would map to ``<unk>``."""
    return set(text) - set(charset)
