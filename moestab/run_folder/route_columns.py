"""Route columns of the per-token tables: how expert ids are laid out in Parquet (docs/run-format.md, "Route columns").

Each route column is ``FixedSizeBinary(layers * top_k * itemsize)``: the row's ids, row-major ``[layer, slot]``,
little-endian ``uint8`` when the model has at most 255 experts (255 = not recorded) and ``int16`` otherwise (-1 = not
recorded). The dtype and shape are JSON under the table's schema metadata
:data:`~moestab.run_folder.schema.ROUTES_METADATA_KEY`, so any Parquet reader decodes the bytes without run.json or
guessing. Why binary: Parquet decodes a fixed-size binary column as one copy of its bytes, while a
``FixedSizeList<int16>`` (schema version 2) carries definition and repetition levels for every id and decoded ~10x
slower, which bound the streamed analysis (docs/benchmarks.md).

Schema version 4 (``encoding`` :data:`XOR`) stores what changed: the route columns of one step are mostly the same
decisions (identical under replay, 1-10% of experts apart otherwise), so each column but the first may be stored as
the bytewise XOR of its bytes with those of a *reference*, a column before it in ``schema.ROUTE_COLUMNS`` order chosen
per table (the one it differs from in the fewest bytes; none, stored in full, when it differs from every one in more
than :data:`DELTA_SHARE` of them). An identical column is all zero bytes, a near-identical one mostly zeros, and both
shrink to little under zstd, which also takes a column stored in full to 7 bits an id of 128 experts
(:func:`token_parquet_options`). XOR keeps every byte exact, "not recorded" included. A column's ids are the XOR of
the stored bytes along its reference chain (``routes_new`` -> ``routes_old_free`` -> ``routes_rollout``), which the
metadata names (``references``), so a column read alone pulls in its chain: :func:`stored_columns` says which, and
:func:`decoded_route_columns` turns what was read into version 3's plain columns, which is all a reader hands on.

Version 3 tables (every column in full, written plain and uncompressed) and version 2 tables (``FixedSizeList<int16>``,
no metadata) are still read; :func:`route_layout_for` still gives their writers' layouts, for comparing the layouts
(tests, bench/bench_analysis.py). Only ``moestab.run_folder`` and the recording layer's table builder use this module;
analyzers get int16 ``[rows, layers, top_k]`` arrays from the reader.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from moestab.run_folder import schema

UINT8_MAX_EXPERTS = 255
"""Most experts whose ids fit a uint8 route column: ids 0..254, with 255 left for "not recorded"."""
INT16_MAX_EXPERTS = int(np.iinfo(np.int16).max) + 1
"""Most experts an int16 route column holds (ids 0..32767, -1 = not recorded): the in-memory route dtype's limit."""

FULL = "fixed_size_binary"
"""Encoding of schema version 3: every route column holds its ids."""
XOR = "fixed_size_binary_xor"
"""Encoding of schema version 4: a route column holds its ids XOR those of its reference column (or its ids, with
none)."""
ENCODINGS = (FULL, XOR)

DELTA_SHARE = 0.5
"""A column is stored as its XOR with a reference while at most this share of its bytes differ from the reference's:
beyond it the XOR is about as costly as the ids themselves."""
REFERENCE_SAMPLE_ROWS = 4096
"""Rows, evenly spread, on which the writer counts the bytes two columns differ by to choose references (a sample:
the choice only moves the size, never the bytes read back)."""
FULL_COMPRESSION = ("zstd", 1)
"""Parquet codec and level of a version 4 route column stored in full (docs/benchmarks.md, "Route encodings")."""
DELTA_COMPRESSION = ("zstd", 1)
"""Parquet codec and level of a version 4 route column stored as an XOR (mostly zero bytes)."""

_ABSENT = {"uint8": 255, "int16": -1}  # stored value of a route that was not recorded, by dtype
_XOR_CHUNK = 1 << 18  # ids XORed a pass by the writer: the temporaries stay in cache


@dataclass(frozen=True)
class RouteLayout:
    """How one table's binary route columns hold expert ids: ``layers * top_k`` little-endian ``dtype`` ids a row,
    row-major ``[layer, slot]``, :attr:`absent` where a route was not recorded; in :data:`XOR` encoding some columns
    hold their ids XOR their reference's (:attr:`references`)."""

    dtype: str
    """``uint8`` (at most :data:`UINT8_MAX_EXPERTS` experts) or ``int16``."""
    layers: int
    """Recorded layers a row holds (``run.json`` ``model.recorded_layers``, in column order)."""
    top_k: int
    """Experts per decision."""
    encoding: str = FULL
    """:data:`FULL` (schema version 3) or :data:`XOR` (version 4)."""
    references: tuple[tuple[str, str | None], ...] = ()
    """:data:`XOR` only: each route column of the table and the column its bytes are XORed with (``None``: stored
    in full); empty in the layout a writer starts from (:func:`route_layout_for`), before it has seen the routes."""

    def __post_init__(self) -> None:
        if self.dtype not in _ABSENT:
            raise ValueError(f"route dtype must be one of {sorted(_ABSENT)}, got {self.dtype!r}")
        if self.layers < 0 or self.top_k < 1:
            raise ValueError(f"route layout needs layers >= 0 and top_k >= 1, got {self.layers} and {self.top_k}")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"route encoding must be one of {list(ENCODINGS)}, got {self.encoding!r}")
        if self.references and self.encoding != XOR:
            raise ValueError(f"only the {XOR!r} encoding has references, not {self.encoding!r}")
        _check_references(dict(self.references))

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

    @property
    def plain(self) -> RouteLayout:
        """This layout with every column in full (:data:`FULL`): what a reader's decoded columns are in."""
        return replace(self, encoding=FULL, references=())

    def reference_of(self, column: str) -> str | None:
        """The column whose bytes ``column``'s are XORed with; ``None`` when stored in full. ``ValueError`` for a
        column the references do not list."""
        if self.encoding == FULL:
            return None
        references = dict(self.references)
        if column not in references:
            raise ValueError(f"route column {column!r} has no entry in the layout's references {references}")
        return references[column]

    def chain(self, column: str) -> list[str]:
        """``column`` and the columns its ids are XORed with, nearest first, the column stored in full last."""
        chain = [column]
        while (reference := self.reference_of(chain[-1])) is not None:
            chain.append(reference)
        return chain

    def metadata(self) -> dict[bytes, bytes]:
        """The table's schema metadata entry that describes its route columns (docs/run-format.md)."""
        value: dict[str, Any] = {"encoding": self.encoding, "dtype": self.dtype, "byte_order": "little",
                                 "order": "[layer, slot]", "layers": self.layers, "top_k": self.top_k,
                                 "absent": self.absent}
        if self.encoding == XOR:
            value["references"] = dict(self.references)
        return {schema.ROUTES_METADATA_KEY.encode(): json.dumps(value).encode()}

    def checked(self, routes: np.ndarray) -> np.ndarray:
        """int routes ``[rows, layers, top_k]`` (-1 = not recorded; or ids already in the stored dtype, 255 = not
        recorded in uint8, as :meth:`stored_ids` gives them) as ``[rows, layers * top_k]`` (a view when contiguous).
        Raises ``ValueError`` for another shape or an id the dtype cannot hold (a uint8 column takes 0..254)."""
        routes = np.asarray(routes)
        if routes.ndim != 3 or routes.shape[1:] != (self.layers, self.top_k):
            raise ValueError(f"routes must be [rows, {self.layers}, {self.top_k}], got shape {routes.shape}")
        top = UINT8_MAX_EXPERTS - 1 if self.dtype == "uint8" else INT16_MAX_EXPERTS - 1
        stored = routes.dtype == self.numpy_dtype and self.dtype == "uint8"  # every byte an id or "not recorded"
        if routes.size and not stored and (routes.min() < -1 or routes.max() > top):
            raise ValueError(f"expert ids must be in -1..{top} for a {self.dtype} route column, "
                             f"got {routes.min()}..{routes.max()}")
        return routes.reshape(len(routes), self.layers * self.top_k)  # [rows, layers * k]

    def stored_ids(self, routes: np.ndarray) -> np.ndarray:
        """int routes ``[rows, layers, top_k]`` (-1 = not recorded, checked as :meth:`checked` does) as the column's
        ids ``[rows, layers * top_k]`` in the stored dtype (-1 wraps to 255 in uint8): a new array, or ``routes``'s
        memory when they are already stored ids."""
        return np.ascontiguousarray(self.checked(routes).astype(self.numpy_dtype, copy=False))  # [rows, layers * k]

    def encode(self, routes: np.ndarray) -> pa.FixedSizeBinaryArray:
        """int routes ``[rows, layers, top_k]`` (-1 = not recorded) as a binary route column of ``rows`` rows holding
        its ids (:meth:`stored_ids`)."""
        return _binary(self.stored_ids(routes), self.byte_width)

    def decode(self, column: pa.Array | pa.ChunkedArray, *, stored: bool = False) -> np.ndarray:
        """A binary route column holding its ids as int16 ``[rows, layers, top_k]``, -1 where not recorded (null rows
        too); with ``stored``, in the stored dtype instead (uint8: 255 where not recorded), which the kernels of
        :mod:`moestab.metrics.routes` compare without widening.

        Columns without nulls in their own dtype (int16, or ``stored``) are a zero-copy, read-only view of the Arrow
        buffer; uint8 columns are otherwise widened to int16 (one copy, read-only too). Raises ``ValueError`` in
        :data:`XOR` encoding, where a column alone may hold XORed bytes: the table's columns are decoded together
        (:func:`decoded_route_columns`, as the reader does).
        """
        if self.encoding != FULL:
            raise ValueError(f"a route column of a {self.encoding!r} table may hold its ids XOR another column's: "
                             "decode the table's columns together (route_columns.decoded_route_columns; "
                             "moestab.run_folder.reader does)")
        if isinstance(column, pa.ChunkedArray):
            if column.num_chunks == 1:
                return self.decode(column.chunk(0), stored=stored)
            parts = [self.decode(chunk, stored=stored) for chunk in column.chunks]
            dtype = self.numpy_dtype if stored else np.int16
            return np.concatenate(parts) if parts else np.empty((0, self.layers, self.top_k), dtype)
        self._check_type(column.type)
        rows, width = len(column), self.layers * self.top_k
        data = column.buffers()[1]
        if rows * width == 0 or data is None:
            return np.full((rows, self.layers, self.top_k), self.absent if stored else -1,
                           self.numpy_dtype if stored else np.int16)
        ids = np.frombuffer(data, self.numpy_dtype, count=rows * width,
                            offset=column.offset * self.byte_width)  # [rows * width]
        if stored:
            if column.null_count:
                ids = ids.copy()
                ids.reshape(rows, width)[~column.is_valid().to_numpy(zero_copy_only=False)] = self.absent
            return ids.reshape(rows, self.layers, self.top_k)  # [rows, layers, top_k]
        if self.dtype == "uint8":
            # Widened by Arrow, into its memory pool, which reuses its pages batch after batch: numpy's astype took
            # fresh pages from the OS for every batch, and their faults doubled the decoding's CPU time.
            wide = pa.Array.from_buffers(pa.uint8(), rows * width, [None, data], offset=column.offset * self.byte_width)
            routes = pc.cast(wide, pa.int16()).to_numpy(zero_copy_only=True)  # [rows * width]
            if ids.max() == self.absent:
                routes = routes.copy()
                routes[ids == self.absent] = -1
        else:
            routes = ids.astype(np.int16, copy=False)  # a view on little-endian machines
        if column.null_count:
            routes = routes.copy() if not routes.flags.writeable else routes
            routes.reshape(rows, width)[~column.is_valid().to_numpy(zero_copy_only=False)] = -1
        return routes.reshape(rows, self.layers, self.top_k)  # [rows, layers, top_k]

    def _check_type(self, kind: pa.DataType) -> None:
        if not pa.types.is_fixed_size_binary(kind):
            raise ValueError(f"expected a fixed-size binary route column, got {kind}")
        if kind.byte_width != self.byte_width:
            raise ValueError(f"route column has {kind.byte_width} bytes a row, its layout {self.byte_width} "
                             f"({self.layers} layers x top-{self.top_k} {self.dtype})")


def _check_references(references: Mapping[str, Any]) -> None:
    """``ValueError`` unless ``references`` maps route column names to route column names it lists (or ``None``),
    without a cycle: what a reader can follow to a column stored in full."""
    for column, reference in references.items():
        if column not in schema.ROUTE_COLUMNS:
            raise ValueError(f"references name {column!r}, not a route column; route columns: "
                             f"{list(schema.ROUTE_COLUMNS)}")
        if reference is not None and reference not in references:
            valid = sorted(c for c in references if c != column)
            raise ValueError(f"{column!r} references {reference!r}, which is not one of the table's route columns "
                             f"{valid} (or null, stored in full)")
    for column in references:
        seen = [column]
        while (reference := references[seen[-1]]) is not None:
            if reference in seen:
                raise ValueError(f"route column references form a cycle: {' -> '.join([*seen, reference])}; each "
                                 "chain must end at a column stored in full (reference null)")
            seen.append(reference)


def route_layout_for(
    num_experts: int, layers: int, top_k: int, *, schema_version: int = schema.SCHEMA_VERSION
) -> RouteLayout | None:
    """The layout a writer of ``schema_version`` uses for a model with ``num_experts`` experts: uint8 ids up to
    :data:`UINT8_MAX_EXPERTS` experts (half the bytes of int16), int16 above; :data:`XOR` encoding in version 4 (its
    references chosen by :func:`encode_route_columns`), :data:`FULL` in version 3; ``None`` for version 2, whose route
    columns are ``FixedSizeList<int16>`` (versions 2 and 3 are written only to compare the layouts)."""
    if schema_version not in (2, 3, schema.SCHEMA_VERSION):
        raise ValueError(f"route columns are written in schema version 2, 3 or {schema.SCHEMA_VERSION}, "
                         f"not {schema_version}")
    if not 1 <= num_experts <= INT16_MAX_EXPERTS:
        raise ValueError(f"num_experts must be in 1..{INT16_MAX_EXPERTS}, got {num_experts}")
    if schema_version == 2:
        return None
    return RouteLayout("uint8" if num_experts <= UINT8_MAX_EXPERTS else "int16", layers, top_k,
                       encoding=FULL if schema_version == 3 else XOR)


def encode_routes(routes: np.ndarray, layout: RouteLayout | None) -> pa.Array:
    """int routes ``[rows, layers, top_k]`` (-1 = not recorded) as a route column holding its ids: binary in
    ``layout``, or version 2's ``FixedSizeList<int16>`` when ``layout`` is ``None``."""
    return list_route_column(routes) if layout is None else layout.encode(routes)


def encode_route_columns(
    routes: Mapping[str, np.ndarray], layout: RouteLayout | None
) -> tuple[dict[str, pa.Array], RouteLayout | None]:
    """One table's route columns, from int routes ``[rows, layers, top_k]`` by column name (-1 = not recorded; or
    ids in the stored dtype, :meth:`RouteLayout.stored_ids`, which hold half the memory of int16 while the columns
    wait for each other), and the layout to put in its schema metadata (:func:`with_route_layout`).

    In :data:`XOR` encoding each column, in ``schema.ROUTE_COLUMNS`` order, takes as reference the earlier column it
    differs from in the fewest bytes (counted on :data:`REFERENCE_SAMPLE_ROWS` rows; ties: the earliest), or none
    when every one differs in more than :data:`DELTA_SHARE` of them, and is stored as its XOR with that reference;
    the returned layout names the references. Other layouts encode each column alone (:func:`encode_routes`).
    """
    unknown = [c for c in routes if c not in schema.ROUTE_COLUMNS]
    if unknown:
        raise ValueError(f"{unknown} are not route columns; route columns: {list(schema.ROUTE_COLUMNS)}")
    names = [c for c in schema.ROUTE_COLUMNS if c in routes]
    if layout is None or layout.encoding == FULL:
        return {c: encode_routes(routes[c], layout) for c in names}, layout
    ids = {c: layout.checked(routes[c]) for c in names}  # [rows, layers * k] each, as given
    if len({len(a) for a in ids.values()}) > 1:
        raise ValueError(f"route columns of one table need the same rows, got {[len(a) for a in ids.values()]}")
    rows = len(ids[names[0]]) if names else 0
    pick = np.unique(np.linspace(0, rows - 1, min(rows, REFERENCE_SAMPLE_ROWS)).astype(np.int64))  # [sample]
    references = _choose_references({c: a[pick].astype(layout.numpy_dtype).view(np.uint8) for c, a in ids.items()})
    columns = {}
    for column in names:
        reference = references[column]
        stored = (np.ascontiguousarray(ids[column].astype(layout.numpy_dtype, copy=False)) if reference is None
                  else _xor_ids(ids[column], ids[reference], layout.numpy_dtype))  # [rows, layers * k]
        columns[column] = _binary(stored, layout.byte_width)
    return columns, replace(layout, references=tuple(references.items()))


def _xor_ids(ids: np.ndarray, reference: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``ids`` XOR ``reference`` (int ``[rows, width]`` each) in the stored ``dtype``: the XOR of the two columns'
    stored bytes, since narrowing to the low byte (uint8) or to little-endian int16 commutes with XOR.

    Computed a chunk at a time into zeroed memory that only chunks with a difference write to: the pages of an
    identical column are never touched (the OS maps them to its zero page), which spares the writer their faults."""
    out = np.zeros(ids.shape, dtype)  # [rows, width]
    step = max(1, _XOR_CHUNK // max(ids.shape[1], 1))
    for start in range(0, len(ids), step):
        differ = np.bitwise_xor(ids[start:start + step], reference[start:start + step])  # [step, width]
        if differ.any():
            out[start:start + step] = differ  # cast as astype does: -1 -> 255 in uint8
    return out


def _choose_references(stored: Mapping[str, np.ndarray]) -> dict[str, str | None]:
    """Per column (in order), the earlier column whose sampled bytes ``[sample, width]`` differ from its own in the
    fewest places, or ``None`` beyond :data:`DELTA_SHARE` of them (module docstring)."""
    names = list(stored)
    sample = stored
    references: dict[str, str | None] = {}
    for i, column in enumerate(names):
        best, fewest = None, DELTA_SHARE * sample[column].size
        for earlier in names[:i]:
            differ = int(np.count_nonzero(sample[column] != sample[earlier]))  # bytes the XOR leaves nonzero
            if differ <= fewest and (best is None or differ < fewest):
                best, fewest = earlier, differ
        references[column] = best
    return references


def _binary(stored: np.ndarray, byte_width: int) -> pa.FixedSizeBinaryArray:
    """A fixed-size binary column over the bytes of ``stored`` (``[rows, ...]``, C-contiguous), without a copy."""
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(byte_width), len(stored), [None, pa.py_buffer(stored)])


def with_route_layout(table: pa.Table, layout: RouteLayout | None) -> pa.Table:
    """``table`` with ``layout`` in its schema metadata, as its binary route columns need (unchanged for ``None``).

    ``layout`` is the one :func:`encode_route_columns` returned for these columns; in :data:`XOR` encoding it must
    name a reference (or none) for each route column of ``table``."""
    if layout is None:
        return table
    if layout.encoding == XOR:
        listed = dict(layout.references)
        missing = [c for c in table.column_names if c in schema.ROUTE_COLUMNS and c not in listed]
        if missing:
            raise ValueError(f"route columns {missing} have no reference in the layout (encode_route_columns "
                             "gives the layout of the columns it encodes)")
    return table.replace_schema_metadata({**(table.schema.metadata or {}), **layout.metadata()})


def route_layout(arrow_schema: pa.Schema) -> RouteLayout | None:
    """The layout of a table's binary route columns, from its schema metadata; ``None`` when it has none (a schema
    version 2 table, whose route columns are ``FixedSizeList<int16>``).

    Run folders are untrusted input: raises ``ValueError``, saying what is wrong and what is valid, when the entry is
    there but not a layout this moestab reads (an unknown encoding or dtype, references to columns that are not
    route columns of the layout, or in a cycle).
    """
    raw = (arrow_schema.metadata or {}).get(schema.ROUTES_METADATA_KEY.encode())
    if raw is None:
        return None
    try:
        value: Any = json.loads(raw)
        if value.get("encoding") not in ENCODINGS or value.get("byte_order") != "little":
            raise ValueError(f"unknown route encoding {value.get('encoding')!r} / byte order "
                             f"{value.get('byte_order')!r}; this moestab reads encodings {list(ENCODINGS)}, "
                             "byte order 'little'")
        references = value.get("references") if value["encoding"] == XOR else {}
        if not isinstance(references, dict):
            raise ValueError(f"'references' must be an object of route column -> route column or null, "
                             f"got {references!r}")
        if any(not (r is None or isinstance(r, str)) for r in references.values()):
            raise ValueError(f"'references' values must be route column names or null, got {references}")
        shape = [value["layers"], value["top_k"]]
        if any(isinstance(n, bool) or not isinstance(n, int) for n in shape):
            raise ValueError(f"'layers' and 'top_k' must be integers, got {shape}")
        layout = RouteLayout(str(value["dtype"]), *shape, encoding=value["encoding"],
                             references=tuple(references.items()))
        if value.get("absent") != layout.absent:
            raise ValueError(f"'absent' is {value.get('absent')!r}, {layout.absent} for {layout.dtype}")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, KeyError, TypeError) as exc:
        raise ValueError(f"schema metadata {schema.ROUTES_METADATA_KEY!r} is not a route layout ({exc!r})") from exc
    return layout


def stored_columns(layout: RouteLayout | None, columns: Sequence[str], available: Sequence[str]) -> list[str]:
    """The columns to read from a table with ``available`` columns so that ``columns`` decode: ``columns`` and, in
    :data:`XOR` encoding, every column on their route columns' reference chains (in order, each once).

    ``ValueError`` when a chain needs a column the table does not hold or a route column of the table has no entry in
    the references."""
    wanted = list(dict.fromkeys(columns))
    if layout is None or layout.encoding == FULL:
        return wanted
    for column in [c for c in wanted if c in available and c in schema.ROUTE_COLUMNS]:
        chain = layout.chain(column)
        for holder, reference in itertools.pairwise(chain):  # pairs along the chain
            if reference not in available:
                raise ValueError(f"{holder} is stored as its XOR with {reference}, which the table does not hold "
                                 f"(it has {[c for c in available if c in schema.ROUTE_COLUMNS]})")
        wanted += [c for c in chain if c not in wanted]
    return wanted


def decoded_route_columns(data: pa.RecordBatch | pa.Table, columns: Sequence[str]) -> pa.RecordBatch | pa.Table:
    """``data``'s ``columns``, in that order, its route columns holding their ids: in :data:`XOR` encoding each is
    XORed with the columns of its reference chain (which ``data`` must hold: :func:`stored_columns`), and the schema
    metadata describes the result (:attr:`RouteLayout.plain`); a table of another layout is returned as it is (its
    ``columns`` only). A null row, never written, reads as not recorded."""
    layout = route_layout(data.schema)
    if layout is None or layout.encoding == FULL:
        return data.select(list(columns))
    decoded = data.schema.metadata | layout.plain.metadata()
    fields = [data.schema.field(c) for c in columns]
    if isinstance(data, pa.Table):
        out_schema = pa.schema(fields, metadata=decoded)
        return pa.Table.from_batches([decoded_route_columns(b, columns) for b in data.to_batches()], out_schema)
    ids: dict[str, tuple[pa.Buffer, int]] = {}  # column -> (buffer of its ids' bytes, byte offset)
    arrays = []
    for column in columns:
        array = data.column(column)
        if column in schema.ROUTE_COLUMNS and layout.reference_of(column) is not None:
            buffer, offset = _ids(data, layout, column, ids)
            array = pa.FixedSizeBinaryArray.from_buffers(pa.binary(layout.byte_width), len(array), [None, buffer],
                                                         offset=offset // layout.byte_width)
            chain = [data.column(link) for link in layout.chain(column)]
            if any(link.null_count for link in chain):  # a row null anywhere on the chain cannot be decoded
                valid = chain[0].is_valid()
                for link in chain[1:]:
                    valid = pc.and_(valid, link.is_valid())
                array = pc.if_else(valid, array, pa.scalar(None, array.type))
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, metadata=decoded))


def _ids(
    data: pa.RecordBatch, layout: RouteLayout, column: str, ids: dict[str, tuple[pa.Buffer, int]]
) -> tuple[pa.Buffer, int]:
    """The bytes of ``column``'s ids in ``data`` (buffer, byte offset): its stored bytes XOR those of each column on
    its reference chain, which ``ids`` keeps (and is filled with) for the other columns of the batch.

    A loop, not a recursive closure: a closure that calls itself is a reference cycle, which kept every batch's
    buffers alive until the garbage collector ran (4x the streaming's memory, a third of its speed)."""
    for link in reversed(layout.chain(column)):  # from the column stored in full to ``column``
        if link in ids:
            continue
        array = data.column(link)
        layout._check_type(array.type)
        size = len(array) * layout.byte_width
        stored = (array.buffers()[1], array.offset * layout.byte_width) if size else (pa.py_buffer(b""), 0)
        reference = layout.reference_of(link)
        if reference is None:
            ids[link] = stored
        elif not _bytes(*stored, size).any():
            ids[link] = ids[reference]  # identical to its reference: the same bytes, no copy
        else:  # numpy's XOR (5x faster than Arrow's bit_wise_xor on a 4 MB batch here), in numpy's reused heap
            xored = np.bitwise_xor(_bytes(*stored, size), _bytes(*ids[reference], size))  # [size]
            ids[link] = (pa.py_buffer(xored), 0)
    return ids[column]


def _bytes(buffer: pa.Buffer, offset: int, size: int) -> np.ndarray:
    """``size`` bytes of ``buffer`` from ``offset``, a read-only view."""
    return np.frombuffer(buffer, np.uint8, size, offset)


def list_route_column(routes: np.ndarray) -> pa.FixedSizeListArray:
    """int routes ``[rows, layers, top_k]`` as schema version 2's ``FixedSizeList<int16>[layers * top_k]`` column
    (zero-copy from a C-contiguous int16 array). Readers still read that layout; writers use it only to compare the
    layouts (tests, bench/bench_analysis.py)."""
    routes = np.asarray(routes)
    if routes.ndim != 3:
        raise ValueError(f"routes must be [rows, layers, top_k], got shape {routes.shape}")
    flat = pa.array(np.ascontiguousarray(routes, dtype=np.int16).reshape(-1))  # [rows * layers * k]
    return pa.FixedSizeListArray.from_arrays(flat, routes.shape[1] * routes.shape[2])


def is_binary_route_field(field: pa.Field) -> bool:
    """Whether ``field`` is a binary route column (schema versions 3 and 4)."""
    return field.name in schema.ROUTE_COLUMNS and pa.types.is_fixed_size_binary(field.type)


def token_parquet_options(
    arrow_schema: pa.Schema,
    *,
    full: tuple[str, int | None] = FULL_COMPRESSION,
    delta: tuple[str, int | None] = DELTA_COMPRESSION,
) -> dict[str, Any]:
    """``pyarrow.parquet.write_table`` settings of a per-token table: pyarrow's defaults (snappy, dictionary
    pages) for every column but the binary route columns, which never take a dictionary (their rows are almost all
    distinct). In version 3 they are written plain and uncompressed (the ~15% snappy saved on them cost 60% of the
    decoding speed); in version 4 a column stored in full takes the codec and level ``full`` and an XOR ``delta``
    (the writer's: :data:`FULL_COMPRESSION`, :data:`DELTA_COMPRESSION`; docs/benchmarks.md, "Route encodings"; level
    ``None``: the codec's default, as ``none`` needs)."""
    layout = route_layout(arrow_schema)
    compression: dict[str, str] = {}
    level: dict[str, int] = {}  # only the columns given one: a level for "none" is an error
    dictionary: list[str] = []
    for field in arrow_schema:
        binary = is_binary_route_field(field)
        for path in _leaf_paths(field):
            compression[path] = "none" if binary else "snappy"
            if not binary:
                dictionary.append(path)
            elif layout is not None and layout.encoding == XOR:
                codec, codec_level = full if layout.reference_of(field.name) is None else delta
                compression[path] = codec
                if codec_level is not None:
                    level[path] = codec_level
    options: dict[str, Any] = {"compression": compression, "use_dictionary": dictionary}
    return options | ({"compression_level": level} if level else {})


def _leaf_paths(field: pa.Field) -> list[str]:
    """Parquet column paths of an Arrow field (what per-column write settings are keyed by): ``name`` for a flat
    field, ``name.list.element`` for a list (pyarrow's compliant nested naming), ``name.child`` for a struct."""
    kind = field.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return [f"{field.name}.list.{path}" for path in _leaf_paths(kind.value_field.with_name("element"))]
    if pa.types.is_struct(kind):
        return [f"{field.name}.{path}" for i in range(kind.num_fields) for path in _leaf_paths(kind.field(i))]
    return [field.name]
