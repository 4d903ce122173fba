from __future__ import annotations

import csv
import io
import json
import math

import numpy as np
import pytest

from moestab.analysis.summary import SUMMARY_COLUMNS, SUMMARY_KEYS, run_summary, summarize_runs
from moestab.run_folder import schema
from moestab.run_folder.errors import NotARunError, RunFileError, SchemaVersionError
from tests.support.naive import volatility_metrics
from tests.support.runs import write_run


def step_clip(cols) -> tuple[float, float]:
    """Token and sequence clipped shares of one step's tokens, over minibatches 2..n, with plain loops."""
    later = cols[schema.COL_MINIBATCH] > 0
    clipped, seq = cols[schema.COL_CLIPPED][later], cols[schema.COL_SEQ][later]
    seqs = sorted(set(seq.tolist()))
    return float(clipped.mean()), float(np.mean([clipped[seq == s].any() for s in seqs]))


def test_summary_row(fake_run):
    row = run_summary(fake_run.path)
    assert list(row) == list(SUMMARY_COLUMNS)
    assert (row["run"], row["algo"], row["replay"], row["model"], row["status"]) == (
        "run_a",
        "gspo",
        "R3",
        "embedded",
        "finished",
    )
    assert row["steps"] == 3 and row["final_accuracy"] == 0.75 and row["warm_start_accuracy"] == 0.25
    for column, key in SUMMARY_KEYS.items():  # every stability column is the step mean of its key
        assert row[column] == pytest.approx(np.mean([m[key] for m in fake_run.metrics])), column
    assert row["rollout_old_free_router_flip"] == pytest.approx(0.16)  # 0.08, 0.16, 0.24
    assert row["rollout_old_router_flip"] == 0.0


def test_final_accuracy_falls_back_to_last_eval(tmp_path):
    run = write_run(tmp_path, status="running", final_accuracy=None)
    assert run_summary(run.path)["final_accuracy"] == 0.625


def test_summary_without_metrics_uses_token_tables(fake_run):
    (fake_run.path / schema.METRICS_JSONL).unlink()
    with pytest.raises(RunFileError, match=r"metrics\.jsonl: missing"):
        run_summary(fake_run.path)  # strict by default
    skipped = []
    row = run_summary(fake_run.path, skipped)
    assert [s.file.name for s in skipped] == [schema.METRICS_JSONL] and "recomputed" in skipped[0].reason
    # Step means of per-step values, each recomputed with Python sets / loops.
    steps = list(fake_run.tokens.values())
    old_new = [volatility_metrics(c[schema.COL_ROUTES_OLD_FREE], c[schema.COL_ROUTES_NEW]) for c in steps]
    free = [volatility_metrics(c[schema.COL_ROUTES_ROLLOUT], c[schema.COL_ROUTES_OLD_FREE]) for c in steps]
    assert row["old_new_changed"] == pytest.approx(np.mean([v["changed"] for v in old_new]))
    assert row["old_new_token_flip"] == pytest.approx(np.mean([v["token_flip"] for v in old_new]))
    assert row["rollout_old_free_router_flip"] == pytest.approx(np.mean([v["router_flip"] for v in free]))
    d = [c[schema.COL_LOGP_OLD_FREE].astype(np.float64) - c[schema.COL_LOGP_ROLLOUT] for c in steps]
    assert row["rollout_old_free_k3"] == pytest.approx(np.mean([np.mean(np.exp(x) - 1 - x) for x in d]), rel=1e-9)
    clips = [step_clip(c) for c in steps]
    assert row["clip_token_frac_later"] == pytest.approx(np.mean([c[0] for c in clips]))
    assert row["clip_seq_frac_later"] == pytest.approx(np.mean([c[1] for c in clips]))
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
        assert record["clip_token_frac_later"] == pytest.approx(row["clip_token_frac_later"])
        assert record["old_new_changed"] == pytest.approx(row["old_new_changed"])
    assert cli_main(["analyze", *paths, "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["run"] for r in rows] == ["a", "b"]
    assert float(rows[1]["rollout_old_free_k3"]) == pytest.approx(expected["rollout_old_free_k3"][1])


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
    expected = {"curves.png", "volatility_old_new.png", "volatility_rollout_old.png",
                "volatility_rollout_old_free.png", "ratios.png", "attribution.png"}
    for name in ("a", "b"):
        assert {p.name for p in (out / name).iterdir()} == expected
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote 6 figure(s)" in capsys.readouterr().err


def test_cli_not_a_run(tmp_path, cli_main, capsys):
    assert cli_main(["analyze", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "no run.json" in err and "no readable run" in err


def test_cli_reports_bad_run_and_summarises_the_good_one(tmp_path, cli_main, capsys):
    good = write_run(tmp_path, "good")
    assert cli_main(["analyze", str(tmp_path / "nothing"), str(good.path), "--json"]) == 1  # an error all the same
    captured = capsys.readouterr()
    assert [r["run"] for r in json.loads(captured.out)] == ["good"]
    assert "nothing is not a moestab run folder" in captured.err


def test_cli_corrupt_parquet_without_metrics(fake_run, cli_main, capsys):
    (fake_run.path / schema.METRICS_JSONL).unlink()
    (fake_run.path / schema.tokens_file(2)).write_bytes(b"garbage")
    assert cli_main(["analyze", str(fake_run.path), "--json"]) == 0
    captured = capsys.readouterr()
    assert "warning: skipped" in captured.err and "step_000002.parquet" in captured.err
    record = json.loads(captured.out)[0]
    # Clip fractions from the readable steps 1 and 3 only.
    clips = [step_clip(c) for step, c in fake_run.tokens.items() if step != 2]
    assert record["clip_token_frac_later"] == pytest.approx(np.mean([c[0] for c in clips]))


def test_cli_torn_metrics_line_is_reported_with_its_line_number(fake_run, cli_main, capsys):
    with (fake_run.path / schema.METRICS_JSONL).open("a") as f:
        f.write('{"step": 4, "reward/me')  # what a kill during an append leaves
    assert cli_main(["analyze", str(fake_run.path), "--json"]) == 0
    captured = capsys.readouterr()
    assert "metrics.jsonl, line 4: line 4 is not valid JSON" in captured.err
    assert json.loads(captured.out)[0]["steps"] == 3


def test_old_schema_is_refused_with_a_reason(fake_run, cli_main, capsys):
    raw = dict(fake_run.run_json, schema_version=1)
    (fake_run.path / schema.RUN_JSON).write_text(json.dumps(raw))
    with pytest.raises(SchemaVersionError, match="older moestab"):
        run_summary(fake_run.path)
    assert cli_main(["analyze", str(fake_run.path)]) == 1
    assert "Re-run it" in capsys.readouterr().err


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
    assert record["steps"] == 3 and record["clip_token_frac"] is None
    assert math.isclose(record["final_accuracy"], 0.75)
    assert "metrics.jsonl: missing" in captured.err


def test_a_run_whose_steps_repeat_is_damaged_never_finished(fake_run, cli_main, capsys):
    # What two writers of one folder left: run.json says finished, metrics.jsonl holds both writers' steps 1, 2.
    lines = (fake_run.path / schema.METRICS_JSONL).read_text().splitlines()[:2]
    (fake_run.path / schema.METRICS_JSONL).write_text("\n".join(lines * 2) + "\n")
    assert json.loads((fake_run.path / schema.RUN_JSON).read_text())["status"] == "finished"
    row = run_summary(fake_run.path)
    assert row["status"] == "damaged" and "line 3 is step 1, after step 2 on line 2" in row["damage"]
    assert cli_main(["analyze", str(fake_run.path), "--json"]) == 1  # the summary is printed, the status says it
    captured = capsys.readouterr()
    (record,) = json.loads(captured.out)
    assert record["status"] == "damaged" and record["damage"] == row["damage"]
    assert f"error: {fake_run.path} is damaged: " in captured.err and "two writers" in captured.err
    assert cli_main(["analyze", str(fake_run.path)]) == 1  # the text table too
    captured = capsys.readouterr()
    assert "damaged" in captured.out and "finished" not in captured.out and "is damaged" in captured.err


def test_an_undamaged_run_has_no_damage(fake_run, cli_main, capsys):
    assert run_summary(fake_run.path)["damage"] is None
    assert cli_main(["analyze", str(fake_run.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["damage"] is None


# ---- probe folders beside runs (`moestab analyze runs/*`), and the exit status ----


def probe_folder(path):
    """A small probe folder at ``path``, as `moestab probe compare ... --out PATH` writes one."""
    import pandas as pd

    from moestab.probes import ProbeResult, write_probe_folder

    result = ProbeResult("compare", ["a=/m/a", "b=/m/b"], {"name": "general", "count": 2, "sha256": "0" * 64},
                         {"dtype": "float32"}, {"summary": pd.DataFrame({"tokens": [12], "router_flip": [0.25]})})
    return write_probe_folder(result, path)


def test_readmes_runs_glob_skips_probe_folders_with_a_note(tmp_path, cli_main, capsys):
    runs = tmp_path / "runs"
    write_run(runs, "a")
    write_run(runs, "b", seed=1)
    probe_folder(runs / "probes" / "compare-ab")  # runs/probes: where README puts them
    probe_folder(runs / "one-probe")
    assert cli_main(["analyze", *sorted(str(p) for p in runs.iterdir()), "--json"]) == 0
    captured = capsys.readouterr()
    assert [r["run"] for r in json.loads(captured.out)] == ["a", "b"]
    notes = [line for line in captured.err.splitlines() if "note: skipped" in line]
    assert len(notes) == 2 and "error" not in captured.err, captured.err
    assert f"{runs / 'probes'} holds 1 probe folder(s), not a run: compare-ab (compare)" in notes[1]
    assert f"{runs / 'one-probe'} is a probe folder (compare), not a run" in notes[0]


def test_a_folder_that_is_neither_run_nor_probe_folder_is_an_error(tmp_path, cli_main, capsys):
    good = write_run(tmp_path, "good")
    (tmp_path / "notes").mkdir()
    (tmp_path / "log.txt").write_text("hello")
    for other in ("notes", "log.txt"):
        assert cli_main(["analyze", str(good.path), str(tmp_path / other), "--json"]) == 1
        captured = capsys.readouterr()
        assert [r["run"] for r in json.loads(captured.out)] == ["good"]  # the readable run is still summarised
        assert f"error: {tmp_path / other} is not a moestab run folder" in captured.err
        assert "give run folders written by `moestab train`" in captured.err


def test_an_unreadable_run_is_an_error(tmp_path, cli_main, capsys):
    good, newer = write_run(tmp_path, "good"), write_run(tmp_path, "newer")
    newer_json = dict(newer.run_json, schema_version=schema.SCHEMA_VERSION + 1)
    (newer.path / schema.RUN_JSON).write_text(json.dumps(newer_json))
    assert cli_main(["analyze", str(good.path), str(newer.path)]) == 1
    captured = capsys.readouterr()
    assert "good" in captured.out and "newer" in captured.err


def test_probe_folders_only_is_no_run(tmp_path, cli_main, capsys):
    probe_folder(tmp_path / "p")
    assert cli_main(["analyze", str(tmp_path / "p")]) == 1
    err = capsys.readouterr().err
    assert "note: skipped" in err and "no readable run among the folders given" in err


# ---- --json / --csv: FILE given -> written there, no FILE -> stdout (the same in `moestab probe`) ----


def test_json_and_csv_go_to_files_and_the_table_to_stdout(tmp_path, cli_main, capsys):
    run = write_run(tmp_path, "a")
    js, table = tmp_path / "out" / "summary.json", tmp_path / "out" / "summary.csv"
    assert cli_main(["analyze", str(run.path), "--json", str(js), "--csv", str(table)]) == 0
    captured = capsys.readouterr()
    assert "old_new_changed" in captured.out and not captured.out.lstrip().startswith("[")  # the text table
    (record,) = json.loads(js.read_text())
    row = next(csv.DictReader(io.StringIO(table.read_text())))
    assert record["run"] == row["run"] == "a" and float(row["old_new_changed"]) == pytest.approx(
        record["old_new_changed"])


def test_json_to_stdout_with_csv_to_a_file(tmp_path, cli_main, capsys):
    run = write_run(tmp_path, "a")
    assert cli_main(["analyze", str(run.path), "--csv", str(tmp_path / "s.csv"), "--json"]) == 0
    assert [r["run"] for r in json.loads(capsys.readouterr().out)] == ["a"]  # stdout is the JSON only
    assert (tmp_path / "s.csv").read_text().startswith("run,")
    assert cli_main(["analyze", str(run.path), "--json", "-"]) == 0  # '-' is stdout too
    assert json.loads(capsys.readouterr().out)[0]["run"] == "a"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--json", "--csv"], "--json and --csv both go to stdout; give one of them a FILE"),
        (["--csv", "{tmp}"], "--csv {tmp} is a folder; give a file, or no FILE for stdout"),
        (["--json", "{run}"], "--json {run} is a folder"),  # `analyze --json RUN`: RUN taken as FILE
        (["--json", "{file}/x.json"], "{file} is a file, not a folder"),
    ],
)
def test_json_and_csv_targets_that_cannot_be_written_are_refused(tmp_path, cli_main, capsys, args, expected):
    run = write_run(tmp_path, "a")
    (tmp_path / "file").write_text("x")
    fill = {"tmp": str(tmp_path), "run": str(run.path), "file": str(tmp_path / "file")}
    assert cli_main(["analyze", str(run.path), *(a.format(**fill) for a in args)]) == 2
    captured = capsys.readouterr()
    assert expected.format(**fill) in captured.err and captured.out == ""


def test_sampling_error_is_blank_where_none_applies_and_combined_where_sampled(fake_run, cli_main, capsys):
    """Without a measurement budget's sampled keys no sampling error applies: the ``_se`` columns are NaN (null in
    JSON, empty in CSV), not 0. With them, the steps' errors combined: sqrt(sum se^2) / steps."""
    row = run_summary(fake_run.path)
    assert math.isnan(row["old_new_changed_se"]) and math.isnan(row["old_new_router_flip_se"])
    assert cli_main(["analyze", str(fake_run.path), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)[0]
    assert record["old_new_changed_se"] is None and record["old_new_changed"] is not None
    assert cli_main(["analyze", str(fake_run.path), "--csv"]) == 0
    assert next(csv.DictReader(io.StringIO(capsys.readouterr().out)))["old_new_changed_se"] == ""

    # Sampled steps 1 and 3 (se 0.03 and 0.04), step 2 unmeasured (no key): sqrt(0.03^2 + 0.04^2) / 2 = 0.025.
    lines = [json.loads(line) for line in (fake_run.path / schema.METRICS_JSONL).read_text().splitlines()]
    lines[0]["routing/old_new/changed_se"], lines[2]["routing/old_new/changed_se"] = 0.03, 0.04
    (fake_run.path / schema.METRICS_JSONL).write_text("".join(json.dumps(line) + "\n" for line in lines))
    row = run_summary(fake_run.path)
    assert row["old_new_changed_se"] == pytest.approx(0.025, rel=1e-12)
    assert math.isnan(row["old_new_router_flip_se"])  # its key is still absent


def test_steps_window_averages_every_run_over_the_same_steps(tmp_path, cli_main, capsys):
    """``--steps 2:3``: the step means over steps 2 and 3 only, by hand from metrics.jsonl's lines."""
    run = write_run(tmp_path, "a")
    by_step = {m["step"]: m for m in run.metrics}
    row = run_summary(run.path, steps=(2, 3))
    for column, key in (("old_new_changed", "routing/old_new/changed"), ("rollout_old_free_router_flip",
                                                                         "routing/rollout_old_free/router_flip")):
        assert row[column] == pytest.approx((by_step[2][key] + by_step[3][key]) / 2, rel=1e-12), column
    assert row["rollout_old_free_router_flip"] == pytest.approx(0.2)  # (0.16 + 0.24) / 2, not 0.16 over steps 1-3
    assert row["measured_steps"] == 2 and row["steps"] == 3  # steps: still how far the run got
    assert cli_main(["analyze", str(run.path), "--steps", "2:3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["old_new_changed"] == pytest.approx(row["old_new_changed"])
    for bad in ("3:2", "0:2", "2", "a:b"):
        with pytest.raises(SystemExit):
            cli_main(["analyze", str(run.path), "--steps", bad])
        assert "FIRST:LAST" in capsys.readouterr().err


def test_a_folder_of_runs_is_searched_as_the_dashboard_searches_it(tmp_path, cli_main, capsys):
    """`moestab analyze runs` and `moestab analyze runs/*` with runs one and two levels down (issue 54.1)."""
    runs = tmp_path / "runs"
    write_run(runs, "quick")
    write_run(runs / "short" / "grpo", "seed-1")
    write_run(runs / "short" / "gspo", "seed-1", seed=1)  # the same name in two sweeps
    probe_folder(runs / "probes" / "compare-ab")
    assert cli_main(["analyze", str(runs), "--json"]) == 0
    captured = capsys.readouterr()
    found = [r["run"] for r in json.loads(captured.out)]
    assert found == [str(runs / "quick"), str(runs / "short" / "grpo" / "seed-1"),
                     str(runs / "short" / "gspo" / "seed-1")]  # named by path: two are seed-1
    assert f"{runs} holds 3 run folder(s) (searched 3 levels down)" in captured.err
    assert cli_main(["analyze", *sorted(str(p) for p in runs.iterdir()), "--json"]) == 0
    captured = capsys.readouterr()
    assert len(json.loads(captured.out)) == 3 and "error" not in captured.err
    deep = runs / "a" / "b" / "c" / "d"
    write_run(deep, "too-deep")
    assert cli_main(["analyze", str(runs), "--json"]) == 0
    assert "1 lie deeper and are left out" in capsys.readouterr().err


def test_plots_into_a_file_is_refused_before_anything_is_read(tmp_path, cli_main, capsys):
    """Issue 55.7: `moestab analyze RUN --plots FILE` ended in a NotADirectoryError traceback."""
    run = write_run(tmp_path, "a")
    target = tmp_path / "figures.png"
    target.write_text("the user's")
    assert cli_main(["analyze", str(run.path), "--plots", str(target)]) == 2
    err = capsys.readouterr().err
    assert f"--plots {target} is a file; give a folder" in err and "Traceback" not in err
    assert target.read_text() == "the user's"
