"""Route ids read as stored (uint8 / int16, not widened; issue 43.2) from tables a reader may meet: a list route column
beside a binary one, a null row on an XOR reference chain, int16 ids above 255, ids at the model's edge, null rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from moestab.analysis import volatility as V
from moestab.run_folder import reader as R
from moestab.run_folder import schema
from moestab.run_folder.route_columns import (
    RouteLayout,
    encode_route_columns,
    route_layout_for,
    token_parquet_options,
    with_route_layout,
)
from tests.support.runs import write_run

ROLLOUT, OLD, OLD_FREE, UPDATE, NEW = schema.ROUTE_COLUMNS
TOTALS = ["tokens", "tokens_flipped", "routers", "routers_flipped"]


def _totals(counts: V.VolatilityCounts) -> list[int]:
    return counts.tokens[TOTALS].sum().tolist()


def test_a_pair_of_a_list_and_a_binary_route_column_is_compared_as_int16(tmp_path):
    """A list column (int16) beside a binary one (uint8 as stored) is compared as int16, as before the stored ids:
    not a bare ValueError out of run_volatility."""
    run = write_run(tmp_path, steps=1)
    path = run.path / schema.tokens_file(1)
    table = pq.read_table(path)
    layout = RouteLayout("uint8", 3, 2)
    table = table.set_column(table.schema.get_field_index(NEW), NEW, layout.encode(run.tokens[1][NEW]))
    pq.write_table(table.replace_schema_metadata({**(table.schema.metadata or {}), **layout.metadata()}), path)
    skipped: list = []
    counts = V.run_volatility(run.path, "old_new", skipped=skipped)
    assert skipped == []
    expected = V.volatility_counts(run.tokens[1][OLD_FREE], run.tokens[1][NEW])
    assert _totals(counts) == _totals(expected)


def test_a_null_row_in_a_reference_column_is_not_decoded_into_its_dependents(tmp_path):
    """A null row of the column stored in full (routes_rollout) cannot be decoded in the columns XORed with it: it
    reads as not recorded there, not as the XOR bytes alone (experts named twice, silently other counts)."""
    run = write_run(tmp_path, steps=1)
    path = run.path / schema.tokens_file(1)
    table = pq.read_table(path)
    columns, layout = encode_route_columns({c: run.tokens[1][c] for c in schema.ROUTE_COLUMNS},
                                           route_layout_for(8, 3, 2))
    assert dict(layout.references)[OLD] == ROLLOUT
    for name, array in columns.items():
        table = table.set_column(table.schema.get_field_index(name), name, array)
    rollout = columns[ROLLOUT]
    nulls = pa.array(np.arange(len(rollout)) < 3)
    columns_null = pc.if_else(nulls, pa.scalar(None, rollout.type), rollout)
    table = with_route_layout(table.set_column(table.schema.get_field_index(ROLLOUT), ROLLOUT, columns_null), layout)
    pq.write_table(table, path, **token_parquet_options(table.schema))
    old = R.read_routes(path, OLD, 2)
    np.testing.assert_array_equal(old[3:], run.tokens[1][OLD][3:])
    assert (old[:3] == -1).all()


def test_stored_int16_ids_above_255_give_the_overlaps_of_python_sets():
    """int16 ids are never compared by their low byte (256 + e is not e), in native and non-native byte order."""
    rng = np.random.default_rng(3)
    tokens, layers, k = 400, 3, 4
    a = np.argsort(rng.random((tokens, layers, 512)), axis=-1)[..., :k].astype(np.int16)
    b = a.copy()
    redo = rng.random((tokens, layers)) < 0.4
    b[redo] = (a[redo] + 256) % 512  # every id moved by 256: no expert shared, same low byte
    b[rng.random((tokens, layers)) < 0.05, 1] = -1
    expected = np.array([[V.INVALID if (x < 0).any() or (y < 0).any() else len(set(x.tolist()) & set(y.tolist()))
                          for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a, b, strict=True)])
    got = np.empty(tokens * layers, np.uint8)
    V.intersect_into(a, b, got, 4096)
    np.testing.assert_array_equal(got.reshape(tokens, layers), expected)
    acc = V.VolatilityAccumulator(k)
    acc.add_routes(a.astype(">i2"), b.astype(">i2"), stored=True)  # non-native byte order too
    hist = acc.result().decisions
    assert hist["overlap_0"].sum() == int((expected == 0).sum())


@pytest.mark.parametrize("dtype", [np.uint8, np.int16])
def test_an_id_equal_to_num_experts_is_reported(dtype):
    """The one-reduction id check ends exactly at the model's last expert."""
    ids = np.zeros((2, 1, 2), dtype)
    ids[1, 0, 1] = 8
    with pytest.raises(ValueError, match="row 1, layer 0, slot 1 holds expert id 8"):
        R._check_ids(ids, "routes_new", 8, 0)
    ids[1, 0, 1] = 7
    R._check_ids(ids, "routes_new", 8, 0)


@pytest.mark.parametrize("dtype", ["uint8", "int16"])
def test_stored_decoding_reads_null_rows_as_not_recorded(dtype):
    """Null rows read as "not recorded" in the stored dtype too, across chunks and slices."""
    layout = RouteLayout(dtype, 1, 2)
    column = layout.encode(np.array([[[1, 2]], [[3, 4]], [[5, 6]]]))
    chunked = pa.chunked_array([pa.array([None], column.type), column.slice(1), column.slice(0, 1)])
    absent = layout.absent
    np.testing.assert_array_equal(R.route_array(chunked, 2, layout, stored=True),
                                  [[[absent, absent]], [[3, 4]], [[5, 6]], [[1, 2]]])
