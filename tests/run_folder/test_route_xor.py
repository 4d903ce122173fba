"""Schema version 4's route encoding by hand: each route column stored as its ids or as their XOR with a reference
column's (moestab.run_folder.route_columns), every reference pattern written to Parquet and read back exactly, and
layout metadata that a reader cannot follow refused, naming what is wrong."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from moestab.run_folder import reader as R
from moestab.run_folder import schema
from moestab.run_folder.errors import RunFileError, Skipped
from moestab.run_folder.route_columns import (
    FULL,
    XOR,
    RouteLayout,
    decoded_route_columns,
    encode_route_columns,
    route_layout,
    route_layout_for,
    stored_columns,
    token_parquet_options,
    with_route_layout,
)

ROLLOUT, OLD, OLD_FREE, UPDATE, NEW = schema.ROUTE_COLUMNS


def _routes(rng: np.random.Generator, rows: int, layers: int, k: int, experts: int) -> np.ndarray:
    """``[rows, layers, k]`` int16: k distinct experts a decision, in random order."""
    return np.argsort(rng.random((rows, layers, experts)), axis=-1)[..., :k].astype(np.int16)


def _write(path, routes: dict[str, np.ndarray], layout: RouteLayout | None) -> pa.Table:
    """A table of ``routes`` (plus a step column) written as RunWriter does, its route columns encoded in
    ``layout``; returns the table as encoded."""
    columns, layout = encode_route_columns(routes, layout)
    rows = len(next(iter(routes.values())))
    table = with_route_layout(pa.table({schema.COL_STEP: pa.array(np.ones(rows, np.int32)), **columns}), layout)
    pq.write_table(table, path, row_group_size=7, **token_parquet_options(table.schema))
    return table


def _read_all(path, columns, top_k: int) -> dict[str, np.ndarray]:
    """Each of ``columns`` read alone, streamed in small batches, as int16 ``[rows, layers, top_k]``."""
    out = {}
    for column in columns:
        parts = [R.route_array(b.column(column), top_k, route_layout(b.schema))
                 for b in R.iter_token_batches(path, [column], batch_rows=5)]
        out[column] = np.concatenate(parts)
    return out


def test_xor_bytes_by_hand():
    layout = RouteLayout("uint8", layers=1, top_k=2, encoding=XOR)
    rollout = np.array([[[3, 0]], [[7, 1]], [[2, 5]], [[-1, -1]]])
    old = rollout.copy()  # identical: stored as zero bytes
    free = np.array([[[3, 4]], [[7, 1]], [[2, 5]], [[6, -1]]])  # two ids differ from the rollout's, one was absent
    columns, layout = encode_route_columns({ROLLOUT: rollout, OLD: old, OLD_FREE: free}, layout)
    assert dict(layout.references) == {ROLLOUT: None, OLD: ROLLOUT, OLD_FREE: ROLLOUT}  # tie: the earliest
    assert columns[ROLLOUT].to_pylist() == [bytes([3, 0]), bytes([7, 1]), bytes([2, 5]), bytes([255, 255])]
    assert columns[OLD].to_pylist() == [bytes(2)] * 4
    # 0 ^ 4 = 4; 255 ^ 6 = 0b11111001 = 249; 255 ^ 255 = 0
    assert columns[OLD_FREE].to_pylist() == [bytes([0, 4]), bytes(2), bytes(2), bytes([249, 0])]
    table = with_route_layout(pa.table(columns), layout)
    assert json.loads(table.schema.metadata[b"moestab.routes"])["references"] == {
        ROLLOUT: None, OLD: ROLLOUT, OLD_FREE: ROLLOUT}
    decoded = decoded_route_columns(table, [OLD_FREE, OLD])
    assert decoded.column_names == [OLD_FREE, OLD]  # what was asked for, in that order
    assert route_layout(decoded.schema) == layout.plain
    np.testing.assert_array_equal(layout.plain.decode(decoded.column(OLD_FREE)), free)
    np.testing.assert_array_equal(layout.plain.decode(decoded.column(OLD)), old)
    with pytest.raises(ValueError, match="decode the table's columns together"):
        layout.decode(table.column(OLD_FREE))  # XORed bytes alone are not ids
    with pytest.raises(ValueError, match="decode the table's columns together"):
        R.route_array(table.column(OLD_FREE), 2, route_layout(table.schema))


@pytest.mark.parametrize("experts", [16, 300], ids=["uint8", "int16"])
def test_every_reference_pattern_reads_back_exactly(tmp_path, experts):
    rng = np.random.default_rng(0)
    rows, layers, k = 23, 3, 4
    rollout = _routes(rng, rows, layers, k, experts)
    sparse = rollout.copy()
    sparse[::5, 1, k - 1] = (sparse[::5, 1, k - 1] + 1) % experts  # a few ids changed, not absent
    sparse[::5, 1, :] = np.where(np.isin(sparse[::5, 1, :k - 1], sparse[::5, 1, k - 1:]).any(-1, keepdims=True),
                                 rollout[::5, 1, :], sparse[::5, 1, :])  # keep the decisions' experts distinct
    absent = sparse.copy()
    absent[2] = -1  # a row not recorded (pi_new not re-run) ...
    absent[7, 0] = -1  # ... and a layer
    other = _routes(rng, rows, layers, k, experts)  # all different: stored in full
    routes = {ROLLOUT: rollout, OLD: rollout.copy(), OLD_FREE: sparse, UPDATE: other, NEW: absent}
    table = _write(tmp_path / "t.parquet", routes, route_layout_for(experts, layers, k))
    layout = route_layout(table.schema)
    assert layout.dtype == ("uint8" if experts <= 255 else "int16")
    assert dict(layout.references) == {ROLLOUT: None, OLD: ROLLOUT, OLD_FREE: ROLLOUT, UPDATE: None, NEW: OLD_FREE}
    stored = {c: np.frombuffer(table.column(c).chunk(0).buffers()[1], np.uint8).reshape(rows, -1) for c in routes}
    assert not stored[OLD].any()  # identical: zero bytes
    changed = int(np.count_nonzero(sparse != rollout))
    assert 0 < np.count_nonzero(stored[OLD_FREE]) <= changed * layout.numpy_dtype.itemsize  # only what changed
    np.testing.assert_array_equal(stored[UPDATE], layout.stored_ids(other).view(np.uint8))  # its ids, in full
    as_stored = {c: layout.stored_ids(r).reshape(r.shape) for c, r in routes.items()}  # what token_table passes
    again, same = encode_route_columns(as_stored, route_layout_for(experts, layers, k))
    assert same == layout and all(again[c].equals(table.column(c).chunk(0)) for c in routes)
    got = _read_all(tmp_path / "t.parquet", list(routes), k)
    for column, expected in routes.items():
        np.testing.assert_array_equal(got[column], expected, err_msg=column)
        assert got[column].dtype == np.int16
    for column, expected in routes.items():  # read whole, alone
        np.testing.assert_array_equal(R.read_routes(tmp_path / "t.parquet", column, k), expected)


def test_a_column_read_alone_pulls_in_its_reference_chain(tmp_path):
    rng = np.random.default_rng(1)
    rollout = _routes(rng, 12, 2, 2, 8)
    free = rollout.copy()
    free[3, 0] = free[3, 0, ::-1]  # reordered
    new = free.copy()
    new[5, 1, 1] = next(e for e in range(8) if e not in new[5, 1])  # one expert swapped
    path = tmp_path / "t.parquet"
    table = _write(path, {ROLLOUT: rollout, OLD_FREE: free, NEW: new}, route_layout_for(8, 2, 2))
    layout = route_layout(table.schema)
    assert layout.chain(NEW) == [NEW, OLD_FREE, ROLLOUT]
    names = pq.read_schema(path).names
    assert stored_columns(layout, [NEW], names) == [NEW, OLD_FREE, ROLLOUT]
    assert stored_columns(layout, [schema.COL_STEP, ROLLOUT], names) == [schema.COL_STEP, ROLLOUT]
    assert stored_columns(layout.plain, [NEW], names) == [NEW]  # version 3: every column alone
    (batch,) = R.iter_token_batches(path, [NEW])
    assert batch.column_names == [NEW] and route_layout(batch.schema).encoding == FULL
    np.testing.assert_array_equal(R.route_array(batch.column(NEW), 2, route_layout(batch.schema)), new)
    arrow = R.read_token_table(path)  # the whole table: every route column decoded
    assert arrow.column_names == [schema.COL_STEP, ROLLOUT, OLD_FREE, NEW]
    for column, expected in ((ROLLOUT, rollout), (OLD_FREE, free), (NEW, new)):
        np.testing.assert_array_equal(R.route_array(arrow.column(column), 2, route_layout(arrow.schema)), expected)


def test_a_null_row_reads_as_not_recorded():
    layout = RouteLayout("uint8", layers=1, top_k=2, encoding=XOR, references=((ROLLOUT, None), (NEW, ROLLOUT)))
    rollout = pa.array([bytes([1, 2]), bytes([3, 4])], pa.binary(2))
    new = pa.array([bytes([0, 6]), None], pa.binary(2))  # 2 ^ 6 = 4
    table = pa.table({ROLLOUT: rollout, NEW: new}).replace_schema_metadata(layout.metadata())
    decoded = decoded_route_columns(table, [NEW])
    np.testing.assert_array_equal(layout.plain.decode(decoded.column(NEW)), [[[1, 4]], [[-1, -1]]])


def test_the_writer_refuses_what_it_cannot_encode():
    layout = route_layout_for(8, 1, 1)
    with pytest.raises(ValueError, match=r"\['step'\] are not route columns"):
        encode_route_columns({"step": np.zeros((1, 1, 1))}, layout)
    with pytest.raises(ValueError, match="the same rows"):
        encode_route_columns({ROLLOUT: np.zeros((2, 1, 1)), NEW: np.zeros((3, 1, 1))}, layout)
    columns, _ = encode_route_columns({ROLLOUT: np.zeros((2, 1, 1))}, layout)
    with pytest.raises(ValueError, match=r"\['routes_rollout'\] have no reference"):
        with_route_layout(pa.table(columns), layout)  # the layout before the references were chosen
    empty, chosen = encode_route_columns({ROLLOUT: np.zeros((0, 1, 1)), NEW: np.zeros((0, 1, 1))}, layout)
    assert len(empty[NEW]) == 0 and dict(chosen.references)[ROLLOUT] is None


VALID = {"encoding": XOR, "dtype": "uint8", "byte_order": "little", "order": "[layer, slot]", "layers": 1,
         "top_k": 2, "absent": 255, "references": {ROLLOUT: None, NEW: ROLLOUT}}


@pytest.mark.parametrize(("change", "message"), [
    ({"encoding": "fixed_size_binary_delta"}, r"unknown route encoding 'fixed_size_binary_delta'.*"
                                              r"\['fixed_size_binary', 'fixed_size_binary_xor'\]"),
    ({"references": [ROLLOUT, NEW]}, "'references' must be an object"),
    ({"references": None}, "'references' must be an object"),
    ({"references": {ROLLOUT: None, NEW: 3}}, "values must be route column names or null"),
    ({"references": {ROLLOUT: None, "step": ROLLOUT}}, r"'step', not a route column; route columns: \['routes_rol"),
    ({"references": {ROLLOUT: None, NEW: OLD}}, r"'routes_new' references 'routes_old', which is not one of the "
                                                r"table's route columns \['routes_rollout'\]"),
    ({"references": {ROLLOUT: None, NEW: NEW}}, "cycle: routes_new -> routes_new"),
    ({"references": {ROLLOUT: NEW, NEW: ROLLOUT}}, "cycle: routes_rollout -> routes_new -> routes_rollout"),
    ({"layers": True}, "'layers' and 'top_k' must be integers"),
    ({"top_k": "2"}, "'layers' and 'top_k' must be integers"),
    ({"dtype": "uint4"}, "route dtype must be one of"),
    ({"absent": -1}, "'absent' is -1, 255 for uint8"),
])
def test_layout_metadata_a_reader_cannot_follow_is_refused(change, message):
    arrow_schema = pa.schema([(ROLLOUT, pa.binary(2)), (NEW, pa.binary(2))],
                             metadata={"moestab.routes": json.dumps(VALID | change)})
    with pytest.raises(ValueError, match=message):
        route_layout(arrow_schema)
    assert route_layout(arrow_schema.with_metadata({"moestab.routes": json.dumps(VALID)})).references == (
        (ROLLOUT, None), (NEW, ROLLOUT))
    with pytest.raises(ValueError, match="is not a route layout"):
        route_layout(arrow_schema.with_metadata({"moestab.routes": b"\xff{"}))


def test_a_file_whose_references_the_table_cannot_follow_is_reported(tmp_path):
    run = tmp_path / "run"
    (run / schema.TOKENS_DIR).mkdir(parents=True)
    bad = [  # a reference to a column the table does not hold; a route column the references do not list
        VALID | {"references": {ROLLOUT: None, OLD: None, NEW: OLD}},
        VALID | {"references": {ROLLOUT: None}},
    ]
    for step, value in enumerate(bad, start=1):
        table = pa.table({schema.COL_STEP: pa.array([step], pa.int32()), ROLLOUT: pa.array([bytes(2)], pa.binary(2)),
                          NEW: pa.array([bytes(2)], pa.binary(2))})
        pq.write_table(table.replace_schema_metadata({"moestab.routes": json.dumps(value)}),
                       run / schema.tokens_file(step))
    with pytest.raises(RunFileError, match="routes_new is stored as its XOR with routes_old, which the table does not "
                                           r"hold \(it has \['routes_rollout', 'routes_new'\]\)"):
        list(R.iter_token_batches(run / schema.tokens_file(1), [NEW]))
    with pytest.raises(RunFileError, match="'routes_new' has no entry in the layout's references"):
        R.read_routes(run / schema.tokens_file(2), NEW, 2)
    skipped: list[Skipped] = []
    assert list(R.iter_run_routes(run, [NEW], 2, skipped=skipped)) == []
    assert [s.file.name for s in skipped] == ["step_000001.parquet", "step_000002.parquet"]
    assert all("malformed route layout" in s.reason for s in skipped)
    steps = R.load_tokens(run, [schema.COL_STEP])  # the scalar columns need no route layout: still read
    assert steps[schema.COL_STEP].tolist() == [1, 2]
