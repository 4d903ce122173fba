from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from moestab.run_folder import reader as L
from moestab.run_folder import schema
from moestab.run_folder.errors import NotARunError, RunFileError, SchemaVersionError
from tests.support.runs import write_run


@pytest.fixture
def fake_run(tmp_path):
    return write_run(tmp_path)


def test_run_info(fake_run):
    info = L.read_run_info(fake_run.path)
    assert info.name == "run_a" and info.status == "finished"
    assert (info.algo, info.replay, info.replay_label, info.model_name) == ("gspo", "rollout", "R3", "embedded")
    assert (info.num_layers, info.num_experts, info.top_k) == (4, 8, 2)
    assert info.recorded_layers == (0, 2, 3)
    assert (info.last_step, info.warm_start_accuracy, info.final_accuracy) == (3, 0.25, 0.75)


def test_metrics_one_row_per_step(fake_run):
    metrics = L.load_metrics(fake_run.path)
    assert metrics["step"].tolist() == [1, 2, 3]
    assert metrics.loc[0, "eval/accuracy"] == 0.5 and np.isnan(metrics.loc[1, "eval/accuracy"])
    assert metrics.loc[2, "routing/old_new/changed_by_layer"] == fake_run.metrics[2]["routing/old_new/changed_by_layer"]
    assert metrics["reward/mean"].tolist() == pytest.approx([m["reward/mean"] for m in fake_run.metrics])
    both = L.load_runs_metrics([fake_run.path, fake_run.path])
    assert both.columns[0] == "run" and len(both) == 6


def test_listing(fake_run):
    assert L.list_token_files(fake_run.path)["step"].tolist() == [1, 2, 3]
    ckpts = L.list_checkpoints(fake_run.path)
    assert ckpts["step"].tolist() == [2]  # the .tmp folder is not a checkpoint
    assert ckpts["path"][0].name == "step_000002"


def test_streamed_routes_are_zero_copy_and_exact(fake_run):
    path = L.list_token_files(fake_run.path)["path"][0]
    expected = fake_run.tokens[1][schema.COL_ROUTES_OLD]
    parts = []
    batches = list(L.iter_token_batches(path, [schema.COL_ROUTES_OLD, schema.COL_MARGIN_OLD], batch_rows=5))
    assert max(b.num_rows for b in batches) <= 5 and len(batches) > 2
    for batch in batches:
        column = batch.column(schema.COL_ROUTES_OLD)
        arr = L.route_array(column, top_k=2)
        assert arr.dtype == np.int16 and arr.shape[1:] == (3, 2)
        buffer = column.values.buffers()[1]
        assert np.shares_memory(arr, np.frombuffer(buffer, np.int16))  # a view of the Arrow buffer
        parts.append(arr)
    np.testing.assert_array_equal(np.concatenate(parts), expected)
    margins = np.concatenate([L.margin_array(b.column(schema.COL_MARGIN_OLD)) for b in batches])
    np.testing.assert_array_equal(margins, fake_run.tokens[1][schema.COL_MARGIN_OLD])
    whole = L.read_routes(path, schema.COL_ROUTES_NEW, top_k=2)
    np.testing.assert_array_equal(whole, fake_run.tokens[1][schema.COL_ROUTES_NEW])


def test_route_array_from_plain_lists_and_nulls():
    lists = pa.array([[0, 1, 2, 3], [4, 5, 6, 7]], type=pa.list_(pa.int16()))
    np.testing.assert_array_equal(L.route_array(lists, 2), [[[0, 1], [2, 3]], [[4, 5], [6, 7]]])
    with_null = pa.array([[0, 1, 2, 3], None], type=pa.list_(pa.int16()))
    np.testing.assert_array_equal(L.route_array(with_null, 2)[1], -1)
    fixed = pa.FixedSizeListArray.from_arrays(pa.array([0, None, 2, 3], pa.int16()), 2)
    np.testing.assert_array_equal(L.route_array(fixed, 2), [[[0, -1]], [[2, 3]]])
    sliced = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(12, dtype=np.int16)), 4).slice(1, 2)
    np.testing.assert_array_equal(L.route_array(sliced, 2).reshape(2, 4), [[4, 5, 6, 7], [8, 9, 10, 11]])
    with pytest.raises(ValueError, match="multiple of top_k"):
        L.route_array(fixed, 3)
    with pytest.raises(ValueError, match="length is not 4"):
        L.route_array(pa.array([[0, 1, 2, 3], [1]], type=pa.list_(pa.int16())), 2)


def test_load_tokens(fake_run):
    tokens = L.load_tokens(fake_run.path)
    assert schema.COL_ROUTES_OLD not in tokens and schema.COL_LOG_W in tokens
    assert len(tokens) == sum(len(t[schema.COL_STEP]) for t in fake_run.tokens.values())
    some = L.load_tokens(fake_run.path, columns=[schema.COL_STEP, schema.COL_LOG_W], steps=[2])
    assert list(some.columns) == [schema.COL_STEP, schema.COL_LOG_W] and set(some[schema.COL_STEP]) == {2}


def test_not_a_run(tmp_path):
    with pytest.raises(NotARunError, match=r"no run\.json"):
        L.read_run_info(tmp_path)
    with pytest.raises(NotARunError, match="not a directory"):
        L.read_run_info(tmp_path / "missing")


def test_newer_schema_is_refused(fake_run):
    raw = dict(fake_run.run_json, schema_version=schema.SCHEMA_VERSION + 1)
    (fake_run.path / schema.RUN_JSON).write_text(json.dumps(raw))
    with pytest.raises(SchemaVersionError, match="newer"):
        L.read_run_info(fake_run.path)


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"status": "running"}'])
def test_corrupt_run_json_is_named(fake_run, content):
    (fake_run.path / schema.RUN_JSON).write_text(content)
    with pytest.raises(RunFileError, match=r"run\.json") as info:
        L.read_run_info(fake_run.path)
    assert info.value.path == fake_run.path / schema.RUN_JSON


def test_missing_metrics_is_named(fake_run):
    (fake_run.path / schema.METRICS_JSONL).unlink()
    with pytest.raises(RunFileError, match=r"metrics\.jsonl: missing"):
        L.load_metrics(fake_run.path)


def test_torn_metrics_line_is_skipped_with_file_line_and_reason(fake_run):
    with open(fake_run.path / schema.METRICS_JSONL, "a") as f:
        f.write('{"step": 4, "loss": 0.')  # a running run's half-written line
    with pytest.raises(RunFileError, match="line 4 is not valid JSON"):
        L.load_metrics(fake_run.path)  # strict without a skipped list
    skipped = []
    metrics = L.load_metrics(fake_run.path, skipped)
    assert metrics["step"].tolist() == [1, 2, 3]
    (part,) = skipped
    assert (part.file, part.line) == (fake_run.path / schema.METRICS_JSONL, 4) and "not valid JSON" in part.reason
    assert L.metrics_step_problem(fake_run.path) is None  # a torn line is no step out of order


def _write_steps(run, steps: list) -> None:
    lines = [json.dumps({"step": s, "reward/mean": 0.1 * i}) if isinstance(s, int) else s for i, s in enumerate(steps)]
    (run / schema.METRICS_JSONL).write_text("".join(f"{line}\n" for line in lines))


def test_metrics_steps_that_repeat_or_go_back_are_named_with_their_lines(fake_run):
    assert L.metrics_step_problem(fake_run.path) is None  # 1, 2, 3
    _write_steps(fake_run.path, [1, 2, 1, 2])  # two writers' lines, one after the other
    problem = L.metrics_step_problem(fake_run.path)
    assert "goes back: line 3 is step 1, after step 2 on line 2" in problem and "two writers" in problem
    _write_steps(fake_run.path, [1, 1, 2, 2])  # two writers' lines interleaved
    assert "repeats: line 2 is step 1, after step 1 on line 1" in L.metrics_step_problem(fake_run.path)
    _write_steps(fake_run.path, [1, '{"step": 2, "rew', 2, 5])  # a torn line, then the step again: in order
    assert L.metrics_step_problem(fake_run.path) is None
    _write_steps(fake_run.path, [2, "", "[1]", '{"step": true}', 3, 1])  # lines without an integer step are left out
    assert "line 6 is step 1, after step 3 on line 5" in L.metrics_step_problem(fake_run.path)
    (fake_run.path / schema.METRICS_JSONL).unlink()
    assert L.metrics_step_problem(fake_run.path) is None  # load_metrics says it is missing


def test_a_step_written_twice_keeps_the_last_line(fake_run):
    lines = (fake_run.path / schema.METRICS_JSONL).read_text().splitlines()
    first = json.loads(lines[0])
    del first["eval/accuracy"]
    (fake_run.path / schema.METRICS_JSONL).write_text("\n".join([json.dumps(first), *lines]) + "\n")
    metrics = L.load_metrics(fake_run.path)
    assert metrics["step"].tolist() == [1, 2, 3] and metrics.loc[0, "eval/accuracy"] == 0.5  # the last line of 1
    assert "repeats: line 2 is step 1" in L.metrics_step_problem(fake_run.path)  # and the run is damaged


def test_corrupt_parquet_is_skipped_with_a_warning(fake_run):
    bad = fake_run.path / schema.tokens_file(2)
    bad.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(RunFileError, match=r"step_000002\.parquet"):
        list(L.iter_token_batches(bad))
    skipped = []
    steps = {step for step, _ in L.iter_run_batches(fake_run.path, [schema.COL_LOG_W], skipped=skipped)}
    assert steps == {1, 3} and [s.file for s in skipped] == [bad]
    skipped = []
    tokens = L.load_tokens(fake_run.path, columns=[schema.COL_STEP], skipped=skipped)
    assert set(tokens[schema.COL_STEP]) == {1, 3} and [s.file for s in skipped] == [bad]
    with pytest.raises(RunFileError, match=r"step_000002\.parquet"):
        L.load_tokens(fake_run.path, columns=[schema.COL_STEP])


def test_truncated_parquet_is_skipped_with_a_warning(fake_run):
    path = fake_run.path / schema.tokens_file(3)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    skipped = []
    steps = {step for step, _ in L.iter_run_batches(fake_run.path, [schema.COL_LOG_W], skipped=skipped)}
    assert steps == {1, 2} and [s.file for s in skipped] == [path]


def test_missing_column_is_named(fake_run):
    path = fake_run.path / schema.tokens_file(1)
    table = pq.read_table(path).drop_columns([schema.COL_ROUTES_NEW])
    pq.write_table(table, path)
    with pytest.raises(RunFileError, match=r"missing column\(s\) \['routes_new'\]"):
        list(L.iter_token_batches(path, [schema.COL_ROUTES_NEW]))
    skipped = []
    steps = [s for s, _ in L.iter_run_batches(fake_run.path, [schema.COL_ROUTES_NEW], skipped=skipped)]
    assert set(steps) == {2, 3} and [s.file.name for s in skipped] == ["step_000001.parquet"]


def test_malformed_route_column_skips_the_file(fake_run):
    from moestab.analysis.volatility import run_volatility, volatility_table
    from tests.support.naive import volatility_metrics

    path = fake_run.path / schema.tokens_file(2)
    table = pq.read_table(path)
    rows = table.num_rows
    odd = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(rows * 5, np.int16)), 5)  # 5 is not layers * top_k
    column = schema.COL_ROUTES_OLD_FREE
    table = table.set_column(table.schema.get_field_index(column), column, odd)
    pq.write_table(table, path)
    skipped = []
    counts = run_volatility(fake_run.path, "old_new", skipped=skipped)
    assert [s.file for s in skipped] == [path] and "malformed route column" in skipped[0].reason
    got = volatility_table(counts).iloc[0]
    steps = [fake_run.tokens[s] for s in (1, 3)]
    expected = volatility_metrics(
        np.concatenate([c[schema.COL_ROUTES_OLD_FREE] for c in steps]),
        np.concatenate([c[schema.COL_ROUTES_NEW] for c in steps]),
    )
    assert got["changed"] == pytest.approx(expected["changed"]) and got["tokens"] == expected["tokens"]


# ---- live status: a "running" run whose writer is gone reads "stopped" ------------------------------


def _with_writer(fake_run, status: str, writer: dict):
    raw = dict(fake_run.run_json, status=status, writer=writer)
    (fake_run.path / schema.RUN_JSON).write_text(json.dumps(raw))
    return L.read_run_info(fake_run.path)


def test_live_status_judges_a_running_run_by_its_writer(fake_run):
    import socket
    import subprocess
    import sys
    from datetime import UTC, datetime, timedelta

    from moestab.analysis.summary import run_summary
    from moestab.run_folder.run_info import STALE_AFTER_S

    here = socket.gethostname()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # that process has exited
    now = datetime.now(UTC)
    fresh, stale = now.isoformat(), (now - timedelta(seconds=STALE_AFTER_S + 1)).isoformat()
    assert _with_writer(fake_run, "running", {"host": here, "pid": os.getpid()}).live_status() == "running"
    assert _with_writer(fake_run, "running", {"host": here, "pid": dead_pid}).live_status() == "stopped"
    assert _with_writer(fake_run, "running", {"host": "elsewhere", "pid": 1, "heartbeat": fresh}).live_status() \
        == "running"
    assert _with_writer(fake_run, "running", {"host": "elsewhere", "pid": 1, "heartbeat": stale}).live_status() \
        == "stopped"
    assert _with_writer(fake_run, "running", {}).live_status() == "stopped"  # nothing vouches for a writer
    assert _with_writer(fake_run, "finished", {"host": here, "pid": dead_pid}).live_status() == "finished"
    _with_writer(fake_run, "running", {"host": here, "pid": dead_pid})
    assert run_summary(fake_run.path)["status"] == "stopped"  # what `moestab analyze` and the dashboard show


def test_metrics_read_in_chunks_and_by_key_are_the_whole_files_columns(tmp_path, monkeypatch):
    """Issue 55.10: metrics.jsonl is read a line at a time, turned into columns chunk by chunk, and ``keys`` keeps
    only what a caller reads; the frame is the one the whole file gave (sparse keys, a key null for a whole chunk,
    list values)."""
    import pandas as pd

    R = L
    with (tmp_path / schema.METRICS_JSONL).open("w") as f:
        for step in range(1, 2000):
            row = {"step": step, "a": step * 0.5, "b": None if step < 900 else step,
                   "c": [step, step + 1] if step % 3 == 0 else None}
            if step % 7 == 0:
                row["e"] = 1.0
            f.write(json.dumps(row) + "\n")
    monkeypatch.setattr(R, "METRICS_CHUNK_ROWS", 10**9)
    whole = R.load_metrics(tmp_path)
    monkeypatch.setattr(R, "METRICS_CHUNK_ROWS", 512)  # chunks 1 and 2 hold no number for "b"
    chunked = R.load_metrics(tmp_path)
    pd.testing.assert_frame_equal(chunked, whole)
    assert whole["b"].dtype == float and whole["c"].dtype == object
    picked = R.load_metrics(tmp_path, keys=["b", "e"])
    assert list(picked.columns) == ["step", "b", "e"]
    pd.testing.assert_frame_equal(picked, whole[["step", "b", "e"]])
