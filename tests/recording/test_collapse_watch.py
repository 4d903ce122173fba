"""The collapse watch every trainer shares (moestab.recording.collapse_watch), through ``DiagnosticsRun``: a warning's
keys and run.json entry under ``log``; under ``stop``, :class:`CollapseStop` after the step is written and the run
``interrupted``; a rule whose signal the run lacks says so once."""

from __future__ import annotations

import json
import logging
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from moestab.analysis.synthetic import synthetic_routes
from moestab.metrics import keys
from moestab.metrics.collapse_warning import WarningRule
from moestab.recording import diagnostics
from moestab.recording.collapse_watch import CollapseMonitor, CollapseStop
from moestab.recording.diagnostics import DiagnosticsRun, route_diagnostics
from moestab.run_folder.reader import load_metrics, read_run_info

ALWAYS = WarningRule(signals=("reward",), weights=(0.0,), intercept=1.0, threshold=0.0, baseline_steps=2)


def _log_steps(path: Path, steps: int, policy: str, with_reward: bool = True) -> None:
    a, b = synthetic_routes(100, 2, 2, 8, flip=0.2, reorder=0.1, seed=3)
    with DiagnosticsRun(path, trainer="verl", layers=range(2), num_experts=8, top_k=2,
                        on_collapse_warning=policy) as run:
        for step in range(1, steps + 1):
            metrics = route_diagnostics(a, b)
            if with_reward:
                metrics[keys.REWARD_MEAN] = 0.5
            run.log(step, metrics)


def test_log_keeps_training_and_records_the_warning(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(diagnostics, "CollapseMonitor", partial(CollapseMonitor, rule=ALWAYS))
    _log_steps(tmp_path / "run", 4, "log")
    info = read_run_info(tmp_path / "run")
    assert info.status == "finished" and info.last_step == 4
    assert [w for w in info.warnings if w.startswith("collapse warning at step 2")]
    m = load_metrics(tmp_path / "run").set_index(keys.STEP)
    np.testing.assert_array_equal(m[keys.COLLAPSE_WARNING].to_numpy(), [np.nan, 1, 0, 0])


def test_stop_raises_after_the_step_is_written(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(diagnostics, "CollapseMonitor", partial(CollapseMonitor, rule=ALWAYS))
    with pytest.raises(CollapseStop, match="collapse warning at step 2: reward") as caught:
        _log_steps(tmp_path / "run", 4, "stop")
    assert caught.value.warning.step == 2
    info = read_run_info(tmp_path / "run")
    assert info.status == "interrupted" and info.last_step == 2 and "collapse warning at step 2" in info.error


def test_a_missing_signal_is_said_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                       caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(diagnostics, "CollapseMonitor", partial(CollapseMonitor, rule=ALWAYS))
    with caplog.at_level(logging.WARNING, logger="moestab"):
        _log_steps(tmp_path / "run", 12, "stop", with_reward=False)  # nothing fires: no reward/mean is given
    notes = [r.message for r in caplog.records if "no warning can fire" in r.message]
    assert len(notes) == 1 and "reward (reward/mean)" in notes[0]
    assert read_run_info(tmp_path / "run").status == "finished"


def test_a_bad_policy_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"on_collapse_warning must be one of \['log', 'stop'\]"):
        DiagnosticsRun(tmp_path / "run", trainer="x", layers=[0], num_experts=8, top_k=2, on_collapse_warning="halt")
    assert not (tmp_path / "run").exists()


def test_a_monitor_rebuilt_from_the_run_folder_goes_on_as_the_live_one(tmp_path: Path) -> None:
    rule = WarningRule(signals=("reward",), weights=(1.0,), threshold=2.0, baseline_steps=4, refractory=5)
    rewards = [0.5, 0.52, 0.49, 0.5, 0.51, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2]
    rows = [(s, {keys.STEP: s, keys.REWARD_MEAN: r}) for s, r in enumerate(rewards, start=1)]
    live = CollapseMonitor(rule=rule)
    fired_live = [s for s, m in rows if live.observe(s, m)[1] is not None]
    assert len(fired_live) >= 2  # the resume below falls between two warnings
    cut = fired_live[0] + 1
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for _, m in rows))  # steps past the cut too
    resumed = CollapseMonitor(rule=rule).replay_run(run, through=cut)
    fired_resumed = [s for s, m in rows[cut:] if resumed.observe(s, m)[1] is not None]
    assert fired_resumed == [s for s in fired_live if s > cut]
    assert resumed.watch.score == live.watch.score
