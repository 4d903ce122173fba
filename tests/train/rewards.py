"""Test reward: lets an untrained policy earn reward sometimes, so advantages are not all zero."""


def length_parity(prompt: str, completion: str, answer: str) -> float:
    return float(len(completion) % 2)
