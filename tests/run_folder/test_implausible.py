"""Corrupt or implausible data in a run folder is reported, naming the file, row and field, not averaged (issue 40.5):
an expert id outside the model's, a metrics value that is not a number, a run.json model no run could have."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from moestab.analysis.summary import run_summary
from moestab.analysis.volatility import run_volatility
from moestab.run_folder import schema
from moestab.run_folder.errors import RunFileError
from moestab.run_folder.reader import load_metrics, read_run_info
from tests.support.runs import write_run


def plant_expert_id(run, step: int, row: int, value: int) -> None:
    """Set routes_old's first slot of ``row`` in ``step``'s table to ``value`` (the rest of the file unchanged)."""
    path = run.path / schema.tokens_file(step)
    table = pq.read_table(path)
    column = table.column(schema.COL_ROUTES_OLD).combine_chunks()
    flat = column.flatten().to_numpy().copy()
    flat[row * column.type.list_size] = value
    fixed = pa.FixedSizeListArray.from_arrays(pa.array(flat, type=column.type.value_type), column.type.list_size)
    table = table.set_column(table.schema.get_field_index(schema.COL_ROUTES_OLD), schema.COL_ROUTES_OLD, fixed)
    pq.write_table(table, path)


def test_an_expert_id_outside_the_model_is_reported_with_its_file_row_and_value(tmp_path):
    run = write_run(tmp_path, steps=2)
    step1 = run_volatility(run.path, "update_old", steps=[1], skipped=[])
    plant_expert_id(run, step=2, row=5, value=200)  # of 8 experts
    skipped = []
    counts = run_volatility(run.path, "update_old", skipped=skipped)  # update_old reads routes_old
    (only,) = skipped
    assert only.file == run.path / schema.tokens_file(2)
    assert "routes_old row 5, layer 0, slot 0 holds expert id 200; the run has 8 experts" in only.reason
    # The damaged file is left out, not averaged in: what remains is step 1's counts, exactly.
    pd.testing.assert_frame_equal(counts.decisions, step1.decisions)
    pd.testing.assert_frame_equal(counts.tokens, step1.tokens)
    with pytest.raises(RunFileError, match="holds expert id 200"):
        run_volatility(run.path, "update_old")  # a strict read raises


def test_a_metrics_value_that_is_not_a_number_is_reported_and_the_rest_of_its_line_kept(tmp_path):
    run = write_run(tmp_path, steps=3)
    key = "routing/old_new/changed"
    lines = (run.path / schema.METRICS_JSONL).read_text().splitlines()
    row = json.loads(lines[1])
    row[key] = "lots"
    lines[1] = json.dumps(row)
    (run.path / schema.METRICS_JSONL).write_text("\n".join(lines) + "\n")
    skipped = []
    metrics = load_metrics(run.path, skipped)
    (only,) = skipped
    assert only.line == 2 and f"{key!r} is \"lots\", not a number" in only.reason
    assert metrics[key].dtype == np.float64  # the column stays numeric: the other steps' values count
    assert np.isnan(metrics[key][1])
    assert metrics[key][0] == run.metrics[0][key] and metrics[key][2] == run.metrics[2][key]
    assert metrics["reward/mean"][1] == run.metrics[1]["reward/mean"]  # the rest of the line is kept
    summary = run_summary(run.path, skipped=[])
    assert summary["old_new_changed"] == pytest.approx(np.mean([run.metrics[0][key], run.metrics[2][key]]))
    with pytest.raises(RunFileError, match="line 2"):
        load_metrics(run.path)


@pytest.mark.parametrize(("field", "value", "says"), [
    ("num_experts", -5, "model.num_experts is -5"),
    ("top_k", 0, "model.top_k is 0; valid: 1..num_experts (8)"),
    ("top_k", 9, "model.top_k is 9"),
    ("moe_layers", [0, 0, 2, 3], "model.moe_layers [0, 0, 2, 3] must be distinct"),
    ("recorded_layers", [0, 5], "are not all MoE layers"),
])
def test_an_implausible_model_in_run_json_is_refused_naming_the_field(tmp_path, field, value, says):
    run = write_run(tmp_path, steps=1)
    info = json.loads((run.path / schema.RUN_JSON).read_text())
    info["model"][field] = value
    (run.path / schema.RUN_JSON).write_text(json.dumps(info))
    with pytest.raises(RunFileError, match=r"run\.json") as caught:
        read_run_info(run.path)
    assert says in str(caught.value)


def test_a_decision_naming_an_expert_twice_is_reported_and_its_file_left_out(tmp_path):
    run = write_run(tmp_path, steps=2, top_k=3)
    step1 = run_volatility(run.path, "update_old", steps=[1], skipped=[])
    path = run.path / schema.tokens_file(2)
    table = pq.read_table(path)
    for column, ids in ((schema.COL_ROUTES_OLD, [1, 1, 2]), (schema.COL_ROUTES_UPDATE, [2, 1, 1])):
        values = table.column(column).combine_chunks()
        flat = values.flatten().to_numpy().copy()
        flat[5 * values.type.list_size:][:3] = ids  # row 5, first recorded layer: 5 slot pairs match, top-3
        fixed = pa.FixedSizeListArray.from_arrays(pa.array(flat, type=values.type.value_type), values.type.list_size)
        table = table.set_column(table.schema.get_field_index(column), column, fixed)
    pq.write_table(table, path)
    skipped = []
    counts = run_volatility(run.path, "update_old", skipped=skipped)
    (only,) = skipped
    assert only.file == path and "names an expert twice" in only.reason and "left out" in only.reason
    pd.testing.assert_frame_equal(counts.decisions, step1.decisions)  # step 2 left out, not half counted
    pd.testing.assert_frame_equal(counts.tokens, step1.tokens)
    with pytest.raises(RunFileError, match="names an expert twice"):
        run_volatility(run.path, "update_old")
