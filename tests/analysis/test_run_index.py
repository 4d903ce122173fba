"""The run index (moestab.analysis.run_index): entries kept per fingerprint and moestab version, read back by a second
connection (another dashboard process), computed within a time budget, and a cache that cannot be written falls back
to memory with a note."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from moestab.analysis import run_index
from moestab.analysis.run_index import Entry, RunIndex, read_within

FP_A = (("run.json", 1, 10),)
FP_B = (("run.json", 2, 10),)


def test_an_entry_is_known_at_its_fingerprint_only(tmp_path: Path) -> None:
    with RunIndex(tmp_path / "index.sqlite3") as index:
        entry = Entry({"steps": np.int64(6), "changed": np.float64(0.04), "nan": float("nan"), "algo": "gspo"},
                      ("metrics.jsonl: line 3 is not valid JSON",))
        index.put("runs/a", FP_A, entry)
        got = index.known({"runs/a": FP_A, "runs/b": FP_A})
        assert list(got) == ["runs/a"]
        value = got["runs/a"].value
        assert value["steps"] == 6 and type(value["steps"]) is int and value["changed"] == 0.04
        assert np.isnan(value["nan"]) and value["algo"] == "gspo"
        assert got["runs/a"].skipped == entry.skipped and got["runs/a"].error is None
        assert index.known({"runs/a": FP_B}) == {}  # a changed file: the entry is stale


def test_a_second_connection_reads_what_the_first_kept(tmp_path: Path) -> None:
    file = tmp_path / "cache" / "index.sqlite3"  # the folder is created
    with RunIndex(file) as first:
        first.put("runs/a", FP_A, Entry(None, (), "run.json: not JSON", None))
    with RunIndex(file) as second:
        assert second.known({"runs/a": FP_A})["runs/a"].error == "run.json: not JSON"
        assert second.note is None


def test_entries_of_another_moestab_version_are_recomputed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "index.sqlite3"
    with RunIndex(file) as index:
        index.put("runs/a", FP_A, Entry({"x": 1}))
    monkeypatch.setattr(run_index, "__version__", "0.0.0-other")
    with RunIndex(file) as index:
        assert index.known({"runs/a": FP_A}) == {}


def test_a_damaged_entry_is_read_again(tmp_path: Path) -> None:
    file = tmp_path / "index.sqlite3"
    with RunIndex(file) as index:
        index.put("runs/a", FP_A, Entry({"x": 1}))
    with sqlite3.connect(file) as db:
        db.execute("UPDATE runs SET entry = '{not json'")
    with RunIndex(file) as index:
        assert index.known({"runs/a": FP_A}) == {}


def test_an_unwritable_cache_keeps_the_index_in_memory_and_says_so(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder should be")
    with RunIndex(blocker / "index.sqlite3") as index:
        assert index.note is not None and str(blocker) in index.note
        index.put("runs/a", FP_A, Entry({"x": 1}))
        assert index.known({"runs/a": FP_A})["runs/a"].value == {"x": 1}


class Clock:
    """A clock that advances one second each time a run is computed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_read_within_computes_until_the_budget_and_keeps_what_it_computed(tmp_path: Path) -> None:
    clock, computed = Clock(), []

    def compute(path: str) -> Entry:
        computed.append(path)
        clock.now += 1.0
        return Entry({"path": path})

    runs = {f"runs/{i}": (("run.json", i, 1),) for i in range(5)}
    with RunIndex(tmp_path / "index.sqlite3") as index:
        nothing = read_within(index, runs, compute, budget_s=0.0, clock=clock)
        assert (nothing.entries, nothing.pending, nothing.computed) == ({}, tuple(runs), 0)
        first = read_within(index, runs, compute, budget_s=2.0, clock=clock)
        assert first.computed == 2 and first.pending == ("runs/2", "runs/3", "runs/4")
        tiny = read_within(index, runs, compute, budget_s=1e-9, clock=clock)  # a positive budget always progresses
        assert tiny.computed == 1 and len(tiny.entries) == 3
        rest = read_within(index, runs, compute, budget_s=None, clock=clock)
        assert rest.computed == 2 and rest.pending == () and len(rest.entries) == 5
        assert computed == list(runs)  # each run computed once: the others came from the index
        again = read_within(index, runs, compute, budget_s=None, clock=clock)
        assert again.computed == 0 and again.entries["runs/4"].value == {"path": "runs/4"}
