"""moestab.run_folder.checkpoint_files: a checkpoint's files judged whole from their structure, checked against the
readers that would load them (safetensors, torch.load) on every cut a partial copy can leave."""

from __future__ import annotations

import io
import os
import pickle

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from moestab.run_folder.checkpoint_files import (
    checkpoint_problem,
    model_folder_problem,
    safetensors_problem,
    state_problem,
)

TENSORS = {"a": torch.arange(12.0).reshape(3, 4), "b": torch.ones(5, dtype=torch.float64), "c": torch.zeros(0)}


def _loads(path) -> bool:
    try:
        load_file(path)
    except (SafetensorError, OSError, ValueError, RuntimeError):
        return False
    return True


def test_safetensors_cut_anywhere_is_damaged_exactly_when_safetensors_cannot_load_it(tmp_path):
    whole = tmp_path / "whole.safetensors"
    save_file(TENSORS, whole, metadata={"format": "pt"})
    data = whole.read_bytes()
    assert safetensors_problem(whole) is None and _loads(whole)
    cut = tmp_path / "cut.safetensors"
    for length in range(len(data)):
        cut.write_bytes(data[:length])
        assert safetensors_problem(cut) is not None and not _loads(cut), length
    declared = len(data) - 8 - int.from_bytes(data[:8], "little")
    cut.write_bytes(data + b"\0" * 8)  # bytes the header does not account for
    assert safetensors_problem(cut) == (f"cut.safetensors holds {declared + 8:,} bytes of tensor data where its "
                                        f"header declares {declared:,}")
    assert not _loads(cut)


def test_a_safetensors_header_that_is_not_json_or_lies_is_damaged(tmp_path):
    path = tmp_path / "w.safetensors"
    path.write_bytes((4).to_bytes(8, "little") + b"\xff\xfe{}")
    assert safetensors_problem(path) == "w.safetensors: its header is not JSON"
    path.write_bytes((2).to_bytes(8, "little") + b"[]")
    assert safetensors_problem(path) == "w.safetensors: its header is not a JSON object"
    path.write_bytes((2**40).to_bytes(8, "little") + b"{}")
    assert "declares a 1,099,511,627,776-byte header in a 10-byte file" in safetensors_problem(path)
    header = b'{"t": {"dtype": "F32", "shape": [1]}}'
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    assert safetensors_problem(path) == "w.safetensors: its header has a tensor entry without data_offsets"


def _state_bytes() -> bytes:
    buffer = io.BytesIO()
    torch.save({"step": 3, "optimizer": {"state": {0: {"exp_avg": torch.ones(4)}}, "param_groups": []}}, buffer)
    return buffer.getvalue()


def _torch_loads(path) -> bool:
    try:
        torch.load(path, weights_only=True)
    except (RuntimeError, pickle.UnpicklingError, EOFError, ValueError):
        return False
    return True


def test_a_training_state_cut_anywhere_is_damaged_as_torch_load_finds_it(tmp_path):
    data = _state_bytes()
    path = tmp_path / "step_000003.pt"
    path.write_bytes(data)
    assert state_problem(path) is None and _torch_loads(path)
    for length in range(0, len(data), 7):  # every 7th cut: a zip's directory is at its end, any cut loses it
        path.write_bytes(data[:length])
        assert state_problem(path) is not None and not _torch_loads(path), length


def test_random_bytes_and_a_bare_pickle_are_not_a_training_state(tmp_path):
    path = tmp_path / "step_000001.pt"
    path.write_bytes(os.urandom(4096))
    assert state_problem(path).startswith("step_000001.pt is not a whole torch.save archive")
    path.write_bytes(pickle.dumps({"optimizer": {}}))
    assert state_problem(path).startswith("step_000001.pt is not a whole torch.save archive")


def test_a_model_folder_needs_a_json_config_and_whole_weights(tmp_path):
    folder = tmp_path / "step_000001"
    folder.mkdir()
    assert model_folder_problem(folder).startswith("config.json cannot be read as JSON")
    (folder / "config.json").write_text("[1]")
    assert model_folder_problem(folder) == "config.json is not a JSON object"
    (folder / "config.json").write_text("{}")
    assert model_folder_problem(folder) == "it has no .safetensors weights"
    save_file(TENSORS, folder / "model-00001-of-00002.safetensors")
    save_file(TENSORS, folder / "model-00002-of-00002.safetensors")
    state = tmp_path / "step_000001.pt"
    state.write_bytes(_state_bytes())
    assert checkpoint_problem(folder, state) is None
    second = folder / "model-00002-of-00002.safetensors"
    second.write_bytes(second.read_bytes()[:-1])
    assert checkpoint_problem(folder, state).startswith("model-00002-of-00002.safetensors holds")


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_missing_file_of_the_model_folder_is_named(tmp_path, name):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    save_file(TENSORS, folder / "model.safetensors")
    (folder / name).unlink()
    assert name.split(".")[-1] in model_folder_problem(folder)
