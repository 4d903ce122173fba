"""moestab.analysis.dashboard_data: hand-worked cases and cross-checks against the whole-array analyzers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from moestab.analysis import NotARunError, RunFileError
from moestab.analysis.dashboard_data import (
    METRICS_SOURCE,
    TOKENS_SOURCE,
    changed_by_layer_step,
    find_runs,
    grid_frame,
    load_at_step,
    margin_bin_centres,
    matrix_frame,
    metric_curve,
    routing_by_step,
    run_coactivation,
    run_fingerprint,
    run_overview,
    runs_too_deep,
    shared_histograms,
    stack_runs,
)
from moestab.analysis.experts import coactivation
from moestab.analysis.ratios import histogram
from moestab.run_folder import schema


def write_run_json(folder: Path, **extra) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    body = {
        "schema_version": schema.SCHEMA_VERSION,
        "status": "finished",
        "config": {"algo": "gspo", "routing_replay": "off", "steps": 4, "model": "embedded"},
        "model": {"family": "qwen3_moe", "moe_layers": [0, 1], "num_experts": 4, "top_k": 2,
                  "recorded_layers": [0, 1]},
        "last_step": 2,
        "updated": "2025-01-01T00:00:00+00:00",
        **extra,
    }
    (folder / schema.RUN_JSON).write_text(json.dumps(body))
    return folder


def write_routes(run: Path, step: int, routes: np.ndarray) -> None:
    """A per-token table with only the ``routes_old_free`` column, ``routes`` ``[rows, layers, top_k]``."""
    (run / schema.TOKENS_DIR).mkdir(exist_ok=True)
    flat = pa.array(routes.reshape(-1).astype(np.int16), type=pa.int16())
    column = pa.FixedSizeListArray.from_arrays(flat, routes.shape[1] * routes.shape[2])
    steps = pa.array(np.full(len(routes), step, np.int32))
    table = pa.table({schema.COL_ROUTES_OLD_FREE: column, schema.COL_STEP: steps})
    pq.write_table(table, run / schema.tokens_file(step), row_group_size=2)


# -- find_runs ------------------------------------------------------------------------------------


def test_find_runs_lists_run_folders_without_entering_them(tmp_path: Path) -> None:
    a = write_run_json(tmp_path / "a")
    b = write_run_json(tmp_path / "sweep" / "b")
    deep = write_run_json(tmp_path / "x" / "y" / "z" / "too-deep")  # depth 4 > max_depth 3
    write_run_json(a / "tokens" / "inner")  # inside a run: never a run of its own
    write_run_json(tmp_path / ".hidden")
    (tmp_path / "not-a-run").mkdir()
    assert find_runs(tmp_path) == [a, b]
    assert find_runs(tmp_path, max_depth=4) == [a, b, deep]
    assert find_runs(tmp_path, max_depth=1) == [a]
    assert find_runs(a) == [a]  # a run folder given directly


def test_runs_below_the_search_depth_are_named_not_lost(tmp_path: Path) -> None:
    write_run_json(tmp_path / "a")
    four = write_run_json(tmp_path / "x" / "y" / "z" / "four")  # depth 4
    six = write_run_json(tmp_path / "p" / "q" / "r" / "s" / "t" / "six")  # depth 6
    write_run_json(tmp_path / "p" / "q" / "r" / "s" / "t" / "u" / "seven")  # depth 7: beyond 3 + 3, not walked to
    write_run_json(four / "tokens" / "inner")  # inside a run: never a run of its own
    assert runs_too_deep(tmp_path) == [six, four]  # sorted by path: p/... before x/...
    assert runs_too_deep(tmp_path, max_depth=3, further=1) == [four]
    assert runs_too_deep(tmp_path, max_depth=6) == [tmp_path / "p" / "q" / "r" / "s" / "t" / "u" / "seven"]
    assert runs_too_deep(tmp_path / "a") == []  # a run folder given directly
    with pytest.raises(ValueError, match="further"):
        runs_too_deep(tmp_path, further=-1)


def test_find_runs_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        find_runs(tmp_path / "missing")
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        find_runs(tmp_path / "file")
    assert find_runs(tmp_path) == []


# -- run_fingerprint ------------------------------------------------------------------------------


def test_fingerprint_changes_with_every_file_read(tmp_path: Path) -> None:
    run = write_run_json(tmp_path / "run")
    first = run_fingerprint(run)
    assert [name for name, _, _ in first] == ["run.json"]
    (run / schema.METRICS_JSONL).write_text('{"step": 1}\n')
    second = run_fingerprint(run)
    assert [name for name, _, _ in second] == ["metrics.jsonl", "run.json"]
    with (run / schema.METRICS_JSONL).open("a") as f:  # a new step: size changes
        f.write('{"step": 2}\n')
    third = run_fingerprint(run)
    assert third != second
    # Same size, new time (a rewritten run.json) also counts.
    stat = (run / schema.RUN_JSON).stat()
    os.utime(run / schema.RUN_JSON, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert run_fingerprint(run) != third
    write_routes(run, 1, np.zeros((2, 2, 2), np.int16))
    with_table = run_fingerprint(run)
    assert "tokens/" in [name for name, _, _ in with_table]  # the folder: its time and its tables' names and inodes
    write_routes(run, 2, np.zeros((2, 2, 2), np.int16))
    assert run_fingerprint(run) != with_table  # a table added
    two = run_fingerprint(run)
    (run / "tokens" / "step_000002.parquet").unlink()
    assert run_fingerprint(run) != two  # a table removed (a resume drops the tables after its checkpoint)
    kept = run_fingerprint(run)
    (run / "elsewhere").mkdir()
    write_routes(run / "elsewhere", 1, np.ones((2, 2, 2), np.int16))
    os.replace(run / "elsewhere" / schema.tokens_file(1), run / schema.tokens_file(1))  # renamed over its namesake
    assert run_fingerprint(run) != kept  # within one tick of the clock too: the name's inode changed
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "x").write_text("not read by the analyzers")
    assert run_fingerprint(run) == run_fingerprint(run)


# -- run_overview ---------------------------------------------------------------------------------


def test_run_overview_adds_planned_steps_time_and_error(tmp_path: Path) -> None:
    run = write_run_json(tmp_path / "run", status="failed", error="CUDA out of memory")
    (run / schema.METRICS_JSONL).write_text('{"step": 1, "routing/old_new/changed": 0.5}\n')
    row = run_overview(run)
    assert row["planned_steps"] == 4
    assert row["updated"] == "2025-01-01T00:00:00+00:00"
    assert row["error"] == "CUDA out of memory"
    assert row["status"] == "failed"
    assert row["steps"] == 2  # run.json last_step
    assert row["old_new_changed"] == 0.5
    assert (row["first_step"], row["last_step"]) == (1, 1)  # the steps its means cover: metrics.jsonl's


def test_run_overview_says_which_steps_its_means_cover(tmp_path: Path) -> None:
    run = write_run_json(tmp_path / "run")
    (run / schema.METRICS_JSONL).write_text("".join(
        json.dumps({"step": step, "routing/old_new/changed": 0.1 * step}) + "\n" for step in (1, 2, 3)))
    row = run_overview(run)
    assert (row["first_step"], row["last_step"]) == (1, 3)
    assert row["old_new_changed"] == pytest.approx(0.2)  # (0.1 + 0.2 + 0.3) / 3: over those steps
    (run / schema.METRICS_JSONL).unlink()
    empty = run_overview(run, skipped=[])
    assert (empty["first_step"], empty["last_step"]) == (None, None)


def test_run_overview_of_unusable_runs(tmp_path: Path) -> None:
    with pytest.raises(NotARunError):
        run_overview(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / schema.RUN_JSON).write_text("{")
    with pytest.raises(RunFileError, match=r"run\.json"):
        run_overview(bad)
    odd = write_run_json(tmp_path / "odd", config={"steps": 4})  # no algo / replay / model
    with pytest.raises(RunFileError, match="config lacks 'algo'"):
        run_overview(odd)


# -- run_coactivation -----------------------------------------------------------------------------


def test_run_coactivation_hand_worked(tmp_path: Path) -> None:
    run = write_run_json(tmp_path / "run")
    # Layer 0 decisions: {0,1}, {0,2} in step 1; {2,1} and one unrecorded in step 2 (4 experts).
    write_routes(run, 1, np.array([[[0, 1], [3, 2]], [[2, 0], [3, 2]]]))
    write_routes(run, 2, np.array([[[2, 1], [1, 0]], [[-1, 3], [1, 0]]]))
    c = run_coactivation(run, 0)
    # N(0)=2, N(1)=2, N(2)=2, N(3)=0; N(0,1)=1, N(0,2)=1, N(1,2)=1.
    expected = np.array(
        [
            [1.0, 0.5, 0.5, 0.0],
            [0.5, 1.0, 0.5, 0.0],
            [0.5, 0.5, 1.0, 0.0],
            [np.nan] * 4,  # expert 3 never chosen in layer 0 (its one slot was in an unrecorded decision)
        ]
    )
    np.testing.assert_allclose(c, expected)
    # Layer 1: {3,2} twice, {1,0} twice: experts pair up only with their partner.
    c1 = run_coactivation(run, 1)
    np.testing.assert_allclose(c1[3], [0, 0, 1, 1])
    np.testing.assert_allclose(c1[0], [1, 1, 0, 0])


def test_run_coactivation_streamed_equals_whole_array(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    run = write_run_json(tmp_path / "run")
    parts = []
    for step in (1, 2, 3):
        routes = np.argsort(rng.random((37, 2, 4)), axis=2)[:, :, :2].astype(np.int16)  # [37, 2, 2] distinct
        routes[rng.random(37) < 0.1, 1, 0] = -1
        write_routes(run, step, routes)
        parts.append(routes)
    whole = np.concatenate(parts)
    for layer in (0, 1):
        np.testing.assert_allclose(run_coactivation(run, layer, batch_rows=5), coactivation(whole, 4, layer))


def test_run_coactivation_without_tables_or_model(tmp_path: Path) -> None:
    assert run_coactivation(write_run_json(tmp_path / "empty"), 0) is None
    no_model = write_run_json(tmp_path / "no-model", model={})
    with pytest.raises(RunFileError, match="does not follow the run format"):
        run_coactivation(no_model, 0)


# -- shared_histograms ----------------------------------------------------------------------------


def test_shared_histograms_hand_worked() -> None:
    # limit 1, 4 bins: [-1,-.5), [-.5,0), [0,.5), [.5,1]; outliers land in the end bins.
    hists = shared_histograms({"a": np.array([-3.0, -0.2, 0.1, 0.2, np.nan]), "b": np.array([0.7])}, bins=4, limit=1)
    a = hists[hists["run"] == "a"]
    assert a["count"].tolist() == [1, 1, 2, 0]
    np.testing.assert_allclose(a["share"], [0.25, 0.25, 0.5, 0.0])
    b = hists[hists["run"] == "b"]
    assert b["count"].tolist() == [0, 0, 0, 1]
    assert (a["left"].to_numpy() == b["left"].to_numpy()).all()  # the same bins for every run


def test_shared_histograms_default_limit_pools_runs() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(0, 0.1, 500), rng.normal(0, 2.0, 500)
    hists = shared_histograms({"a": a, "b": b}, bins=10)
    # The pooled limit is what `histogram` picks for the pooled values.
    pooled = histogram(np.concatenate([a, b]), 10)
    np.testing.assert_allclose(hists[hists["run"] == "a"]["left"], pooled["left"])
    assert hists.groupby("run")["count"].sum().tolist() == [500, 500]
    empty = shared_histograms({"none": np.array([np.nan])}, bins=3)
    assert empty["count"].sum() == 0 and empty["share"].isna().all()
    assert list(shared_histograms({}).columns) == ["run", "left", "right", "count", "share"]


# -- tidy frames of the charts --------------------------------------------------------------------


def test_stack_runs_labels_rows_in_order() -> None:
    a = pd.DataFrame({"step": [1, 2], "value": [0.5, 0.25]})
    b = pd.DataFrame({"step": [1], "value": [1.0], "run": ["ignored: replaced by the key"]})
    stacked = stack_runs({"z-run": a, "a-run": b})
    assert list(stacked.columns) == ["run", "step", "value"]
    assert stacked["run"].tolist() == ["z-run", "z-run", "a-run"]  # the mapping's order, not sorted
    assert stacked["value"].tolist() == [0.5, 0.25, 1.0]
    assert list(stack_runs({"f": a}, column="folder").columns) == ["folder", "step", "value"]
    assert list(stack_runs({}).columns) == ["run"] and stack_runs({}).empty


def test_metric_curve_keeps_logged_steps_and_puts_the_start_at_step_0() -> None:
    metrics = pd.DataFrame({"step": [1, 2, 3, 4], "eval/accuracy": [None, 0.5, None, "0.75"], "loss": [1, 2, 3, 4]})
    curve = metric_curve(metrics, "eval/accuracy", start=0.25)
    assert curve["step"].tolist() == [0, 2, 4]
    assert curve["value"].tolist() == [0.25, 0.5, 0.75]
    assert metric_curve(metrics, "loss")["value"].tolist() == [1.0, 2.0, 3.0, 4.0]
    missing = metric_curve(metrics, "reward/mean", start=0.1)
    assert missing.empty and list(missing.columns) == ["step", "value"]


def test_changed_by_layer_step_prefers_metrics_then_the_tables() -> None:
    metrics = pd.DataFrame({"step": [1, 2], "routing/old_new/changed_by_layer": [[0.1, 0.2], [0.3, None]]})
    table = pd.DataFrame({"step": [1], "layer": [5], "changed": [0.9], "routers": [10]})
    frame, source = changed_by_layer_step(metrics, table, "old_new")
    assert source == METRICS_SOURCE
    assert frame.to_dict("list") == {"step": [1, 1, 2], "layer": [0, 1, 0], "changed": [0.1, 0.2, 0.3]}
    frame, source = changed_by_layer_step(metrics, table, "rollout_old_free")  # not in metrics.jsonl
    assert source == TOKENS_SOURCE
    assert frame.to_dict("list") == {"step": [1], "layer": [5], "changed": [0.9]}
    assert changed_by_layer_step(None, None, "old_new") == (None, "")
    assert changed_by_layer_step(metrics, table.iloc[:0], "update_old") == (None, "")


def test_routing_by_step_prefers_metrics_then_the_tables() -> None:
    metrics = pd.DataFrame({"step": [1, 2], "routing/old_new/router_flip": [0.1, 0.2]})
    by_step = pd.DataFrame({"step": [1, 2], "changed": [0.3, 0.4], "router_flip": [0.5, 0.6]})
    frame, source = routing_by_step(metrics, by_step, "old_new", "router_flip")
    assert (frame["value"].tolist(), source) == ([0.1, 0.2], METRICS_SOURCE)
    frame, source = routing_by_step(metrics, by_step, "old_new", "changed")
    assert (frame["value"].tolist(), source) == ([0.3, 0.4], TOKENS_SOURCE)
    assert routing_by_step(None, None, "old_new", "changed") == (None, "")


def test_margin_bin_centres() -> None:
    by_margin = pd.DataFrame({"bin": [0, 1], "margin_low": [0.0, 0.5], "margin_high": [0.5, 2.5],
                              "flip_rate": [0.3, 0.1]})
    centred = margin_bin_centres(by_margin)
    assert list(centred.columns) == ["margin", "bin", "margin_low", "margin_high", "flip_rate"]
    assert centred["margin"].tolist() == [0.25, 1.5]
    assert centred["flip_rate"].tolist() == [0.3, 0.1]


def test_load_at_step_takes_the_last_logged_step_before() -> None:
    load = pd.DataFrame({"step": [2, 2, 4, 4], "layer": [0, 0, 0, 0], "expert": [0, 1, 0, 1],
                         "load": [0.5, 0.5, 0.9, 0.1]})
    assert load_at_step(load, 4)[0] == 4
    shown, rows = load_at_step(load, 3)  # no step 3: step 2
    assert shown == 2 and rows.to_dict("list") == {"layer": [0, 0], "expert": [0, 1], "load": [0.5, 0.5]}
    assert load_at_step(load, 1)[0] == 2  # nothing before: the first step
    with pytest.raises(ValueError, match="no expert load"):
        load_at_step(load.iloc[:0], 1)


def test_matrix_and_grid_frames_one_row_per_cell() -> None:
    tidy = matrix_frame(np.array([[1.0, 0.5], [np.nan, 1.0]]), "i", "j", "share")
    assert tidy["i"].tolist() == [0, 0, 1, 1] and tidy["j"].tolist() == [0, 1, 0, 1]
    np.testing.assert_array_equal(tidy["share"], [1.0, 0.5, np.nan, 1.0])
    with pytest.raises(ValueError, match="2-D"):
        matrix_frame(np.zeros(3), "i", "j", "v")
    grid = pd.DataFrame([[0.9, np.nan], [1.0, 1.0]], index=pd.Index(["a@0", "a@6"], name="checkpoint"),
                        columns=pd.Index([0, 3], name="layer"))
    tidy = grid_frame(grid, "saturation")
    assert list(tidy.columns) == ["checkpoint", "layer", "saturation"]
    assert tidy["checkpoint"].tolist() == ["a@0", "a@0", "a@6", "a@6"] and tidy["layer"].tolist() == [0, 3, 0, 3]
    np.testing.assert_array_equal(tidy["saturation"], [0.9, np.nan, 1.0, 1.0])  # NaN kept: a blank cell
    assert list(grid_frame(pd.DataFrame([[1.0]]), "v").columns) == ["row", "column", "v"]
