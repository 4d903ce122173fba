"""Without a progress bar (``--no-progress``, or stderr not a terminal) a run says how it goes: a line every tenth of
the run with the time per step and the time left; a new seed's warm start says what it builds, that it is cached, its
steps out of the cap and its elapsed time (issue 54.8)."""

from __future__ import annotations

import re

from moestab.train import train
from tests.support.train import tiny_config


def test_a_run_without_a_bar_logs_a_line_every_tenth_of_its_steps(tmp_path):
    notes: list[str] = []
    train(tiny_config(tmp_path / "run", tmp_path / "cache", steps=4, eval_every=2), log=notes.append)
    lines = [n for n in notes if n.startswith("step ")]
    assert [line.split(":")[0] for line in lines] == ["step 1/4", "step 2/4", "step 3/4", "step 4/4"]
    assert re.search(r"step 4/4: reward [0-9.]+, vol [0-9.]+, eval [0-9.]+ \([0-9.]+ s/step, ~0 min left\)", lines[-1])


def test_a_warm_start_says_what_it_builds_where_it_is_cached_and_how_long_it_took(tmp_path):
    notes: list[str] = []
    train(tiny_config(tmp_path / "run", tmp_path / "cache", steps=1, warm_start_max_steps=50, seed=7),
          log=notes.append)
    start = next(n for n in notes if n.startswith("warm start: building"))
    assert "of seed 7" in start and "at most 50 steps" in start and "built once and cached in" in start
    assert any(re.match(r"warm start: step 50 of at most 50 \(\d+ s\)", n) for n in notes)
    assert any(re.match(r"warm start: done in 50 steps, \d+ s; eval accuracy", n) for n in notes)
    notes.clear()
    train(tiny_config(tmp_path / "again", tmp_path / "cache", steps=1, warm_start_max_steps=50, seed=7),
          log=notes.append)
    assert not any(n.startswith("warm start: building") for n in notes)  # the cached base is reused
