"""probes/saturation.py on a real short run."""

import runpy
import sys
from pathlib import Path

import pandas as pd
import pytest

from moestab.train import train
from tests.train.helpers import tiny_config

PROBE = str(Path(__file__).resolve().parents[2] / "probes" / "saturation.py")


def test_saturation_probe_over_a_runs_checkpoints(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    train(tiny_config(run, tmp_path / "cache", steps=2, save_every=1), log=lambda s: None)
    out_csv = tmp_path / "sat.csv"
    monkeypatch.setattr(sys, "argv", [PROBE, str(run), "--probes", "8", "--csv", str(out_csv)])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(PROBE, run_name="__main__")
    assert exit_info.value.code == 0
    assert "top-k router saturation vs step 2" in capsys.readouterr().out
    table = pd.read_csv(out_csv)
    assert sorted(table.step.unique()) == [0, 1, 2] and sorted(table.layer.unique()) == [0, 1, 2, 3]
    assert (table[table.step == 2].saturation == 1.0).all()  # the reference against itself
    assert table.saturation.between(0, 1).all()


def test_saturation_probe_rejects_a_folder_that_is_not_a_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", [PROBE, str(tmp_path)])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(PROBE, run_name="__main__")
    assert exit_info.value.code == 2
    assert "is not a moestab run folder: it has no run.json" in capsys.readouterr().err
