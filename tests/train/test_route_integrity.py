"""``moestab train --route-integrity``: a rollout engine whose routes come in the wrong layer order is caught at every
step;
``warn`` (default) records it once and trains on, ``refuse`` stops before the step's updates replay the routes, with
a message naming the step, the layer and the check, and the run resumes."""

from __future__ import annotations

import dataclasses

import pytest

from moestab.metrics import keys
from moestab.run_folder.reader import load_metrics
from moestab.run_folder.run_info import read_run_info
from moestab.train import train
from moestab.train.rollout import HFRolloutEngine
from moestab.train.run_lifetime import RunCrashedError
from tests.support.train import tiny_config


@pytest.fixture
def permuted_engine(monkeypatch):
    """The HF engine, its routes handed back with the layers in reverse order (each layer's routes are another's)."""
    real = HFRolloutEngine.generate

    def generate(self, *args, **kwargs):
        batch = real(self, *args, **kwargs)
        permuted = batch.routes.indices.flip(2)  # [B, L, layers, k]
        return dataclasses.replace(batch, routes=dataclasses.replace(batch.routes, indices=permuted))

    monkeypatch.setattr(HFRolloutEngine, "generate", generate)
    return monkeypatch


def test_a_right_capture_passes_every_step(tmp_path):
    run = tmp_path / "run"
    train(tiny_config(run, tmp_path / "cache", steps=2, rollout_dtype="bfloat16"))
    m = load_metrics(run)
    assert (m[keys.INTEGRITY_FAILED] == 0).all() and (m[keys.INTEGRITY_LIFT] > 0.9).all()
    assert not read_run_info(run).warnings


def test_warn_records_a_broken_capture_once_and_trains_on(tmp_path, permuted_engine):
    run = tmp_path / "run"
    result = train(tiny_config(run, tmp_path / "cache", steps=2))
    assert result.status == "finished"
    m = load_metrics(run)
    assert (m[keys.INTEGRITY_FAILED] > 0).all()
    warnings = [w for w in read_run_info(run).warnings if w.startswith("route integrity:")]
    assert len(warnings) == 1 and "step 1:" in warnings[0] and "layer" in warnings[0]


def test_refuse_stops_before_the_updates_replay_the_capture_and_the_run_resumes(tmp_path, permuted_engine):
    run = tmp_path / "run"
    settings = {"routing_replay": "rollout", "steps": 2}
    with pytest.raises(RunCrashedError, match=r"step 1: BrokenCaptureError: route integrity: .*layer \d+: "):
        train(tiny_config(run, tmp_path / "cache", route_integrity="refuse", **settings))
    info = read_run_info(run)
    assert info.status == "failed" and info.last_step == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000000"]  # no update was made
    permuted_engine.undo()  # the engine fixed: the run goes on from its last checkpoint
    result = train(tiny_config(run, tmp_path / "cache", resume=str(run), route_integrity="refuse", **settings))
    assert result.status == "finished" and (load_metrics(run)[keys.INTEGRITY_FAILED] == 0).all()
