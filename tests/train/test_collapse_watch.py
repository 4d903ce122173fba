"""``moestab train``'s collapse watch (issue 57): the ``collapse/*`` keys, a warning logged and kept in run.json, and
``--on-collapse-warning stop`` stopping after the step, resumable, without firing the same warning again."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

from moestab.metrics import keys
from moestab.metrics.collapse_warning import WarningRule
from moestab.recording.collapse_watch import CollapseMonitor
from moestab.run_folder.reader import load_metrics, read_run_info
from moestab.train import loop, train
from moestab.train.interrupt import EXIT_COLLAPSE_STOP, exit_status
from tests.support.train import tiny_config

ALWAYS = WarningRule(signals=("reward",), weights=(0.0,), intercept=1.0, threshold=0.0, baseline_steps=2,
                     refractory=10, name="always")
"""A rule that fires as soon as its baseline is complete (step 2), then not again for 10 steps."""


@pytest.fixture
def firing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "CollapseMonitor", partial(CollapseMonitor, rule=ALWAYS))


def test_a_warning_is_a_key_a_log_line_and_a_run_json_warning(firing, tmp_path: Path) -> None:
    lines: list[str] = []
    result = train(tiny_config(tmp_path / "run", tmp_path / "cache", steps=4), log=lines.append)
    assert result.status == "finished" and not result.collapse_stop
    m = load_metrics(tmp_path / "run").set_index(keys.STEP)
    assert m[keys.COLLAPSE_WARNING].fillna(-1).tolist() == [-1, 1, 0, 0]  # none before the baseline, then one
    assert m.loc[2, "collapse/warning_on/reward"] == 1
    assert m["collapse/warning_on/reward"].notna().sum() == 1
    warned = [w for w in read_run_info(tmp_path / "run").warnings if w.startswith("collapse warning")]
    assert len(warned) == 1 and "step 2" in warned[0] and "reward/mean" in warned[0]
    assert any(line.startswith("collapse warning at step 2") for line in lines)


def test_stop_saves_the_step_and_a_resume_goes_on_without_the_same_warning(firing, tmp_path: Path) -> None:
    run, cache = tmp_path / "run", tmp_path / "cache"
    lines: list[str] = []
    stopped = train(tiny_config(run, cache, steps=5, save_every=10, on_collapse_warning="stop"), log=lines.append)
    assert (stopped.status, stopped.last_step, stopped.collapse_stop) == ("interrupted", 2, True)
    assert exit_status(stopped.status, stopped.stop_signal, stopped.collapse_stop) == EXIT_COLLAPSE_STOP
    info = read_run_info(run)
    assert info.status == "interrupted" and info.last_step == 2
    assert info.error.startswith("collapse warning at step 2: reward")
    assert (run / "checkpoints" / "step_000002").is_dir()  # saved although save_every is 10
    message = next(line for line in lines if line.startswith("collapse warning"))
    assert "stopped" in message and f"moestab train --resume {run}" in message
    resumed = train(tiny_config(run, cache, steps=5, save_every=10, resume=str(run), on_collapse_warning="stop"))
    assert resumed.status == "finished" and resumed.last_step == 5
    m = load_metrics(run)
    assert m[keys.COLLAPSE_WARNING].sum() == 1  # the replayed watch remembers the warning of step 2


def test_a_warning_at_the_last_step_lets_the_run_finish(firing, tmp_path: Path) -> None:
    result = train(tiny_config(tmp_path / "run", tmp_path / "cache", steps=2, on_collapse_warning="stop"))
    assert (result.status, result.last_step, result.collapse_stop) == ("finished", 2, False)
    assert result.final_accuracy is not None
    assert [w for w in read_run_info(tmp_path / "run").warnings if w.startswith("collapse warning at step 2")]


def test_a_rule_whose_signal_is_missing_says_so_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    needs_vol = WarningRule(signals=("vol",), weights=(1.0,), threshold=3.0, baseline_steps=2)
    monkeypatch.setattr(loop, "CollapseMonitor", partial(CollapseMonitor, rule=needs_vol))
    monkeypatch.setattr("moestab.recording.collapse_watch.MISSING_AFTER", 1)
    lines: list[str] = []
    # One step in 100 measured: old->new routing change (vol) has one value in 3 steps, its baseline needs 2.
    train(tiny_config(tmp_path / "run", tmp_path / "cache", steps=3, measure_every=100), log=lines.append)
    notes = [line for line in lines if line.startswith("collapse watch: no warning can fire")]
    assert len(notes) == 1 and "vol (routing/old_new/changed)" in notes[0]
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "finished"
