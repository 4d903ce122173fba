"""A scoped torch intra-op thread count."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(count)``; the caller's count is restored on exit.

    CPU kernels split reductions by thread, so float results depend on the thread count: code
    whose output must not depend on the machine runs under a fixed count.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"torch thread count must be an integer >= 1, got {count!r}")
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
