"""probes/saturation.py (= moestab probe saturation) on a real short run's checkpoints."""

import runpy
import sys
from pathlib import Path

import pandas as pd
import pytest

from moestab.train import train
from tests.support.train import tiny_config

PROBE = str(Path(__file__).resolve().parents[2] / "probes" / "saturation.py")


def run_probe_script(monkeypatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", [PROBE, *args])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(PROBE, run_name="__main__")
    return exit_info.value.code


def test_saturation_probe_over_a_runs_checkpoints(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    train(tiny_config(run, tmp_path / "cache", steps=2, save_every=1), log=lambda s: None)
    out = tmp_path / "saturation.csv"
    code = run_probe_script(monkeypatch, str(run), "--suite", "task:arithmetic", "--count", "8", "--csv", str(out),
                            "--no-progress")
    assert code == 0
    assert "probe saturation on run@0, run@1, run@2" in capsys.readouterr().out
    table = pd.read_csv(out)
    assert set(table.pop("table")) == {"saturation"}
    assert table.checkpoint.unique().tolist() == ["run@0", "run@1", "run@2"]
    assert sorted(table.layer.unique()) == [0, 1, 2, 3]
    assert (table[table.checkpoint == "run@2"].saturation == 1.0).all()  # the reference against itself
    assert table.saturation.between(0, 1).all()


def test_saturation_probe_rejects_a_folder_that_is_neither_run_nor_model(tmp_path, capsys, monkeypatch):
    assert run_probe_script(monkeypatch, str(tmp_path)) == 2
    assert "is neither a moestab run folder (no run.json) nor a Hugging Face model folder" in capsys.readouterr().err
