"""The embedded policy's supervised warm start: deterministic, cached, reused, stopped early."""

import json

import torch
from safetensors.torch import load_file

from moestab.models import EmbeddedModelSpec
from moestab.tasks import task_from_spec
from moestab.train.warm_start import MARKER, WarmStartSpec, warm_start


def spec(**overrides) -> WarmStartSpec:
    values = {"model": EmbeddedModelSpec(hidden_size=32, num_layers=2), "task_spec": "arithmetic",
              "target": 1.0, "max_steps": 6, "seed": 0, "eval_size": 8, "batch_size": 8, "eval_every": 3}
    return WarmStartSpec(**{**values, **overrides})


def test_warm_start_is_deterministic_cached_and_reused(tmp_path):
    task = task_from_spec("arithmetic")
    logs: list[str] = []
    path_a, record_a = warm_start(spec(), task, tmp_path / "a", log=logs.append)
    path_b, _ = warm_start(spec(), task, tmp_path / "b", log=lambda s: None)
    assert record_a["steps"] == 6  # target 1.0 is out of reach: it stops at the step cap
    weights_a = load_file(path_a / "model.safetensors")
    weights_b = load_file(path_b / "model.safetensors")
    assert weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)  # same inputs, same base

    logs.clear()
    again, record = warm_start(spec(), task, tmp_path / "a", log=logs.append)
    assert again == path_a and record == record_a and logs == []  # reused, nothing retrained
    assert json.loads((path_a / MARKER).read_text())["key"] == spec().key()
    # Anything that changes the base changes the cache key.
    assert spec(max_steps=7).key() != spec().key()
    assert spec(model=EmbeddedModelSpec(hidden_size=32, num_layers=2, seed=1)).key() != spec().key()


def test_warm_start_stops_once_the_target_is_reached(tmp_path):
    task = task_from_spec("arithmetic")
    _, record = warm_start(spec(target=0.0, max_steps=50), task, tmp_path, log=lambda s: None)
    assert record["steps"] == 0  # an untrained policy already meets a 0% target: no step taken
