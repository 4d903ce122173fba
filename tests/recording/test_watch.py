"""``moestab watch``: a run followed as it is written (lines appended between reads, a line torn mid-write, a bad
line), each warning said at its step, the end said when run.json stops saying ``running``; the command's exit
status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moestab.cli import main
from moestab.metrics import keys
from moestab.metrics.collapse_warning import WarningRule
from moestab.recording.collapse_watch import CollapseMonitor, watch_run
from moestab.run_folder import schema
from tests.support.runs import write_run

RULE = WarningRule(signals=("reward",), weights=(1.0,), threshold=3.0, baseline_steps=4, refractory=5)


def _line(step: int, reward: float) -> str:
    return json.dumps({keys.STEP: step, keys.REWARD_MEAN: reward}) + "\n"


def _set_status(run: Path, status: str) -> None:
    info = json.loads((run / schema.RUN_JSON).read_text())
    (run / schema.RUN_JSON).write_text(json.dumps({**info, "status": status}))


@pytest.fixture
def running(tmp_path: Path) -> Path:
    run = write_run(tmp_path, status="running").path
    (run / schema.METRICS_JSONL).write_text("")
    return run


def test_a_followed_run_says_each_warning_as_it_is_written(running: Path) -> None:
    rewards = [0.5, 0.52, 0.48, 0.5, 0.51, 0.49, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]
    chunks = [[1, 2, 3], [4, 5, 6], [7, 8], [9, 10, 11, 12, 13, 14]]
    metrics = running / schema.METRICS_JSONL
    said: list[str] = []
    torn = _line(7, rewards[6])

    def sleep(_: float) -> None:  # the trainer writes between two reads
        rounds = sleep.rounds = getattr(sleep, "rounds", 0) + 1
        with metrics.open("a") as f:
            if rounds == 1:
                f.write("".join(_line(s, rewards[s - 1]) for s in chunks[1]) + torn[:9])  # step 7 half written
            elif rounds == 2:
                f.write(torn[9:] + _line(8, rewards[7]) + "{not json\n")
            elif rounds == 3:
                f.write("".join(_line(s, rewards[s - 1]) for s in chunks[3]))
                _set_status(running, "finished")

    metrics.write_text("".join(_line(s, rewards[s - 1]) for s in chunks[0]))
    seen = watch_run(running, interval=0.0, say=said.append, sleep=sleep, monitor=CollapseMonitor(rule=RULE))
    # the drop from step 7 passes 3 robust sd in the smoothed mean at step 8; again after 5 steps (refractory)
    assert seen.warnings == [8, 13]
    assert seen.last_step == 14 and seen.status == "finished"
    assert next(s for s in said if s.startswith("collapse warning")).startswith("collapse warning at step 8: reward")
    assert any("left out" in s and "line 9" in s for s in said)
    assert said[-1].endswith("finished at step 14; 2 collapse warning(s) (steps 8, 13)")


def test_no_follow_reads_once_and_the_command_says_what_it_found(running: Path, capsys) -> None:
    (running / schema.METRICS_JSONL).write_text("".join(_line(s, 0.5) for s in range(1, 6)))
    assert main(["watch", str(running), "--no-follow"]) == 0  # the default rule: no warning in 5 flat steps
    out = capsys.readouterr().out
    assert "running at step 5; 0 collapse warning(s)" in out


def test_a_folder_that_is_not_a_run_is_refused(tmp_path: Path, capsys) -> None:
    assert main(["watch", str(tmp_path), "--no-follow"]) == 1
    assert "moestab watch: error:" in capsys.readouterr().err
