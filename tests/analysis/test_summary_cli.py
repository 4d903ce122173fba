from __future__ import annotations

import csv
import io
import json
import math

import numpy as np
import pytest

from moestab.analysis.errors import NotARunError, RunReadWarning
from moestab.analysis.summary import SUMMARY_COLUMNS, run_summary, summarize_runs
from moestab.records import schema

from .conftest import write_run
from .naive import volatility_metrics


def expected_clip(fake_run) -> tuple[float, float]:
    tokens = clipped = seqs = seqs_clipped = 0
    for cols in fake_run.tokens.values():
        tokens += len(cols[schema.COL_CLIPPED])
        clipped += int(cols[schema.COL_CLIPPED].sum())
        for s in set(cols[schema.COL_SEQ].tolist()):
            seqs += 1
            seqs_clipped += bool(cols[schema.COL_CLIPPED][cols[schema.COL_SEQ] == s].any())
    return clipped / tokens, seqs_clipped / seqs


def test_summary_row(fake_run):
    row = run_summary(fake_run.path)
    assert list(row) == list(SUMMARY_COLUMNS)
    assert (row["run"], row["algo"], row["replay"], row["model"], row["status"]) == (
        "run_a",
        "gspo",
        "R2",
        "embedded",
        "finished",
    )
    assert row["steps"] == 3 and row["final_accuracy"] == 0.75 and row["warm_start_accuracy"] == 0.25
    mean = np.mean
    assert row["old_new_changed"] == pytest.approx(mean([m["routing/old_new/changed"] for m in fake_run.metrics]))
    assert row["rollout_old_changed"] == pytest.approx(0.1)  # 0.05, 0.10, 0.15
    assert row["mismatch_k3"] == pytest.approx(mean([m["mismatch/k3"] for m in fake_run.metrics]))
    token_clip, seq_clip = expected_clip(fake_run)
    assert row["token_clip"] == pytest.approx(token_clip) and row["seq_clip"] == pytest.approx(seq_clip)


def test_final_accuracy_falls_back_to_last_eval(tmp_path):
    run = write_run(tmp_path, status="running", final_accuracy=None)
    assert run_summary(run.path)["final_accuracy"] == 0.625


def test_summary_without_metrics_uses_token_tables(fake_run):
    (fake_run.path / schema.METRICS_JSONL).unlink()
    with pytest.warns(RunReadWarning, match=r"metrics\.jsonl: missing"):
        row = run_summary(fake_run.path)
    cols = list(fake_run.tokens.values())
    old = np.concatenate([c[schema.COL_ROUTES_OLD] for c in cols])
    new = np.concatenate([c[schema.COL_ROUTES_NEW] for c in cols])
    expected = volatility_metrics(old, new)
    assert row["old_new_changed"] == pytest.approx(expected["changed"])
    assert row["old_new_token_flip"] == pytest.approx(expected["token_flip"])
    assert row["steps"] == 3 and row["final_accuracy"] == 0.75


def test_summarize_several_runs(tmp_path):
    a = write_run(tmp_path, "a", seed=1)
    b = write_run(tmp_path, "b", seed=2, steps=2)
    frame = summarize_runs([a.path, b.path])
    assert frame["run"].tolist() == ["a", "b"] and frame["steps"].tolist() == [3, 2]
    with pytest.raises(NotARunError):
        summarize_runs([tmp_path])


def test_cli_table(fake_run, cli_main, capsys):
    assert cli_main(["analyze", str(fake_run.path)]) == 0
    out = capsys.readouterr().out
    assert "run_a" in out and "gspo" in out and "old_new_changed" in out


def test_cli_json_and_csv(tmp_path, cli_main, capsys):
    runs = [write_run(tmp_path, name, seed=i) for i, name in enumerate(["a", "b"])]
    paths = [str(r.path) for r in runs]
    assert cli_main(["analyze", *paths, "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["run"] for r in records] == ["a", "b"] and set(records[0]) == set(SUMMARY_COLUMNS)
    expected = summarize_runs(paths)
    for record, (_, row) in zip(records, expected.iterrows(), strict=True):
        assert record["token_clip"] == pytest.approx(row["token_clip"])
        assert record["old_new_changed"] == pytest.approx(row["old_new_changed"])
    assert cli_main(["analyze", *paths, "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["run"] for r in rows] == ["a", "b"]
    assert float(rows[1]["mismatch_k3"]) == pytest.approx(expected["mismatch_k3"][1])


def test_cli_json_writes_nan_as_null(fake_run, cli_main, capsys):
    raw = dict(fake_run.run_json)
    del raw["warm_start"]
    (fake_run.path / schema.RUN_JSON).write_text(json.dumps(raw))
    assert cli_main(["analyze", str(fake_run.path), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)[0]
    assert record["warm_start_accuracy"] is None


def test_cli_plots(tmp_path, cli_main, capsys):
    runs = [write_run(tmp_path, name, seed=i) for i, name in enumerate(["a", "b"])]
    out = tmp_path / "figs"
    assert cli_main(["analyze", *(str(r.path) for r in runs), "--plots", str(out)]) == 0
    expected = {"curves.png", "volatility_old_new.png", "volatility_rollout_old.png", "ratios.png", "attribution.png"}
    for name in ("a", "b"):
        assert {p.name for p in (out / name).iterdir()} == expected
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote 5 figure(s)" in capsys.readouterr().err


def test_cli_not_a_run(tmp_path, cli_main, capsys):
    assert cli_main(["analyze", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "no run.json" in err and "no readable run" in err


def test_cli_reports_bad_run_and_summarises_the_good_one(tmp_path, cli_main, capsys):
    good = write_run(tmp_path, "good")
    assert cli_main(["analyze", str(tmp_path / "nothing"), str(good.path), "--json"]) == 0
    captured = capsys.readouterr()
    assert [r["run"] for r in json.loads(captured.out)] == ["good"]
    assert "nothing is not a moestab run folder" in captured.err


def test_cli_corrupt_parquet(fake_run, cli_main, capsys):
    (fake_run.path / schema.tokens_file(2)).write_bytes(b"garbage")
    assert cli_main(["analyze", str(fake_run.path), "--json"]) == 0
    captured = capsys.readouterr()
    assert "warning" in captured.err and "step_000002.parquet" in captured.err
    record = json.loads(captured.out)[0]
    # Clip fractions from the readable steps 1 and 3 only.
    steps = {k: v for k, v in fake_run.tokens.items() if k != 2}
    clipped = np.concatenate([c[schema.COL_CLIPPED] for c in steps.values()])
    assert record["token_clip"] == pytest.approx(clipped.mean())


def test_cli_missing_metrics(fake_run, cli_main, capsys, tmp_path):
    (fake_run.path / schema.METRICS_JSONL).unlink()
    assert cli_main(["analyze", str(fake_run.path), "--csv", "--plots", str(tmp_path / "figs")]) == 0
    captured = capsys.readouterr()
    assert "metrics.jsonl: missing" in captured.err
    assert next(csv.DictReader(io.StringIO(captured.out)))["steps"] == "3"
    written = {p.name for p in (tmp_path / "figs" / "run_a").iterdir()}
    assert "curves.png" not in written and "volatility_old_new.png" in written  # heatmap from the tokens


def test_cli_newer_schema(fake_run, cli_main, capsys):
    raw = dict(fake_run.run_json, schema_version=schema.SCHEMA_VERSION + 1)
    (fake_run.path / schema.RUN_JSON).write_text(json.dumps(raw))
    assert cli_main(["analyze", str(fake_run.path)]) == 1
    assert "newer" in capsys.readouterr().err


def test_cli_run_with_only_run_json(tmp_path, cli_main, capsys):
    run = write_run(tmp_path)
    for path in sorted(run.path.rglob("*"), reverse=True):
        if path.name != schema.RUN_JSON:
            path.unlink() if path.is_file() else path.rmdir()
    assert cli_main(["analyze", str(run.path), "--json"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)[0]
    assert record["steps"] == 3 and record["token_clip"] is None
    assert math.isclose(record["final_accuracy"], 0.75)
    assert "metrics.jsonl: missing" in captured.err
