"""The embedded policy's supervised warm start: deterministic, cached, reused, stopped early."""

import json

import pytest
import torch
from safetensors.torch import load_file

from moestab.models import EmbeddedModelSpec
from moestab.tasks import task_from_spec
from moestab.train.threads import torch_threads
from moestab.train.warm_start import MARKER, WARM_START_THREADS, WarmStartSpec, warm_start


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


def test_warm_start_does_not_depend_on_the_callers_thread_count(tmp_path):
    # Built without a fixed count, 20 steps at 1 vs 2 caller threads already differ in every
    # weight matrix (CPU reductions split by thread), so this fails if the count is not pinned.
    task = task_from_spec("arithmetic")
    small = spec(max_steps=20, eval_every=5)
    caller = torch.get_num_threads()
    built = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            path, record = warm_start(small, task, tmp_path / f"threads{threads}", log=lambda s: None)
            assert torch.get_num_threads() == threads  # the caller's count is given back
            built[threads] = path / "model.safetensors", record
    finally:
        torch.set_num_threads(caller)
    (file_1, record_1), (file_2, record_2) = built[1], built[2]
    weights_1, weights_2 = load_file(file_1), load_file(file_2)
    assert weights_1.keys() == weights_2.keys()
    differing = sorted(k for k in weights_1 if not torch.equal(weights_1[k], weights_2[k]))
    same_file = file_1.read_bytes() == file_2.read_bytes()  # a bool: pytest would diff the raw bytes slowly
    assert same_file and not differing, f"bases differ; tensors: {differing[:4]} ({len(differing)} in all)"
    assert record_1 == record_2 and record_1["steps"] == 20
    assert record_1["threads"] == WARM_START_THREADS == 1


def test_torch_threads_restores_the_callers_count_on_exit_and_on_error():
    caller = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with torch_threads(1):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError, match="boom"), torch_threads(1):
            assert torch.get_num_threads() == 1
            raise RuntimeError("boom")
        assert torch.get_num_threads() == 2
        with pytest.raises(ValueError, match=">= 1, got 0"):
            torch_threads(0).__enter__()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(caller)
