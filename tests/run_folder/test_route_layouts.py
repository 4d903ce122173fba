"""Route columns in every layout: schema version 3's binary columns by hand, and one step written in version 2's
``FixedSizeList<int16>``, version 3's ``FixedSizeBinary`` and version 4's XORs with reference columns read back
identically by every reader and analyzer (version 4's encoding by hand: tests/run_folder/test_route_xor.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from moestab.analysis.attribution import run_attribution
from moestab.analysis.dashboard_data import run_coactivation
from moestab.analysis.experts import run_expert_counts
from moestab.analysis.summary import step_metrics_from_tokens
from moestab.analysis.volatility import PAIRS, RUN_KEYS, run_volatility, volatility_table
from moestab.recording.step_tensors import StepTensors
from moestab.recording.token_table import token_table
from moestab.run_folder import RunFolder, schema
from moestab.run_folder import reader as R
from moestab.run_folder.route_columns import (
    XOR,
    RouteLayout,
    list_route_column,
    route_layout,
    route_layout_for,
    token_parquet_options,
)
from moestab.run_folder.run_info import ModelInfo, RunInfo, read_run_info
from moestab.run_folder.writer import RunWriter
from tests.support.step_records import LAYERS, RESPONSE, ROWS, SLOTS, K, P, T, step_tensors
from tests.support.tables import token_frame

DOCS = Path(__file__).resolve().parents[2] / "docs"


# ---- the binary layout by hand -------------------------------------------------------------------------------------
def test_uint8_route_bytes_by_hand():
    layout = RouteLayout("uint8", layers=2, top_k=2)
    routes = np.array([[[3, 0], [7, 1]], [[2, 5], [-1, -1]]])  # the second token's layer 1 was not recorded
    column = layout.encode(routes)
    assert column.type == pa.binary(4)  # 2 layers x top-2 x 1 byte
    assert column.to_pylist() == [bytes([3, 0, 7, 1]), bytes([2, 5, 255, 255])]  # row-major [layer, slot]; -1 -> 255
    decoded = layout.decode(column)
    assert decoded.dtype == np.int16
    np.testing.assert_array_equal(decoded, routes)


def test_int16_route_bytes_by_hand():
    layout = RouteLayout("int16", layers=1, top_k=2)
    column = layout.encode(np.array([[[300, 1]], [[-1, -1]]]))
    # little-endian: 300 = 0x012C -> 2C 01, 1 -> 01 00, -1 -> FF FF
    assert column.to_pylist() == [b"\x2c\x01\x01\x00", b"\xff\xff\xff\xff"]
    decoded = layout.decode(column)
    np.testing.assert_array_equal(decoded, [[[300, 1]], [[-1, -1]]])
    assert np.shares_memory(decoded, np.frombuffer(column.buffers()[1], np.int16))  # int16: a view, no copy


def test_the_writer_picks_uint8_while_255_is_free_for_not_recorded():
    assert route_layout_for(128, 48, 8) == RouteLayout("uint8", 48, 8, encoding=XOR)  # version 4: XORs
    assert route_layout_for(128, 48, 8, schema_version=3) == RouteLayout("uint8", 48, 8)  # every column in full
    assert route_layout_for(255, 1, 1).dtype == "uint8"  # ids 0..254, 255 = not recorded
    assert route_layout_for(256, 1, 1).dtype == "int16"  # id 255 exists (DeepSeek-V3's 256 experts)
    assert route_layout_for(32768, 1, 1).dtype == "int16"
    assert route_layout_for(128, 48, 8, schema_version=2) is None  # version 2: FixedSizeList<int16>, no layout
    with pytest.raises(ValueError, match="schema version"):
        route_layout_for(128, 48, 8, schema_version=1)
    with pytest.raises(ValueError, match="num_experts"):
        route_layout_for(32769, 1, 1)
    with pytest.raises(ValueError, match=r"-1\.\.254"):
        RouteLayout("uint8", 1, 2).encode(np.array([[[255, 0]]]))
    with pytest.raises(ValueError, match=r"\[rows, 1, 2\]"):
        RouteLayout("uint8", 1, 2).encode(np.array([[[1, 0, 2]]]))


def test_decoding_follows_slices_chunks_and_null_rows():
    layout = RouteLayout("uint8", layers=1, top_k=2)
    routes = np.array([[[0, 1]], [[2, 3]], [[4, 5]]])
    column = layout.encode(routes)
    np.testing.assert_array_equal(layout.decode(column.slice(1, 2)), routes[1:])
    np.testing.assert_array_equal(layout.decode(pa.chunked_array([column.slice(0, 1), column.slice(1, 2)])), routes)
    with_null = pa.array([bytes([6, 7]), None], pa.binary(2))
    np.testing.assert_array_equal(layout.decode(with_null), [[[6, 7]], [[-1, -1]]])  # a null row: not recorded
    with pytest.raises(ValueError, match="bytes a row"):
        RouteLayout("uint8", layers=2, top_k=2).decode(column)


def test_the_layout_is_in_the_schema_metadata():
    layout = RouteLayout("uint8", layers=48, top_k=8)
    table = pa.table({schema.COL_ROUTES_OLD: layout.encode(np.zeros((1, 48, 8), np.int16))})
    table = table.replace_schema_metadata(layout.metadata())
    assert json.loads(table.schema.metadata[b"moestab.routes"]) == {
        "encoding": "fixed_size_binary", "dtype": "uint8", "byte_order": "little", "order": "[layer, slot]",
        "layers": 48, "top_k": 8, "absent": 255}
    assert route_layout(table.schema) == layout
    assert route_layout(pa.schema([("x", pa.int32())])) is None  # version 2: no entry
    for bad in ({"encoding": "fixed_size_binary", "byte_order": "little", "dtype": "uint4", "layers": 1, "top_k": 1,
                 "absent": 15},
                {"encoding": "fixed_size_binary", "byte_order": "little", "dtype": "uint8", "layers": 1, "top_k": 1,
                 "absent": -1},
                {"encoding": "fixed_size_binary", "byte_order": "big", "dtype": "int16", "layers": 1, "top_k": 1,
                 "absent": -1},
                {"encoding": "fixed_size_binary", "byte_order": "little"}):
        with pytest.raises(ValueError):
            route_layout(pa.schema([("x", pa.int32())], metadata={"moestab.routes": json.dumps(bad)}))


def test_route_array_needs_the_layout_of_a_binary_column():
    layout = RouteLayout("uint8", layers=1, top_k=2)
    column = layout.encode(np.array([[[0, 1]]]))
    np.testing.assert_array_equal(R.route_array(column, 2, layout), [[[0, 1]]])
    with pytest.raises(ValueError, match="layout"):
        R.route_array(column, 2)
    with pytest.raises(ValueError, match="top-2"):
        R.route_array(column, 1, layout)


def test_batch_rows_and_scalar_columns_count_binary_route_columns():
    arrow_schema = pa.schema([(schema.COL_STEP, pa.int32()), (schema.COL_ROUTES_OLD, pa.binary(384)),
                              (schema.COL_MARGIN_OLD, pa.list_(pa.float32(), 48))])
    assert R.default_batch_rows(arrow_schema) == R.DEFAULT_BATCH_VALUES // (1 + 384 // 2 + 48)  # bytes count half
    assert R.scalar_columns(arrow_schema) == [schema.COL_STEP]


def test_parquet_options_leave_only_binary_route_columns_plain_and_uncompressed():
    arrow_schema = pa.schema([(schema.COL_STEP, pa.int32()), (schema.COL_ROUTES_OLD, pa.binary(4)),
                              (schema.COL_ROUTES_NEW, pa.list_(pa.int16(), 4)),
                              (schema.COL_MARGIN_OLD, pa.list_(pa.float32(), 2))])
    options = token_parquet_options(arrow_schema)
    assert options["compression"] == {"step": "snappy", "routes_old": "none", "routes_new.list.element": "snappy",
                                      "margin_old.list.element": "snappy"}
    assert options["use_dictionary"] == ["step", "routes_new.list.element", "margin_old.list.element"]


# ---- one step in every layout ---------------------------------------------------------------------------------------


def expected_routes(t: StepTensors, indices: torch.Tensor) -> np.ndarray:
    """``[tokens, 2, K]``: the routes of each recorded response token, token by token in table order — those of the
    input position that scores it (``P - 1 + position``), on the recorded layers."""
    out = [indices[s, P - 1 + pos, SLOTS].numpy() for s in ROWS.tolist() for pos in range(T) if RESPONSE[s, pos]]
    return np.stack(out)


def write_run(path: Path, version: int, steps: dict[int, StepTensors], experts: int) -> Path:
    """A run folder as a moestab of schema ``version`` writes it: run.json and one table per step (row groups of 3
    rows, so that reads cross row groups)."""
    folder = RunFolder(path)
    for sub in folder.subfolders():
        sub.mkdir(parents=True)
    info = RunInfo(config={"algo": "grpo", "routing_replay": "off", "model": "tiny", "steps": len(steps)},
                   model=ModelInfo(family="tiny", moe_layers=LAYERS, num_experts=experts, top_k=K,
                                   recorded_layers=tuple(LAYERS[s] for s in SLOTS)),
                   status=schema.STATUS_FINISHED, last_step=len(steps), schema_version=version)
    folder.run_json.write_text(json.dumps(info.to_json()))
    writer = RunWriter(path)
    for step, t in steps.items():
        writer.write_tokens(step, token_table(step, t, rows=ROWS, layer_slots=SLOTS, schema_version=version),
                            row_group_size=3)
    return path


@pytest.fixture(params=[8, 300], ids=["uint8", "int16"])
def both_layouts(request, tmp_path):
    """The same two steps written as schema version 2, 3 and 4 run folders: ``(steps, experts, v2 run, v3 run,
    v4 run)``."""
    experts = request.param
    steps = {1: step_tensors(experts, seed=1), 2: step_tensors(experts, seed=2)}
    return (steps, experts, *(write_run(tmp_path / f"v{version}", version, steps, experts) for version in (2, 3, 4)))


def _chunks(parquet: pq.ParquetFile) -> dict:
    """The first row group's column chunks by Parquet path."""
    group = parquet.metadata.row_group(0)
    return {group.column(i).path_in_schema: group.column(i) for i in range(parquet.metadata.num_columns)}


def test_each_version_writes_its_layout(both_layouts):
    _, experts, v2, v3, v4 = both_layouts
    old, new = pq.ParquetFile(v2 / schema.tokens_file(1)), pq.ParquetFile(v3 / schema.tokens_file(1))
    xor = pq.ParquetFile(v4 / schema.tokens_file(1))
    itemsize = 1 if experts <= 255 else 2
    for column in schema.ROUTE_COLUMNS:
        assert old.schema_arrow.field(column).type == pa.list_(pa.int16(), 2 * K)
        assert new.schema_arrow.field(column).type == xor.schema_arrow.field(column).type == pa.binary(2 * K * itemsize)
    assert route_layout(old.schema_arrow) is None
    assert route_layout(new.schema_arrow) == RouteLayout("uint8" if itemsize == 1 else "int16", 2, K)
    layout = route_layout(xor.schema_arrow)
    assert layout.plain == route_layout(new.schema_arrow) and layout.encoding == XOR
    references = dict(layout.references)
    assert list(references) == list(schema.ROUTE_COLUMNS) and references[schema.COL_ROUTES_ROLLOUT] is None
    assert references[schema.COL_ROUTES_OLD] == schema.COL_ROUTES_ROLLOUT  # 30% of decisions redrawn: a reference
    assert references[schema.COL_ROUTES_OLD_FREE] == schema.COL_ROUTES_OLD  # the same routes as routes_old
    assert old.schema_arrow.field(schema.COL_MARGIN_OLD).type == new.schema_arrow.field(schema.COL_MARGIN_OLD).type
    chunks = _chunks(new)
    for column in schema.ROUTE_COLUMNS:  # plain and uncompressed: decoded as one copy of the bytes
        assert chunks[column].compression == "UNCOMPRESSED"
        assert not any("DICTIONARY" in e for e in chunks[column].encodings)
    assert chunks[schema.COL_STEP].compression == "SNAPPY"
    chunks = _chunks(xor)
    for column in schema.ROUTE_COLUMNS:  # version 4: zstd, whether stored in full or as an XOR
        assert chunks[column].compression == "ZSTD"
        assert not any("DICTIONARY" in e for e in chunks[column].encodings)
    assert chunks[schema.COL_STEP].compression == "SNAPPY"
    assert [read_run_info(run).schema_version for run in (v2, v3, v4)] == [2, 3, 4] and schema.SCHEMA_VERSION == 4


def test_every_layout_reads_back_the_step_tensors_routes(both_layouts):
    steps, _, v2, v3, v4 = both_layouts
    sources = {schema.COL_ROUTES_ROLLOUT: lambda t: t.batch.routes.indices,
               schema.COL_ROUTES_OLD: lambda t: t.routes_old,
               schema.COL_ROUTES_OLD_FREE: lambda t: t.routes_old_free.indices,
               schema.COL_ROUTES_UPDATE: lambda t: t.routes_update,
               schema.COL_ROUTES_NEW: lambda t: t.routes_new.indices}
    for step, t in steps.items():
        for column, source in sources.items():
            expected = expected_routes(t, source(t))  # [tokens, 2, K]
            for run in (v2, v3, v4):
                got = R.read_routes(run / schema.tokens_file(step), column, K)
                assert got.dtype == np.int16
                np.testing.assert_array_equal(got, expected, err_msg=f"{run.name} step {step} {column}")
    for run in (v3, v4):
        new = R.read_routes(run / schema.tokens_file(1), schema.COL_ROUTES_NEW, K)
        assert (new[-3:] == -1).all() and (new[:-3] >= 0).all()  # sequence 3 (3 tokens, last) was not re-run
        assert (R.read_routes(run / schema.tokens_file(1), schema.COL_ROUTES_ROLLOUT, K)[0, 1] == -1).all()


def test_every_reader_gives_the_same_from_every_layout(both_layouts):
    _, _, v2, v3, v4 = both_layouts
    for step in (1, 2):
        per_run = []
        for run in (v2, v3, v4):
            path = run / schema.tokens_file(step)
            batches = list(R.iter_token_batches(path, schema.ROUTE_COLUMNS, batch_rows=2))
            assert len(batches) > 2  # several batches, across row groups
            per_run.append({c: np.concatenate([R.route_array(b.column(c), K, route_layout(b.schema)) for b in batches])
                            for c in schema.ROUTE_COLUMNS})
        for column in schema.ROUTE_COLUMNS:
            np.testing.assert_array_equal(per_run[0][column], per_run[1][column])
            np.testing.assert_array_equal(per_run[0][column], per_run[2][column])
    for alone in schema.ROUTE_COLUMNS:  # one column read alone: version 4 pulls in its reference chain
        one = [np.concatenate([R.route_array(b.column(alone), K, route_layout(b.schema))
                               for b in R.iter_token_batches(run / schema.tokens_file(1), [alone], batch_rows=2)])
               for run in (v2, v4)]
        np.testing.assert_array_equal(*one)
    streamed = [list(R.iter_run_routes(run, schema.ROUTE_COLUMNS, K, [schema.COL_STEP], batch_rows=2))
                for run in (v2, v3, v4)]
    assert len(streamed[0]) == len(streamed[1]) == len(streamed[2]) > 2
    for (s2, b2, r2), *others in zip(*streamed, strict=True):
        for s, b, r in others:
            assert s2 == s and b2.column(schema.COL_STEP).equals(b.column(schema.COL_STEP))
            assert b.column_names == b2.column_names  # the columns asked for, not the chains read with them
            for column in schema.ROUTE_COLUMNS:
                np.testing.assert_array_equal(r2[column], r[column])
    tokens = [R.load_tokens(run) for run in (v2, v3, v4)]
    assert not set(schema.ROUTE_COLUMNS) & set(tokens[2].columns)  # route columns are not "scalar" in any
    pd.testing.assert_frame_equal(tokens[0], tokens[1])
    pd.testing.assert_frame_equal(tokens[0], tokens[2])
    with_routes = [R.load_tokens(run, [schema.COL_STEP, schema.COL_ROUTES_NEW]) for run in (v3, v4)]
    pd.testing.assert_frame_equal(*with_routes)  # version 4's column decoded: version 3's bytes
    for column in (schema.COL_MARGIN_OLD, schema.COL_CONFIDENCE_OLD):  # per-layer floats: the same layout in all
        margins = [R.margin_array(pq.read_table(run / schema.tokens_file(1)).column(column)) for run in (v2, v3, v4)]
        np.testing.assert_array_equal(margins[0], margins[1])
        np.testing.assert_array_equal(margins[0], margins[2])


def test_every_analysis_gives_the_same_from_every_layout(both_layouts):
    _, _, v2, *newer = both_layouts
    for run in newer:
        checked = 0
        for pair in PAIRS:
            tables = [volatility_table(run_volatility(r, pair, batch_rows=2), by=[*RUN_KEYS, "layer"])
                      for r in (v2, run)]
            pd.testing.assert_frame_equal(*tables)
            on_this_thread = run_volatility(run, pair, batch_rows=2, read_ahead=0)  # no read-ahead: the same counts
            pd.testing.assert_frame_equal(volatility_table(on_this_thread, by=[*RUN_KEYS, "layer"]), tables[1])
            checked += bool(((tables[1]["changed"] > 0) & (tables[1]["changed"] < 1)).any())
        assert checked >= 3  # not all 0 == 0 or 1 == 1: the pairs differ on some decisions, not all
        unrecorded = volatility_table(run_volatility(run, "old_new"))["unrecorded"].iloc[0]
        assert unrecorded == 2 * 3 * 2  # 2 steps x sequence 3's 3 tokens x 2 layers without pi_new
        np.testing.assert_array_equal(run_expert_counts(v2), run_expert_counts(run))
        for layer in (0, 1):
            np.testing.assert_array_equal(run_coactivation(v2, layer, schema.COL_ROUTES_NEW, batch_rows=2),
                                          run_coactivation(run, layer, schema.COL_ROUTES_NEW, batch_rows=2))
        attributions = [run_attribution(r, "update_old", margin_bins=2, batch_rows=2) for r in (v2, run)]
        for field in fields(attributions[0]):
            if field.name != "pair":
                pd.testing.assert_frame_equal(getattr(attributions[0], field.name),
                                              getattr(attributions[1], field.name))
        pd.testing.assert_frame_equal(step_metrics_from_tokens(v2), step_metrics_from_tokens(run))


def test_an_older_run_continued_by_this_moestab_is_marked_the_current_version(both_layouts):
    _, _, v2, v3, _ = both_layouts
    for run in (v2, v3):
        RunWriter(run).update(last_step=3)  # what --resume does first; the tables it adds are version 4's
        assert read_run_info(run).schema_version == schema.SCHEMA_VERSION == 4


def test_a_mixed_run_reads_each_table_by_its_own_layout(both_layouts):
    _, _, v2, v3, v4 = both_layouts
    expected = volatility_table(run_volatility(v2, "old_new"), by=["step"])
    (v2 / schema.tokens_file(2)).write_bytes((v4 / schema.tokens_file(2)).read_bytes())  # resumed at step 2
    (v3 / schema.tokens_file(2)).write_bytes((v4 / schema.tokens_file(2)).read_bytes())
    for run in (v2, v3):
        pd.testing.assert_frame_equal(volatility_table(run_volatility(run, "old_new"), by=["step"]), expected)


def test_the_pandas_recipe_of_the_docs_decodes_the_binary_columns(both_layouts):
    _, _, v2, v3, v4 = both_layouts
    text = (DOCS / "run-format.md").read_text()
    (snippet,) = [code for code in re.findall(r"```python\n(.*?)```", text, re.S) if "read_parquet" in code]
    chains = []
    for run in (v3, v4):
        path = run / schema.tokens_file(1)
        namespace: dict = {}
        exec(snippet.replace('"RUN/tokens/step_000001.parquet"', repr(str(path))), namespace)  # the doc's code, as is
        np.testing.assert_array_equal(namespace["routes"], R.read_routes(path, schema.COL_ROUTES_OLD, K))
        assert list(namespace["tokens"].columns[:3]) == [schema.COL_STEP, schema.COL_SEQ, schema.COL_POSITION]
        chains.append(namespace["chain"])
        old, new = token_frame(v2 / schema.tokens_file(1)), token_frame(path)  # the tests' helper, the same recipe
        pd.testing.assert_frame_equal(old.drop(columns=list(schema.ROUTE_COLUMNS)),
                                      new.drop(columns=list(schema.ROUTE_COLUMNS)))
        for column in schema.ROUTE_COLUMNS:
            np.testing.assert_array_equal(np.stack(old[column]), np.stack(new[column]))
            assert np.stack(new[column]).dtype == np.int16
    assert chains == [[schema.COL_ROUTES_OLD], [schema.COL_ROUTES_OLD, schema.COL_ROUTES_ROLLOUT]]  # v4: XORed


def test_list_route_column_is_the_version_2_layout():
    column = list_route_column(np.array([[[3, 0], [-1, -1]]]))
    assert column.type == pa.list_(pa.int16(), 4)
    assert column.to_pylist() == [[3, 0, -1, -1]]


def test_the_duckdb_query_of_the_docs_gives_the_readers_routes(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    run = write_run(tmp_path / "v4", 4, {1: step_tensors(8, seed=1), 2: step_tensors(8, seed=2)}, 8)
    assert dict(route_layout(pq.read_schema(run / schema.tokens_file(1))).references)[schema.COL_ROUTES_OLD]
    text = (DOCS / "run-format.md").read_text()
    (snippet,) = [code for code in re.findall(r"```python\n(.*?)```", text, re.S) if "duckdb" in code]
    namespace: dict = {}
    exec(snippet.replace('"RUN"', repr(str(run))), namespace)  # the doc's code, as is
    assert namespace["top_k"] == K and isinstance(namespace["duckdb"], type(duckdb))
    got = namespace["experts"]
    expected = []
    for step in (1, 2):
        path = run / schema.tokens_file(step)
        table = pd.read_parquet(path, columns=[schema.COL_SEQ, schema.COL_POSITION])
        routes = R.read_routes(path, schema.COL_ROUTES_OLD, K)  # [tokens, layers, K], -1 not recorded
        for (seq, pos), token in zip(table.itertuples(index=False), routes, strict=True):
            expected += [(step, seq, pos, layer, slot, int(e)) for layer, row in enumerate(token)
                         for slot, e in enumerate(row) if e >= 0]
    rows = sorted(map(tuple, got[["step", "seq", "position", "layer", "slot", "expert"]].astype(int).to_numpy()))
    assert rows == sorted(expected) and len(rows) > 0


@pytest.mark.parametrize("version", [3, 4])
def test_an_expert_id_outside_the_model_in_a_binary_table_is_reported(tmp_path, version):
    """The volatility reads stored ids without widening them; an id the model does not have is still reported with
    its row, and "not recorded" (255 in uint8) is not such an id."""
    steps = {1: step_tensors(8, seed=1)}
    run = write_run(tmp_path / "run", version, steps, experts=8)
    before = volatility_table(run_volatility(run, "rollout_old"))
    assert before["unrecorded"].iloc[0] > 0  # rollout routes not recorded at a token: 255 bytes, read fine
    path = run / schema.tokens_file(1)
    table = pq.read_table(path)
    column = table.column(schema.COL_ROUTES_ROLLOUT).combine_chunks()  # stored in full in both versions
    ids = np.frombuffer(column.buffers()[1], np.uint8).copy()
    ids[column.type.byte_width * 4] = 200  # row 4, layer 0, slot 0; the run has 8 experts
    planted = pa.FixedSizeBinaryArray.from_buffers(column.type, len(column), [None, pa.py_buffer(ids)])
    table = table.set_column(table.schema.get_field_index(schema.COL_ROUTES_ROLLOUT), schema.COL_ROUTES_ROLLOUT,
                             planted)
    pq.write_table(table, path)
    skipped = []
    assert run_volatility(run, "rollout_old", skipped=skipped) is None
    (only,) = skipped
    assert "routes_rollout row 4, layer 0, slot 0 holds expert id 200; the run has 8 experts" in only.reason


def _break_chain(path: Path) -> str:
    """Rewrite a schema version 4 table's metadata so that a column stored as an XOR names no reference (issue 55.1:
    read as is, its XORed bytes decode to mostly zeros, ``[0, 0]`` decisions); returns that column."""
    table = pq.read_table(path)
    metadata = dict(table.schema.metadata)
    key = schema.ROUTES_METADATA_KEY.encode()
    value = json.loads(metadata[key])
    column = next(c for c, r in value["references"].items() if r is not None)
    value["references"][column] = None
    metadata[key] = json.dumps(value).encode()
    pq.write_table(table.replace_schema_metadata(metadata), path)
    return column


def test_a_broken_reference_chain_is_reported_by_every_reader_with_or_without_metrics(tmp_path):
    from moestab.analysis.summary import run_summary

    run = write_run(tmp_path / "run", 4, {1: step_tensors(8, seed=1), 2: step_tensors(8, seed=2)}, 8)
    column = _break_chain(run / schema.tokens_file(1))
    skipped: list = []
    steps = [step for step, _, _ in R.iter_run_routes(run, [column], K, skipped=skipped)]
    assert 1 not in steps and 2 in steps  # the damaged table is left out, the other read
    (problem,) = [str(s) for s in skipped]
    assert "step_000001.parquet" in problem and f"{column} row " in problem and "names an expert twice" in problem
    # metrics.jsonl at hand: the summary reads no token table for its numbers, and still names the damaged one
    (run / schema.METRICS_JSONL).write_text('{"step": 1}\n{"step": 2}\n')
    skipped = []
    run_summary(run, skipped)
    assert any("step_000001.parquet" in str(s) and "malformed route column" in str(s) for s in skipped), skipped
    assert not any("step_000002" in str(s) for s in skipped)


def test_an_id_outside_the_model_is_reported_with_metrics_at_hand(tmp_path):
    from moestab.analysis.summary import run_summary

    t = step_tensors(8, seed=1)
    t.batch.routes.indices[0, P - 1, 0, 0] = 200  # expert 200 of 8 (issue 55.8), on the first response token
    run = write_run(tmp_path / "run", 4, {1: t}, 8)
    (run / schema.METRICS_JSONL).write_text('{"step": 1}\n')
    skipped: list = []
    run_summary(run, skipped)
    assert any("holds expert id 200; the run has 8 experts" in str(s) for s in skipped), skipped


def test_the_runs_page_check_reads_the_end_tables_rows_and_opens_every_table(tmp_path):
    from moestab.analysis.summary import run_summary

    tables = {step: step_tensors(8, seed=step) for step in (1, 2, 3)}
    tables[2].batch.routes.indices[0, P - 1, 0, 0] = 200  # the middle table's rows are damaged
    tables[3].batch.routes.indices[0, P - 1, 0, 0] = 201  # and the last one's
    run = write_run(tmp_path / "run", 4, tables, 8)
    (run / schema.METRICS_JSONL).write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n')
    every: list = []
    run_summary(run, every)  # moestab analyze: every table's first rows
    assert any("step_000002" in str(s) and "expert id 200" in str(s) for s in every), every
    ends: list = []
    run_summary(run, ends, check_tables="ends")  # the dashboard's Runs page: the first and last table's rows
    assert any("step_000003" in str(s) and "expert id 201" in str(s) for s in ends), ends
    assert not any("step_000002" in str(s) for s in ends), ends
    (run / schema.tokens_file(2)).write_bytes(b"not parquet")  # a table that cannot be opened is named either way
    ends = []
    run_summary(run, ends, check_tables="ends")
    assert any("step_000002" in str(s) and "not a readable Parquet file" in str(s) for s in ends), ends
    with pytest.raises(ValueError, match="check_tables must be one of"):
        run_summary(run, [], check_tables="some")
