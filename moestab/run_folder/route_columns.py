"""Route columns of the per-token tables: how expert ids are laid out in Parquet (docs/run-format.md, "Route columns").

Schema version 3 stores each route column as ``FixedSizeBinary(layers * top_k * itemsize)``: the row's ids,
row-major ``[layer, slot]``, little-endian ``uint8`` when the model has at most 255 experts (255 = not recorded)
and ``int16`` otherwise (-1 = not recorded). The dtype and shape are JSON under the table's schema metadata
:data:`~moestab.run_folder.schema.ROUTES_METADATA_KEY`, so any Parquet reader decodes the bytes without run.json or
guessing. Why binary: Parquet decodes a fixed-size binary column as one copy of its bytes, while a
``FixedSizeList<int16>`` (schema version 2) carries definition and repetition levels for every id and decoded ~10x
slower, which bound the streamed analysis (docs/benchmarks.md). The binary route columns are written plain and
uncompressed (:func:`token_parquet_options`): expert ids are near-random bytes that snappy shrank by ~15% at 40% of
the decoding speed.

Version 2 tables (``FixedSizeList<int16>``, no metadata) are still read; :func:`encode_routes` still writes them
when given no layout (``route_layout_for(..., schema_version=2)``), for comparing the layouts (tests,
bench/bench_analysis.py). Only ``moestab.run_folder`` and the recording layer's table builder use this module; analyzers
get int16 ``[rows, layers, top_k]`` arrays from the reader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from moestab.run_folder import schema

UINT8_MAX_EXPERTS = 255
"""Most experts whose ids fit a uint8 route column: ids 0..254, with 255 left for "not recorded"."""
INT16_MAX_EXPERTS = int(np.iinfo(np.int16).max) + 1
"""Most experts an int16 route column holds (ids 0..32767, -1 = not recorded): the in-memory route dtype's limit."""

_ABSENT = {"uint8": 255, "int16": -1}  # stored value of a route that was not recorded, by dtype


@dataclass(frozen=True)
class RouteLayout:
    """How one table's binary route columns hold expert ids: ``layers * top_k`` little-endian ``dtype`` ids a row,
    row-major ``[layer, slot]``, :attr:`absent` where a route was not recorded."""

    dtype: str
    """``uint8`` (at most :data:`UINT8_MAX_EXPERTS` experts) or ``int16``."""
    layers: int
    """Recorded layers a row holds (``run.json`` ``model.recorded_layers``, in column order)."""
    top_k: int
    """Experts per decision."""

    def __post_init__(self) -> None:
        if self.dtype not in _ABSENT:
            raise ValueError(f"route dtype must be one of {sorted(_ABSENT)}, got {self.dtype!r}")
        if self.layers < 0 or self.top_k < 1:
            raise ValueError(f"route layout needs layers >= 0 and top_k >= 1, got {self.layers} and {self.top_k}")

    @property
    def absent(self) -> int:
        """The stored id of a route that was not recorded: 255 in uint8, -1 in int16."""
        return _ABSENT[self.dtype]

    @property
    def numpy_dtype(self) -> np.dtype:
        """The stored ids' numpy dtype, little-endian whatever the machine's byte order."""
        return np.dtype(self.dtype).newbyteorder("<")

    @property
    def byte_width(self) -> int:
        """Bytes a row of a route column takes."""
        return self.layers * self.top_k * self.numpy_dtype.itemsize

    def metadata(self) -> dict[bytes, bytes]:
        """The table's schema metadata entry that describes its route columns (docs/run-format.md)."""
        value = {"encoding": "fixed_size_binary", "dtype": self.dtype, "byte_order": "little",
                 "order": "[layer, slot]", "layers": self.layers, "top_k": self.top_k, "absent": self.absent}
        return {schema.ROUTES_METADATA_KEY.encode(): json.dumps(value).encode()}

    def encode(self, routes: np.ndarray) -> pa.FixedSizeBinaryArray:
        """int routes ``[rows, layers, top_k]`` (-1 = not recorded) as a binary route column of ``rows`` rows.

        Raises ``ValueError`` for another shape or an id the dtype cannot hold (a uint8 column takes 0..254).
        """
        routes = np.asarray(routes)
        if routes.ndim != 3 or routes.shape[1:] != (self.layers, self.top_k):
            raise ValueError(f"routes must be [rows, {self.layers}, {self.top_k}], got shape {routes.shape}")
        top = UINT8_MAX_EXPERTS - 1 if self.dtype == "uint8" else INT16_MAX_EXPERTS - 1
        if routes.size and (routes.min() < -1 or routes.max() > top):
            raise ValueError(f"expert ids must be in -1..{top} for a {self.dtype} route column, "
                             f"got {routes.min()}..{routes.max()}")
        stored = np.ascontiguousarray(routes.astype(self.numpy_dtype))  # [rows, layers, k]; -1 wraps to 255 in uint8
        return pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(self.byte_width), len(stored), [None, pa.py_buffer(stored)])

    def decode(self, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """A binary route column as int16 ``[rows, layers, top_k]``, -1 where not recorded (null rows too).

        int16 columns without nulls are a zero-copy, read-only view of the Arrow buffer; uint8 columns are widened
        to int16 (one copy, read-only too: the kernels of :mod:`moestab.metrics.routes` take int16).
        """
        if isinstance(column, pa.ChunkedArray):
            if column.num_chunks == 1:
                return self.decode(column.chunk(0))
            parts = [self.decode(chunk) for chunk in column.chunks]
            return np.concatenate(parts) if parts else np.empty((0, self.layers, self.top_k), np.int16)
        if not pa.types.is_fixed_size_binary(column.type):
            raise ValueError(f"expected a fixed-size binary route column, got {column.type}")
        if column.type.byte_width != self.byte_width:
            raise ValueError(f"route column has {column.type.byte_width} bytes a row, its layout {self.byte_width} "
                             f"({self.layers} layers x top-{self.top_k} {self.dtype})")
        rows, width = len(column), self.layers * self.top_k
        data = column.buffers()[1]
        if rows * width == 0 or data is None:
            return np.full((rows, self.layers, self.top_k), -1, np.int16)
        stored = np.frombuffer(data, self.numpy_dtype, count=rows * width,
                               offset=column.offset * self.byte_width)  # [rows * width]
        if self.dtype == "uint8":
            # Widened by Arrow, into its memory pool, which reuses its pages batch after batch: numpy's astype took
            # fresh pages from the OS for every batch, and their faults doubled the decoding's CPU time.
            ids = pa.Array.from_buffers(pa.uint8(), rows * width, [None, data], offset=column.offset * self.byte_width)
            routes = pc.cast(ids, pa.int16()).to_numpy(zero_copy_only=True)  # [rows * width]
            if stored.max() == self.absent:
                routes = routes.copy()
                routes[stored == self.absent] = -1
        else:
            routes = stored.astype(np.int16, copy=False)  # a view on little-endian machines
        if column.null_count:
            routes = routes.copy() if not routes.flags.writeable else routes
            routes.reshape(rows, width)[~column.is_valid().to_numpy(zero_copy_only=False)] = -1
        return routes.reshape(rows, self.layers, self.top_k)  # [rows, layers, top_k]


def route_layout_for(
    num_experts: int, layers: int, top_k: int, *, schema_version: int = schema.SCHEMA_VERSION
) -> RouteLayout | None:
    """The layout a writer of ``schema_version`` uses for a model with ``num_experts`` experts: uint8 ids up to
    :data:`UINT8_MAX_EXPERTS` experts (half the bytes of int16), int16 above; ``None`` for version 2, whose route
    columns are ``FixedSizeList<int16>`` (written only to compare the layouts)."""
    if schema_version not in (2, schema.SCHEMA_VERSION):
        raise ValueError(f"route columns are written in schema version 2 or {schema.SCHEMA_VERSION}, "
                         f"not {schema_version}")
    if not 1 <= num_experts <= INT16_MAX_EXPERTS:
        raise ValueError(f"num_experts must be in 1..{INT16_MAX_EXPERTS}, got {num_experts}")
    if schema_version == 2:
        return None
    return RouteLayout("uint8" if num_experts <= UINT8_MAX_EXPERTS else "int16", layers, top_k)


def encode_routes(routes: np.ndarray, layout: RouteLayout | None) -> pa.Array:
    """int routes ``[rows, layers, top_k]`` (-1 = not recorded) as a route column: binary in ``layout``, or version
    2's ``FixedSizeList<int16>`` when ``layout`` is ``None``."""
    return list_route_column(routes) if layout is None else layout.encode(routes)


def with_route_layout(table: pa.Table, layout: RouteLayout | None) -> pa.Table:
    """``table`` with ``layout`` in its schema metadata, as its binary route columns need (unchanged for ``None``)."""
    if layout is None:
        return table
    return table.replace_schema_metadata({**(table.schema.metadata or {}), **layout.metadata()})


def route_layout(arrow_schema: pa.Schema) -> RouteLayout | None:
    """The layout of a table's binary route columns, from its schema metadata; ``None`` when it has none (a schema
    version 2 table, whose route columns are ``FixedSizeList<int16>``).

    Raises ``ValueError`` when the entry is there but not a layout this moestab reads.
    """
    raw = (arrow_schema.metadata or {}).get(schema.ROUTES_METADATA_KEY.encode())
    if raw is None:
        return None
    try:
        value: Any = json.loads(raw)
        if value.get("encoding") != "fixed_size_binary" or value.get("byte_order") != "little":
            raise ValueError(f"unknown route encoding {value.get('encoding')!r} / byte order "
                             f"{value.get('byte_order')!r}")
        layout = RouteLayout(str(value["dtype"]), int(value["layers"]), int(value["top_k"]))
        if value.get("absent") != layout.absent:
            raise ValueError(f"'absent' is {value.get('absent')!r}, {layout.absent} for {layout.dtype}")
    except (json.JSONDecodeError, AttributeError, KeyError, TypeError) as exc:
        raise ValueError(f"schema metadata {schema.ROUTES_METADATA_KEY!r} is not a route layout ({exc})") from exc
    return layout


def list_route_column(routes: np.ndarray) -> pa.FixedSizeListArray:
    """int routes ``[rows, layers, top_k]`` as schema version 2's ``FixedSizeList<int16>[layers * top_k]`` column
    (zero-copy from a C-contiguous int16 array). Readers still read that layout; writers use it only to compare the
    two (tests, bench/bench_analysis.py)."""
    routes = np.asarray(routes)
    if routes.ndim != 3:
        raise ValueError(f"routes must be [rows, layers, top_k], got shape {routes.shape}")
    flat = pa.array(np.ascontiguousarray(routes, dtype=np.int16).reshape(-1))  # [rows * layers * k]
    return pa.FixedSizeListArray.from_arrays(flat, routes.shape[1] * routes.shape[2])


def is_binary_route_field(field: pa.Field) -> bool:
    """Whether ``field`` is a schema version 3 route column."""
    return field.name in schema.ROUTE_COLUMNS and pa.types.is_fixed_size_binary(field.type)


def token_parquet_options(arrow_schema: pa.Schema) -> dict[str, Any]:
    """``pyarrow.parquet.write_table`` settings of a per-token table: pyarrow's defaults (snappy, dictionary
    pages) for every column but the binary route columns, which are written plain and uncompressed (module
    docstring: the ~15% snappy saved on them cost 60% of the decoding speed, and a dictionary never pays on
    rows that are almost all distinct)."""
    compression: dict[str, str] = {}
    dictionary: list[str] = []
    for field in arrow_schema:
        binary = is_binary_route_field(field)
        for path in _leaf_paths(field):
            compression[path] = "none" if binary else "snappy"
            if not binary:
                dictionary.append(path)
    return {"compression": compression, "use_dictionary": dictionary}


def _leaf_paths(field: pa.Field) -> list[str]:
    """Parquet column paths of an Arrow field (what per-column write settings are keyed by): ``name`` for a flat
    field, ``name.list.element`` for a list (pyarrow's compliant nested naming), ``name.child`` for a struct."""
    kind = field.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return [f"{field.name}.list.{path}" for path in _leaf_paths(kind.value_field.with_name("element"))]
    if pa.types.is_struct(kind):
        return [f"{field.name}.{path}" for i in range(kind.num_fields) for path in _leaf_paths(kind.field(i))]
    return [field.name]
