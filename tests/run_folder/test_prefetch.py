"""The read-ahead of streamed token tables: order, errors where they happened, early stops."""

from __future__ import annotations

import threading

import pytest

from moestab.run_folder.prefetch import prefetch


def test_items_come_in_order_produced_on_another_thread():
    threads = []

    def items():
        for i in range(20):
            threads.append(threading.current_thread())
            yield i

    assert list(prefetch(items(), depth=2)) == list(range(20))
    assert all(t is not threading.current_thread() for t in threads)
    assert list(prefetch(items(), depth=0)) == list(range(20))  # depth 0: on this thread
    assert threads[-1] is threading.current_thread()


def test_an_error_is_raised_where_its_item_would_have_been():
    def items():
        yield 1
        yield 2
        raise OSError("table 3 unreadable")

    got = []
    with pytest.raises(OSError, match="table 3 unreadable"):
        for item in prefetch(items()):
            got.append(item)
    assert got == [1, 2]


def test_stopping_early_stops_the_thread_and_closes_the_items():
    produced, closed = [], threading.Event()

    def items():
        try:
            for i in range(1000):
                produced.append(i)
                yield i
        finally:
            closed.set()

    stream = prefetch(items(), depth=1)
    assert [next(stream), next(stream)] == [0, 1]
    stream.close()
    assert closed.is_set()  # the generator's cleanup ran (open files closed) before close() returned
    assert len(produced) <= 4  # the thread stopped within its read-ahead, not at the end of the items
    assert not any(t.name == "moestab-prefetch" for t in threading.enumerate())


def test_a_negative_depth_is_refused():
    with pytest.raises(ValueError, match="depth must be >= 0, got -1"):
        list(prefetch([1], depth=-1))
