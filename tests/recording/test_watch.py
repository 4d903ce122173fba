"""``moestab watch``: a run followed as it is written (lines appended between reads, a line torn mid-write, a bad
line), each warning said at its step, the end said when run.json stops saying ``running``; the command's exit
status."""

from __future__ import annotations

import json
import os
import socket
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
    """A run being written by this process (run.json ``running``, its writer this live pid)."""
    run = write_run(tmp_path, status="running").path
    info = json.loads((run / schema.RUN_JSON).read_text())
    writer = {**info.get("writer", {}), "host": socket.gethostname(), "pid": os.getpid()}
    (run / schema.RUN_JSON).write_text(json.dumps({**info, "writer": writer}))
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


def test_a_rewritten_file_is_watched_again_from_its_start(running: Path) -> None:
    """A resume rewrites metrics.jsonl from its checkpoint: the follower starts over from the first line; the steps
    already said are fed silently, the steps after them are watched as they come."""
    metrics = running / schema.METRICS_JSONL
    flat, low = [0.5, 0.52, 0.48, 0.5, 0.51, 0.49], [0.1] * 6
    metrics.write_text("".join(_line(s, r) for s, r in enumerate(flat + low[:4], start=1)))  # warns at step 8
    said: list[str] = []

    def sleep(_: float) -> None:
        rounds = sleep.rounds = getattr(sleep, "rounds", 0) + 1
        if rounds == 1:  # the run crashed after step 10 and resumes from step 6: the file is cut and rewritten
            metrics.write_text("".join(_line(s, r) for s, r in enumerate(flat, start=1)))
        elif rounds == 2:
            with metrics.open("a") as f:
                f.write("".join(_line(s, 0.1) for s in range(7, 15)) + _line(15, 0.1).rstrip("\n"))  # no newline
            _set_status(running, "finished")

    seen = watch_run(running, interval=0.0, say=said.append, sleep=sleep, monitor=CollapseMonitor(rule=RULE))
    # step 8 before the crash; redone after the resume (steps 7-10 fed silently: already said), then 13
    assert seen.warnings == [8, 13]
    assert seen.last_step == 15  # the last line, written without a newline, is read once the run has ended
    assert not [s for s in said if "left out" in s]


def test_a_run_whose_writer_is_gone_ends_the_watch(running: Path) -> None:
    info = json.loads((running / schema.RUN_JSON).read_text())
    writer = {**info.get("writer", {}), "host": socket.gethostname(), "pid": 2**22 + 12345}  # no such process
    (running / schema.RUN_JSON).write_text(json.dumps({**info, "status": "running", "writer": writer}))
    (running / schema.METRICS_JSONL).write_text(_line(1, 0.5))
    slept: list[float] = []
    seen = watch_run(running, interval=0.0, say=lambda s: None, sleep=slept.append)
    assert seen.status == "stopped" and slept == []  # a killed run is not followed forever
