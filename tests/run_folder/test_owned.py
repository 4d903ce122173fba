"""Output files never replace a run's or a model folder's own files (issue 40.2): ``--json`` / ``--csv`` FILE is
checked by ``moestab.run_folder.owned.owner`` before any work, through ``moestab analyze`` and ``moestab probe``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from moestab.run_folder import schema
from moestab.run_folder.owned import owner
from tests.support.runs import a_run


def a_model_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"model_type": "qwen3_moe"}')
    (path / "model.safetensors").write_bytes(b"weights")
    return path


def test_owner_names_a_runs_files_and_a_model_folders_and_nothing_else(tmp_path):
    run = a_run(tmp_path / "runs" / "a").path
    for name in (schema.RUN_JSON, schema.METRICS_JSONL, schema.CONFIG_YAML, "tokens/step_000001.parquet",
                 "checkpoints/step_000001/config.json", schema.LOCK_FILE, "state/x.pt"):
        assert owner(run / name) == f"run {run}'s {name}", name
    assert owner(run / "summary.json") is None  # the user's own file beside the run's
    assert owner(run / "analysis" / "x.csv") is None
    assert owner(tmp_path / "runs" / "summary.json") is None  # not inside a run
    model = a_model_folder(tmp_path / "ckpt")
    assert owner(model / "config.json") == f"model folder {model}'s config.json"
    assert owner(model / "probe.json") is None  # a new file beside the model's: nothing replaced
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "config.json").write_text("{}")
    assert owner(tmp_path / "plain" / "config.json") is None  # a config.json without weights is no model folder


def moestab(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moestab.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_analyze_refuses_to_write_over_the_runs_metrics(tmp_path):
    run = a_run(tmp_path / "run").path
    (run / schema.METRICS_JSONL).write_text('{"step": 1}\n')
    before = (run / schema.METRICS_JSONL).read_bytes()
    for option in ("--json", "--csv"):
        done = moestab("analyze", str(run), option, str(run / schema.METRICS_JSONL), cwd=tmp_path)
        assert done.returncode == 2, done
        assert f"would replace run {run}'s metrics.jsonl" in done.stderr and "Traceback" not in done.stderr
    assert (run / schema.METRICS_JSONL).read_bytes() == before


def test_probe_refuses_to_write_over_a_checkpoints_config_before_any_work(tmp_path):
    model = a_model_folder(tmp_path / "ckpt")
    other = a_model_folder(tmp_path / "ckpt2")
    done = moestab("probe", "compare", str(model), str(other), "--json", str(model / "config.json"), cwd=tmp_path)
    assert done.returncode == 2, done
    assert "would replace model folder" in done.stderr and "config.json" in done.stderr, done.stderr
    assert (model / "config.json").read_text() == '{"model_type": "qwen3_moe"}'


def test_a_created_folder_is_said(tmp_path, capsys):
    from moestab.commands.output import emit

    emit("{}", str(tmp_path / "made" / "out.json"))
    assert f"created the folder {tmp_path / 'made'}" in capsys.readouterr().err
    emit("[]", str(tmp_path / "made" / "out.json"))  # replaced, as documented; nothing created this time
    assert capsys.readouterr().err == "" and (tmp_path / "made" / "out.json").read_text() == "[]\n"


def test_a_link_to_a_runs_file_is_judged_by_its_target(tmp_path):
    run = a_run(tmp_path / "run").path
    link = tmp_path / "summary.json"
    link.symlink_to(run / schema.RUN_JSON)
    assert owner(link) == f"run {run}'s {schema.RUN_JSON}"  # writing the link would replace run.json


def test_a_probe_folder_is_written_by_rename_not_through_a_planted_link(tmp_path):
    import pandas as pd

    from moestab.probes.folder import PROBE_JSON, ProbeResult, read_probe_folder, write_probe_folder

    victim = tmp_path / "precious.txt"
    victim.write_text("mine")
    out = tmp_path / "probe"
    out.mkdir()
    (out / PROBE_JSON).symlink_to(victim)
    (out / "t.csv").symlink_to(victim)
    result = ProbeResult(probe="compare", checkpoints=[], suite={}, settings={}, tables={"t": pd.DataFrame({"a": [1]})})
    write_probe_folder(result, out)
    assert victim.read_text() == "mine"
    assert not (out / PROBE_JSON).is_symlink() and read_probe_folder(out).tables["t"]["a"].tolist() == [1]


def test_compare_report_refuses_a_runs_own_folders_and_a_file_before_any_work(tmp_path):
    run = a_run(tmp_path / "runs" / "a").path
    inside = run / "checkpoints"
    done = moestab("compare", str(tmp_path / "runs"), "--report", str(inside), cwd=tmp_path)
    assert done.returncode == 2, done
    assert f"would write into run {run}'s checkpoints" in done.stderr and "Traceback" not in done.stderr
    assert not (inside / "report.md").exists()
    (tmp_path / "taken").write_text("mine")
    done = moestab("compare", str(tmp_path / "runs"), "--report", str(tmp_path / "taken"), cwd=tmp_path)
    assert done.returncode == 2 and "is a file; give a folder" in done.stderr, done
    assert (tmp_path / "taken").read_text() == "mine"
