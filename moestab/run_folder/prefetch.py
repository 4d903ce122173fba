"""Read ahead: produce the next items of an iterator on a background thread while the caller works on this one.

Streaming a run's token tables alternates two kinds of work: Parquet reading and decoding (pyarrow, numpy) and the
analysis of the decoded batch (numpy). Both release the GIL for most of their time, so on a machine with a second
core a reader thread hides much of one behind the other (docs/benchmarks.md, "Token tables at scale").
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

_END = object()
"""Marks the end of the items in the queue (an item can be anything, None included)."""


def prefetch(items: Iterable[T], depth: int = 1) -> Iterator[T]:
    """``items`` in order, each produced on a background thread up to ``depth`` items ahead of the caller.

    An exception raised while producing an item is raised here, where that item would have been. Closing the
    returned iterator early (a ``break``, an exception in the caller) stops the thread after the item it is
    producing. ``depth`` 0 iterates ``items`` on the calling thread (no thread).
    """
    if depth < 0:
        raise ValueError(f"depth must be >= 0, got {depth}")
    if depth == 0:
        yield from items
        return
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry: tuple[object, BaseException | None]) -> bool:
        while not stop.is_set():
            try:
                slots.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    iterator = iter(items)

    def produce() -> None:
        try:
            for item in iterator:
                if not put((item, None)):
                    return
        except BaseException as exc:  # handed to the caller, raised there
            put((_END, exc))
            return
        finally:
            close = getattr(iterator, "close", None)  # a generator's files closed by the thread that used it
            if close is not None:
                close()
        put((_END, None))

    thread = threading.Thread(target=produce, name="moestab-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item, error = slots.get()
            if error is not None:
                raise error
            if item is _END:
                return
            yield item
    finally:
        stop.set()
        thread.join()
