"""Test reward: lets an untrained policy earn reward sometimes, so advantages are not all zero."""


def length_parity(prompt: str, completion: str, answer: str) -> float:
    return float(len(completion) % 2)


def always_zero(prompt: str, completion: str, answer: str) -> float:
    """Never right: every group's rewards are equal, so every advantage is 0."""
    return 0.0


def low_first_digit_is_free(prompt: str, completion: str, answer: str) -> float:
    """Constant 1 for prompts starting with 0-4 (a group with no signal), completion-length parity otherwise."""
    return 1.0 if prompt[0] in "01234" else float(len(completion) % 2)


def fails_on_rank_1(prompt: str, completion: str, answer: str) -> float:
    """Raises in the second of several training processes only (tests/train/test_distributed.py)."""
    import os

    if os.environ.get("RANK") == "1":
        raise ValueError("this reward fails on rank 1 only")
    return float(len(completion) % 2)
