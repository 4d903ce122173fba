"""What a recorded step sends to a tracker (``moestab.recording.trackers.scalars``), and ``DiagnosticsRun``'s
steps in TensorBoard, read back from its event files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moestab import extras
from moestab.configs import ConfigError
from moestab.metrics import keys
from moestab.recording import trackers
from moestab.recording.diagnostics import DiagnosticsRun, route_diagnostics
from moestab.recording.trackers import PREFIX, load_summary, mean_scalars, scalars
from moestab.run_folder import schema

LAYERS, EXPERTS, MINIBATCHES = 48, 128, 4  # Qwen3-30B-A3B's MoE


def test_scalars_prefix_the_keys_spread_lists_summarise_the_load_and_drop_nulls():
    row = {"step": 3, "loss": 0.5, "routing/old_new/changed_by_layer": [0.25, 0.0],
           "experts/load": [[0.5, 0.5], [1.0, 0.0]], "loss/kl/ref_k3": None, "nan": float("nan"), "minibatches": 4}
    summary = {  # layer 0 uniform: violation 0; layer 1: (max 1 - mean 0.5) / 0.5 = 1, and expert 1 dead
        "moestab/experts/load/max_vio_max": 1.0, "moestab/experts/load/max_vio_mean": 0.5,
        "moestab/experts/load/dead_experts": 1.0}
    assert scalars(row) == {
        "moestab/loss": 0.5, "moestab/minibatches": 4.0,  # the step is the tracker's x axis, not a series
        "moestab/routing/old_new/changed_by_layer/0": 0.25, "moestab/routing/old_new/changed_by_layer/1": 0.0,
        **summary,
    }
    assert scalars(row, expert_load_matrix=True) == {
        **scalars(row), "moestab/experts/load/0/0": 0.5, "moestab/experts/load/0/1": 0.5,
        "moestab/experts/load/1/0": 1.0, "moestab/experts/load/1/1": 0.0,
    }


def _step_of_every_key(rng: np.random.Generator, load: list[list[float]]) -> dict[str, object]:
    """A metrics.jsonl row holding every key of the table, shaped by its kind, for 48 layers x 128 experts."""
    shaped = {keys.FLOAT: lambda: float(rng.random()), keys.INT: lambda: int(rng.integers(1, 9)),
              keys.PER_LAYER: lambda: rng.random(LAYERS).tolist(),
              keys.PER_MINIBATCH: lambda: rng.random(MINIBATCHES).tolist(), keys.PER_LAYER_EXPERT: lambda: load}
    return {"step": 7, **{key: shaped[row.kind]() for key, row in keys.KEYS.items() if key != keys.STEP}}


def test_a_48_by_128_step_sends_hundreds_of_scalars_not_thousands_unless_the_matrix_is_asked_for():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 50, size=(LAYERS, EXPERTS))  # [layers, experts], some experts dead
    counts[5, :] = 0  # a layer that routed nothing: no violation, no dead experts of its own
    totals = counts.sum(axis=1, keepdims=True)
    load = np.where(totals > 0, counts / np.maximum(totals, 1), 0.0).round(6).tolist()  # as experts/load is written
    row = _step_of_every_key(rng, load)
    kinds = [keys.KEYS[key].kind for key in row if key != keys.STEP and key not in keys.INTEGRITY_LAYER_DETAIL]
    sizes = {keys.FLOAT: 1, keys.INT: 1, keys.PER_LAYER: LAYERS, keys.PER_MINIBATCH: MINIBATCHES,
             keys.PER_LAYER_EXPERT: 3}  # the matrix: its summary's three numbers
    expected = sum(sizes[kind] for kind in kinds)
    sent = scalars(row)
    assert len(sent) == expected < 1_500 and kinds.count(keys.PER_LAYER_EXPERT) == 1
    assert all(k in row for k in keys.INTEGRITY_LAYER_DETAIL)  # the integrity checks' layer lists: metrics.jsonl only
    assert all(key.startswith(PREFIX) for key in sent)
    assert len(scalars(row, expert_load_matrix=True)) == expected + LAYERS * EXPERTS  # + 6,144

    # The summary against a plain-Python recomputation from the counts
    violations = [(max(c) - sum(c) / len(c)) / (sum(c) / len(c)) for c in counts.tolist() if sum(c) > 0]
    dead = sum(c == 0 for layer in counts.tolist() if sum(layer) > 0 for c in layer)
    assert dead > 0
    summary = {k.removeprefix(f"{PREFIX}{keys.EXPERTS_LOAD}/"): v for k, v in sent.items()
               if k.startswith(f"{PREFIX}{keys.EXPERTS_LOAD}/")}
    assert summary == pytest.approx({"max_vio_max": max(violations), "max_vio_mean": sum(violations) / len(violations),
                                     "dead_experts": dead}, rel=1e-4)  # the shares are rounded to 6 decimals
    assert load_summary(np.zeros((2, 4))) == {}  # nothing routed: nothing to summarise


def test_several_steps_merge_as_each_keys_mean_over_the_steps_that_have_it():
    assert mean_scalars([{"a": 1.0, "b": 2.0}, {"a": 3.0}]) == {"a": 2.0, "b": 2.0}
    assert mean_scalars([]) == {}


def _routes(rng: np.random.Generator, tokens: int = 64, layers: int = 3, top_k: int = 2) -> np.ndarray:
    """Random top-k decisions: ``top_k`` distinct experts of 8 each, ``[tokens, layers, top_k]``."""
    return np.argsort(rng.random((tokens, layers, 8)), axis=-1)[..., :top_k].astype(np.int16)


def test_diagnostics_run_sends_each_step_to_tensorboard_as_moestab_train_does(tmp_path):
    pytest.importorskip("tensorboard", reason="optional extra moestab[tensorboard]")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rng = np.random.default_rng(1)
    with DiagnosticsRun(tmp_path / "run", trainer="verl", layers=range(3), num_experts=8, top_k=2,
                        report_to="tensorboard") as run:
        for step in (1, 2):
            rollout, trainer = _routes(rng), _routes(rng)
            metrics = route_diagnostics(rollout, trainer, num_experts=8, logp_rollout=-rng.exponential(size=64),
                                        logp_trainer=-rng.exponential(size=64), aliases=True)
            run.log(step, {**metrics, keys.EXPERTS_LOAD: rng.dirichlet(np.ones(8), size=3).round(6).tolist()})
    lines = [json.loads(x) for x in (tmp_path / "run" / schema.METRICS_JSONL).read_text().splitlines()]
    expected = {line["step"]: scalars(line) for line in lines}  # what was written, as moestab train sends it
    assert f"{PREFIX}routing/rollout_old_free/changed_by_layer/2" in expected[1]
    assert f"{PREFIX}experts/load/dead_experts" in expected[1] and f"{PREFIX}experts/load/0/0" not in expected[1]
    events = EventAccumulator(str(tmp_path / "run" / schema.TENSORBOARD_DIR), size_guidance={"scalars": 0})
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(expected[1]) == set(expected[2])  # no alias: they stay out
    for key in events.Tags()["scalars"]:
        logged = {e.step: e.value for e in events.Scalars(key)}
        assert logged == pytest.approx({step: values[key] for step, values in expected.items()}, rel=1e-6,
                                       abs=1e-12), key  # event files keep float32


class _Recording:
    """A tracker that keeps what it is sent."""

    def __init__(self, run: trackers.TrackedRun) -> None:
        self.run, self.logged, self.closed = run, [], False

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.logged.append((step, metrics))

    def close(self) -> None:
        self.closed = True


def test_diagnostics_run_trackers_get_the_matrix_when_asked_and_are_closed_when_training_fails(tmp_path, monkeypatch):
    opened: list[_Recording] = []
    monkeypatch.setitem(trackers.TRACKERS, "recording", lambda run: opened.append(_Recording(run)) or opened[-1])
    monkeypatch.setitem(extras.EXTRAS, "recording", ())  # nothing to install
    load = [[0.25, 0.75], [0.5, 0.5]]
    with pytest.raises(RuntimeError, match="the trainer died"), DiagnosticsRun(
            tmp_path / "run", trainer="verl", layers=range(2), num_experts=2, top_k=1, report_to=["recording"],
            report_expert_load_matrix=True) as run:
        run.log(1, {keys.EXPERTS_LOAD: load, "not_a_key": 1.0})
        raise RuntimeError("the trainer died")
    (tracker,) = opened
    assert tracker.closed and tracker.run.run_dir == tmp_path / "run" and tracker.run.config["trainer"] == "verl"
    assert tracker.logged == [(1, scalars({keys.EXPERTS_LOAD: load}, expert_load_matrix=True))]
    assert tracker.logged[0][1]["moestab/experts/load/1/1"] == 0.5 and len(tracker.logged[0][1]) == 3 + 4


def test_diagnostics_run_refuses_an_unknown_tracker_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match="report_to: unknown tracker 'mlflow'; valid: tensorboard, wandb, trackio"):
        DiagnosticsRun(tmp_path / "run", trainer="verl", layers=range(2), num_experts=2, top_k=1,
                       report_to=("mlflow",))
    assert not (tmp_path / "run").exists()
