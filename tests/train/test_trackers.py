"""`--report-to`: each step's metrics reach TensorBoard, W&B (offline) and trackio under metrics.jsonl's keys
(prefixed moestab/, `moestab.recording.trackers.scalars`: tests/recording/test_trackers.py)."""

from __future__ import annotations

import glob
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from moestab import extras
from moestab.configs import ConfigError
from moestab.recording.trackers import PREFIX, TrackedRun, check_trackers, open_trackers, run_id, scalars
from moestab.run_folder import schema
from tests.support.train import TASK, tiny_config


def test_unknown_or_missing_trackers_are_refused_before_anything_is_written(tmp_path, cache_dir, monkeypatch):
    with pytest.raises(ConfigError, match="report_to: unknown tracker 'mlflow'; valid: tensorboard, wandb, trackio"):
        check_trackers(("mlflow",))
    monkeypatch.setitem(extras.EXTRAS, "wandb", ("no_such_package_moestab",))
    with pytest.raises(ConfigError, match=r"report_to: wandb needs no_such_package_moestab, which `pip install "
                                          r"moestab` leaves out: pip install 'moestab\[wandb\]'.*; or drop wandb"):
        tiny_config(tmp_path / "run", cache_dir, report_to=("tensorboard", "wandb"))
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_every_tracker_gets_every_step_under_the_metrics_keys(tmp_path, cache_dir):
    pytest.importorskip("tensorboard", reason="optional extra moestab[tensorboard]")
    pytest.importorskip("wandb", reason="optional extra moestab[wandb]")
    pytest.importorskip("trackio", reason="optional extra moestab[trackio]")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "TRACKIO_DIR": str(tmp_path / "trackio"),
           "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "moestab", "train", "--report-to", "tensorboard,wandb,trackio", "--steps", "2",
               "--prompts-per-step", "4", "--group-size", "4", "--minibatches", "2", "--eval-size", "8",
               "--warm-start-max-steps", "0", "--cache-dir", str(cache_dir), "--out", str(out), "--no-progress",
               "--task", TASK]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / schema.METRICS_JSONL).read_text().splitlines()]
    expected = [scalars(row) for row in rows]
    assert len(rows) == 2 and f"{PREFIX}routing/old_new/changed_by_layer/3" in expected[0]
    assert f"{PREFIX}experts/load/max_vio_max" in expected[0] and f"{PREFIX}experts/load/0/0" not in expected[0]

    # TensorBoard: event files read back, every scalar at its step.
    events = EventAccumulator(str(out / schema.TENSORBOARD_DIR), size_guidance={"scalars": 0})
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(expected[0]) | set(expected[1])  # eval/accuracy: at the end only
    for key in events.Tags()["scalars"]:
        logged = {e.step: e.value for e in events.Scalars(key)}
        wanted = {step: values[key] for step, values in zip((1, 2), expected, strict=True) if key in values}
        assert logged == pytest.approx(wanted, rel=1e-6, abs=1e-12), key  # event files keep float32

    # trackio: its SQLite store holds one row per step with every key.
    with sqlite3.connect(tmp_path / "trackio" / "moestab.db") as db:
        stored = {step: json.loads(metrics) for step, metrics in db.execute("select step, metrics from metrics")}
    assert sorted(stored) == [1, 2]
    for step, values in zip((1, 2), expected, strict=True):
        assert {k: stored[step][k] for k in values} == pytest.approx(values, rel=1e-12), step

    # W&B offline: the run's record file holds every key and each step's values as JSON text.
    (record,) = glob.glob(str(out / "wandb" / "offline-run-*" / "run-*.wandb"))
    data = Path(record).read_bytes()
    for values in expected:
        assert all(key.encode() in data for key in values)
        assert json.dumps(values[f"{PREFIX}loss"]).encode() in data
        assert json.dumps(values[f"{PREFIX}grad_norm"]).encode() in data


def test_a_resumed_run_replaces_the_tensorboard_steps_logged_after_its_checkpoint(tmp_path):
    pytest.importorskip("tensorboard", reason="optional extra moestab[tensorboard]")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def run(start_step: int) -> TrackedRun:
        return TrackedRun(tmp_path, {}, run_id=run_id("2026-11-23T10:00:00", tmp_path), start_step=start_step)

    with open_trackers(("tensorboard",), run(0)) as log:
        for step in (1, 2, 3):  # step 3 was logged, then the process died before step 3's checkpoint
            log({"loss": float(step)}, step)
    with open_trackers(("tensorboard",), run(2)) as log:  # --resume from step 2's checkpoint
        log({"loss": 30.0}, 3)
    events = EventAccumulator(str(tmp_path / schema.TENSORBOARD_DIR))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars(f"{PREFIX}loss")] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    # W&B and trackio continue the same run on resume: the id depends only on the run's creation and folder.
    assert run(0).run_id == run(2).run_id != run_id("2026-11-23T10:00:01", tmp_path)


def test_the_load_matrix_reaches_tensorboard_only_when_asked(tmp_path):
    pytest.importorskip("tensorboard", reason="optional extra moestab[tensorboard]")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    row = {"step": 1, "experts/load": [[0.25, 0.75], [0.5, 0.5]]}
    for asked in (False, True):
        run_dir = tmp_path / str(asked)
        with open_trackers(("tensorboard",), TrackedRun(run_dir, {}, run_id="x", start_step=0),
                           expert_load_matrix=asked) as log:
            log(row, 1)
        events = EventAccumulator(str(run_dir / schema.TENSORBOARD_DIR))
        events.Reload()
        summary = {f"{PREFIX}experts/load/{stat}" for stat in ("max_vio_max", "max_vio_mean", "dead_experts")}
        matrix = {f"{PREFIX}experts/load/{layer}/{expert}" for layer in (0, 1) for expert in (0, 1)}
        assert set(events.Tags()["scalars"]) == (summary | matrix if asked else summary)
        assert [e.value for e in events.Scalars(f"{PREFIX}experts/load/max_vio_max")] == [0.5]  # (0.75 - 0.5) / 0.5
