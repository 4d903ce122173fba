"""Test reward: lets an untrained policy earn reward sometimes, so advantages are not all zero."""


def length_parity(prompt: str, completion: str, answer: str) -> float:
    return float(len(completion) % 2)


def always_zero(prompt: str, completion: str, answer: str) -> float:
    """Never right: every group's rewards are equal, so every advantage is 0."""
    return 0.0
