"""Read run folders (docs/run-format.md, names in :mod:`moestab.run_folder.schema`) into tidy data.

- :func:`~moestab.run_folder.run_info.read_run_info`  run.json -> :class:`RunInfo` (re-exported here)
- :func:`load_metrics`      metrics.jsonl -> one row per step
- :func:`list_token_files`, :func:`list_checkpoints`  what the run holds, by step
- :func:`iter_token_batches`, :func:`iter_run_batches`  per-token Parquet streamed by row group, so a
  record larger than memory can be summarised in bounded memory
- :func:`route_array`, :func:`margin_array`  route and per-layer columns -> numpy (route columns of any layout,
  :mod:`moestab.run_folder.route_columns`)
- :func:`load_tokens`       the scalar per-token columns of a run as one DataFrame (small runs)
- :func:`read_token_table`  one per-token table (or some of its columns) as an Arrow table, e.g. for DuckDB

Every reader hands out route columns holding their ids: a schema version 4 table's XORed columns are read with their
reference chains and decoded (:func:`~moestab.run_folder.route_columns.decoded_route_columns`), so the batches and
tables it gives have version 3's plain binary columns and layout, whatever the file stores.

Errors: :class:`NotARunError` (no run.json), :class:`SchemaVersionError` (a schema this moestab does
not read), :class:`RunFileError` (the file asked for is missing or corrupt, named). Readers that go
over many files or lines take ``skipped``: ``None`` raises on the first unreadable part, a list
collects a :class:`Skipped` per part left out (see :mod:`moestab.run_folder.errors`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from moestab.run_folder import schema
from moestab.run_folder.errors import RunFileError, Skipped, skip
from moestab.run_folder.route_columns import XOR, RouteLayout, decoded_route_columns, route_layout, stored_columns
from moestab.run_folder.run_info import RunInfo, read_run_info

__all__ = ["RunInfo", "read_run_info"]  # extended below by the readers' own names

# Values (list items included) per streamed batch when ``batch_rows`` is not given. Decoding a FixedSizeList column
# from Parquet holds several bytes per value besides the result, so peak memory follows the batch size (measured in
# bench/bench_analysis.py): 4M values, e.g. 5,461 rows of two 48-layer top-8 route columns, keep a stream near
# 200 MiB. A binary route column holds only its bytes and the int16 result: it counts half its bytes, so twice the
# rows (10,922 of two uint8 columns) keep the same peak (~215 MiB) in fewer, cheaper batches.
DEFAULT_BATCH_VALUES = 1 << 22
_READ_BUFFER = 1 << 20  # bytes of Parquet read buffer per column


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a text file, read one line at a time (a 1 GB metrics.jsonl is never in memory
    whole); :class:`RunFileError` when it is missing or unreadable."""
    try:
        with path.open(encoding="utf-8") as f:
            yield from enumerate(f, start=1)
    except FileNotFoundError as exc:
        raise RunFileError(path, "missing") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise RunFileError(path, f"unreadable ({exc})") from exc


def load_metrics(run: str | Path, skipped: list[Skipped] | None = None,
                 keys: Collection[str] | None = None, names: set[str] | None = None) -> pd.DataFrame:
    """Read ``RUN/metrics.jsonl`` into a DataFrame, one row per step, sorted by ``step``.

    Columns are the keys of the lines (``step``, ``reward/mean``, ``routing/old_new/changed``, ...);
    JSON ``null`` becomes NaN in numeric columns, list-valued keys (``.../changed_by_layer``,
    ``experts/load``) stay as Python lists in object columns. A line that is not a JSON object with
    an integer ``step`` (e.g. the torn last line of a running run) goes to ``skipped`` (raises
    :class:`RunFileError` naming the line when ``skipped`` is ``None``); when a step appears twice (a
    damaged run, :func:`metrics_step_problem`) the last line wins. Raises :class:`RunFileError` if the
    file is missing or unreadable. ``keys``: only these columns (and ``step``) are kept, so that memory follows what
    the caller reads, not the file: the file is read a line at a time. ``names``: every key that holds a number (not
    a list) on some line is added to it, kept or not, so that a caller can offer every key while holding a few.
    """
    path = Path(run) / schema.METRICS_JSONL
    wanted = None if keys is None else {"step", *keys}
    rows: list[dict[str, Any]] = []
    frames: list[pd.DataFrame] = []
    for number, line in _lines(path):
        row = _metrics_line(path, number, line, skipped, wanted, names)
        if row is None:
            continue
        rows.append(row)
        if len(rows) == METRICS_CHUNK_ROWS:  # into columns as it goes: a Python dict a line would hold ~1 KB each
            frames.append(_records(rows))
            rows = []
    frames.append(_records(rows))
    frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    if frame.empty:
        return pd.DataFrame({"step": pd.Series([], dtype="int64")})
    frame = frame.drop_duplicates("step", keep="last").sort_values("step", kind="stable")
    return frame.reset_index(drop=True)


def _metrics_line(path: Path, number: int, line: str, skipped: list[Skipped] | None, wanted: set[str] | None = None,
                  names: set[str] | None = None) -> dict[str, Any] | None:
    """One metrics.jsonl line as a row (``wanted``: only these keys), or None for a blank line or one that is not a
    JSON object with an integer ``step`` (reported to ``skipped``; raised when it is None); a value that is not a
    number, a list of numbers or null is left out and reported. ``names`` collects every key holding a number."""
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        skip(skipped, RunFileError(path, f"line {number} is not valid JSON ({exc.msg})"), line=number)
        return None
    except ValueError as exc:  # an integer of more digits than Python converts
        skip(skipped, RunFileError(path, f"line {number} cannot be read ({exc})"), line=number)
        return None
    step = row.get("step") if isinstance(row, dict) else None
    if isinstance(step, bool) or not isinstance(step, int):
        skip(skipped, RunFileError(path, f"line {number} is not an object with an integer 'step'"), line=number)
        return None
    if names is not None:
        names.update(k for k, v in row.items() if isinstance(v, int | float) and v == v and k != "step")
    if wanted is not None:
        row = {k: v for k, v in row.items() if k in wanted}
    for key in [k for k, value in row.items() if k != "step" and not _is_metric_value(value)]:
        shown = json.dumps(row.pop(key))
        skip(skipped, RunFileError(path, f"line {number} (step {step}): {key!r} is {shown[:40]}, not a number, a "
                                         "list of numbers or null; that value is left out"), line=number)
    return row


class MetricsFollower:
    """Reads the lines a run appends to its metrics.jsonl as it is written (``moestab watch``): each call to
    :meth:`new_rows` yields the complete lines added since the last one, checked as :func:`load_metrics` checks
    them (a bad line goes to ``skipped``), a few MB at a time; a line still being written (no newline yet) waits for
    the next call, or is read as it is with ``final``. A file replaced or cut shorter (a resumed run rewrites it) is
    read again from its first line, and :attr:`restarts` counts it."""

    CHUNK = 1 << 22

    def __init__(self, run: str | Path, skipped: list[Skipped]) -> None:
        self.path = Path(run) / schema.METRICS_JSONL
        self.skipped = skipped
        self.restarts = 0
        self._offset = 0
        self._number = 0
        self._inode: int | None = None

    def new_rows(self, *, final: bool = False) -> Iterator[dict[str, Any]]:
        """The rows of the complete lines appended since the last call (none while the file does not exist);
        ``final`` (the run has ended): a last line without a newline too."""
        try:
            f = self.path.open("rb")
        except FileNotFoundError:
            return
        except OSError as exc:
            raise RunFileError(self.path, f"unreadable ({exc})") from exc
        with f:
            stat = os.fstat(f.fileno())
            if self._inode is not None and (stat.st_ino != self._inode or stat.st_size < self._offset):
                self._offset, self._number = 0, 0
                self.restarts += 1
            self._inode = stat.st_ino
            f.seek(self._offset)
            carry = b""
            while data := f.read(self.CHUNK):
                data = carry + data
                end = data.rfind(b"\n") + 1  # whole lines only; the rest is carried to the next read
                carry = data[end:]
                self._offset += end
                yield from self._rows(data[:end])
            if final and carry.strip():
                self._offset += len(carry)
                yield from self._rows(carry)

    def _rows(self, data: bytes) -> Iterator[dict[str, Any]]:
        for raw in data.splitlines():
            self._number += 1
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                skip(self.skipped, RunFileError(self.path, f"line {self._number} is not UTF-8 ({exc})"),
                     line=self._number)
                continue
            row = _metrics_line(self.path, self._number, line, self.skipped)
            if row is not None:
                yield row


METRICS_CHUNK_ROWS = 8192
"""metrics.jsonl lines turned into DataFrame columns at a time (:func:`load_metrics`)."""


def _records(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """``rows`` as a frame; a column null on every row of the chunk is float NaN, as it is when another chunk has
    numbers in it (an object column of ``None`` would make the whole column object when the chunks are joined)."""
    frame = pd.DataFrame.from_records(rows)
    for column in frame.select_dtypes(include="object").columns:
        if frame[column].isna().all():
            frame[column] = np.nan
    return frame


def _is_metric_value(value: Any) -> bool:
    """A value metrics.jsonl may hold: a number (bool included), null, or a list (of lists) of those."""
    if value is None or isinstance(value, int | float):
        return True
    return isinstance(value, list) and all(_is_metric_value(item) for item in value)


def metrics_step_problem(run: str | Path) -> str | None:
    """What is wrong with the order of metrics.jsonl's steps, or ``None`` when each line's step is above the one
    before (or the file is missing or unreadable: :func:`load_metrics` says so).

    One writer appends its steps in order, and ``--resume`` first drops the lines after its checkpoint, so a step
    that repeats or goes back means two writers (or joined files) mixed their records: the run is
    ``schema.STATUS_DAMAGED`` whatever run.json says. Lines that are not JSON objects with an integer ``step`` are
    left out here (:func:`load_metrics` reports them).
    """
    path = Path(run) / schema.METRICS_JSONL
    last: tuple[int, int] | None = None  # (line, step) of the previous step
    try:
        for number, step in _steps_of(_lines(path)):
            if last is not None and step <= last[1]:
                how = "repeats" if step == last[1] else "goes back"
                return (f"{path}: the step {how}: line {number} is step {step}, after step {last[1]} on line "
                        f"{last[0]}; two writers (or joined files) mixed their records, so the run's numbers cannot "
                        "be trusted")
            last = (number, step)
    except RunFileError:
        return None
    return None


def _steps_of(lines: Iterable[tuple[int, str]]) -> Iterator[tuple[int, int]]:
    """``(line number, step)`` of each line that is a JSON object with an integer ``step``."""
    for number, line in lines:
        try:
            row = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            continue
        step = row.get("step") if isinstance(row, dict) else None
        if isinstance(step, bool) or not isinstance(step, int):
            continue
        yield number, step


def load_runs_metrics(runs: Iterable[str | Path], skipped: list[Skipped] | None = None) -> pd.DataFrame:
    """:func:`load_metrics` of several runs stacked, with a leading ``run`` column (folder name)."""
    frames = []
    for run in runs:
        frame = load_metrics(run, skipped)
        frame.insert(0, "run", Path(run).resolve().name)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame({"run": [], "step": []})


def _list_steps(folder: Path, parse, want_dir: bool) -> pd.DataFrame:
    rows = []
    if folder.is_dir():
        for entry in folder.iterdir():
            step = parse(entry.name)
            if step is not None and entry.is_dir() == want_dir:
                rows.append({"step": step, "path": entry})
    frame = pd.DataFrame(rows, columns=["step", "path"])
    return frame.sort_values("step", kind="stable").reset_index(drop=True).astype({"step": "int64"})


def list_token_files(run: str | Path) -> pd.DataFrame:
    """Per-token tables of a run: columns ``step`` (int) and ``path``, sorted by step (may be empty)."""
    return _list_steps(Path(run) / schema.TOKENS_DIR, schema.parse_tokens_name, want_dir=False)


def list_checkpoints(run: str | Path) -> pd.DataFrame:
    """Checkpoint folders ``checkpoints/step_XXXXXX``: columns ``step`` and ``path``, sorted by step.

    Checkpoints are renamed into place when complete (run format), so every listed folder is whole.
    """
    return _list_steps(Path(run) / schema.CHECKPOINTS_DIR, schema.parse_step_name, want_dir=True)


def open_token_file(path: str | Path) -> pq.ParquetFile:
    """Open one per-token Parquet table, raising :class:`RunFileError` (naming it) if it is unusable."""
    path = Path(path)
    if not path.is_file():
        raise RunFileError(path, "missing")
    try:
        # Buffered reads without pre-buffering: pyarrow's default (pre_buffer=True) reads ahead whole
        # column chunks, so memory grew with the file (bench/bench_analysis.py); this keeps it to a batch.
        return pq.ParquetFile(path, pre_buffer=False, buffer_size=_READ_BUFFER)
    except (OSError, pa.ArrowException) as exc:
        raise RunFileError(path, f"not a readable Parquet file ({exc})") from exc


def default_batch_rows(arrow_schema: pa.Schema, columns: Sequence[str] | None = None) -> int:
    """Rows per batch so that a batch of ``columns`` holds about :data:`DEFAULT_BATCH_VALUES` values (a fixed-size
    binary column counts half its bytes: see :data:`DEFAULT_BATCH_VALUES`)."""
    names = list(columns) if columns is not None else arrow_schema.names
    width = 0
    for name in names:
        kind = arrow_schema.field(name).type
        if pa.types.is_fixed_size_list(kind):
            width += int(kind.list_size)
        elif pa.types.is_fixed_size_binary(kind):
            width += max(1, int(kind.byte_width) // 2)
        else:
            width += 1
    return max(1024, DEFAULT_BATCH_VALUES // max(width, 1))


def _stored(
    parquet: pq.ParquetFile, path: str | Path, columns: Sequence[str] | None
) -> tuple[list[str], list[str], bool]:
    """``(columns, what to read for them, whether to decode what is read)``: ``columns`` (all if ``None``) and, in a
    schema version 4 table, the reference chains of its route columns, which are decoded
    (:func:`~moestab.run_folder.route_columns.stored_columns`). Raises :class:`RunFileError` for a missing column
    or route layout metadata this moestab cannot follow."""
    arrow_schema = parquet.schema_arrow  # built anew at each access
    names = arrow_schema.names
    wanted = list(columns) if columns is not None else names
    missing = [c for c in wanted if c not in names]
    if missing:
        raise RunFileError(path, f"missing column(s) {missing}; has {names}")
    if not set(wanted) & set(schema.ROUTE_COLUMNS):
        return wanted, wanted, False  # no route column: its layout does not matter
    try:
        layout = route_layout(arrow_schema)
        return wanted, stored_columns(layout, wanted, names), layout is not None and layout.encoding == XOR
    except ValueError as exc:
        raise RunFileError(path, f"malformed route layout ({exc})") from exc


def _decoded(data: pa.RecordBatch | pa.Table, path: str | Path, columns: Sequence[str]) -> pa.RecordBatch | pa.Table:
    """``data``'s ``columns``, route columns holding their ids (:func:`_stored` read their chains); a decoding
    error is a :class:`RunFileError` naming the file."""
    try:
        return decoded_route_columns(data, columns)
    except (ValueError, KeyError) as exc:  # what the table holds does not fit its route layout metadata
        raise RunFileError(path, f"malformed route column ({exc})") from exc


def iter_token_batches(
    path: str | Path, columns: Sequence[str] | None = None, batch_rows: int | None = None
) -> Iterator[pa.RecordBatch]:
    """Stream one per-token table as record batches of at most ``batch_rows`` rows.

    Reads with ``ParquetFile.iter_batches``: only ``columns`` (all if ``None``) are decoded, one
    batch at a time, so memory follows the batch size, not the file size (default
    :func:`default_batch_rows`, counting the reference columns a version 4 route column is read with). Route columns
    hold their ids whatever the schema version (module docstring). Raises :class:`RunFileError` naming the file if
    it is corrupt or lacks a requested column (batches already yielded stay valid).
    """
    if batch_rows is not None and batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    yield from _batches_of(open_token_file(path), path, columns, batch_rows)


def _batches_of(
    parquet: pq.ParquetFile, path: str | Path, columns: Sequence[str] | None, batch_rows: int | None
) -> Iterator[pa.RecordBatch]:
    """:func:`iter_token_batches` of a table already opened (one open per reader: opening costs as much as reading
    a small table's first rows)."""
    wanted, read, decode = _stored(parquet, path, columns)
    rows = batch_rows or default_batch_rows(parquet.schema_arrow, read)
    try:
        for batch in parquet.iter_batches(batch_size=rows, columns=read if columns else None):
            yield _decoded(batch, path, wanted) if decode else batch
    except (OSError, pa.ArrowException) as exc:
        raise RunFileError(path, f"corrupt Parquet data ({exc})") from exc


def iter_run_batches(
    run: str | Path,
    columns: Sequence[str] | None = None,
    steps: Iterable[int] | None = None,
    batch_rows: int | None = None,
    skipped: list[Skipped] | None = None,
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Stream the per-token tables of a run (``steps`` only, if given) as ``(step, batch)``.

    A file that is corrupt or lacks a column goes to ``skipped`` from the point of failure (the other
    files are still read); with ``skipped=None`` its :class:`RunFileError` is raised.
    """
    files = list_token_files(run)
    if steps is not None:
        files = files[files["step"].isin(list(steps))]
    for step, path in zip(files["step"], files["path"], strict=True):
        rows = 0
        try:
            for batch in iter_token_batches(path, columns, batch_rows):
                rows += batch.num_rows
                yield int(step), batch
        except RunFileError as exc:
            note = f"; left out from row {rows} on" if rows else "; left out"
            skip(skipped, RunFileError(exc.path, exc.problem + note))


def _fixed_list_values(column: pa.Array | pa.ChunkedArray, width: int, fill: Any) -> np.ndarray:
    """Values of a fixed-width list column as a ``[rows * width]`` numpy array (zero-copy if possible).

    Accepts a FixedSizeList (the run format) or a plain List whose lists all have ``width`` items
    (what a Parquet file written without its Arrow schema reads back as). Null items are read as
    ``fill`` and null rows as ``width`` copies of ``fill`` (both copy).
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    rows = len(column)
    if pa.types.is_fixed_size_list(column.type):
        if column.type.list_size != width:
            raise ValueError(f"list column has {column.type.list_size} items per row, expected {width}")
        # A FixedSizeList stores `width` values for every row, null rows included.
        values = column.values.slice(column.offset * width, rows * width)
    elif pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        offsets = column.offsets.to_numpy()  # [rows + 1]
        lengths = np.diff(offsets)  # [rows]
        valid = column.is_valid().to_numpy(zero_copy_only=False)  # [rows]
        if not np.all(lengths[valid] == width):
            raise ValueError(f"list column has rows whose length is not {width}")
        values = column.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        if column.null_count:  # null rows hold no values here: place the valid rows one by one
            out = np.full((rows, width), fill, dtype=values.type.to_pandas_dtype())
            out[valid] = values.fill_null(fill).to_numpy(zero_copy_only=False).reshape(-1, width)
            return out.reshape(-1)
    else:
        raise ValueError(f"expected a list column, got {column.type}")
    if column.null_count == 0 and values.null_count == 0:
        return values.to_numpy(zero_copy_only=True)
    out = values.fill_null(fill).to_numpy(zero_copy_only=False).copy()
    if column.null_count:
        out.reshape(rows, width)[~column.is_valid().to_numpy(zero_copy_only=False)] = fill
    return out


def route_array(
    column: pa.Array | pa.ChunkedArray, top_k: int, layout: RouteLayout | None = None, *, stored: bool = False
) -> np.ndarray:
    """A route column as an int16 array ``[rows, layers, top_k]``, -1 where a route was not recorded.

    Any layout: a binary column (schema versions 3 and 4) is decoded with ``layout``, its table's
    :func:`~moestab.run_folder.route_columns.route_layout` (``route_layout(batch.schema)``) as the readers of this
    module give it (holding its ids; a version 4 column read by other means may hold XORed bytes: its layout refuses
    it); version 2's ``FixedSizeList<int16>[layers * top_k]`` (or plain lists) needs none. Zero-copy when the column
    is int16 without nulls (the normal case of version 2): the array is a read-only view of the Arrow buffer; a
    uint8 column is widened (one copy), unless ``stored``: then a binary column keeps its stored dtype (uint8: 255 =
    not recorded; :meth:`RouteLayout.decode`), what the volatility kernel compares fastest. Nulls, not part of the
    format, are read as not recorded.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if pa.types.is_fixed_size_binary(column.type):
        if layout is None:
            raise ValueError("a binary route column needs its table's layout: route_array(column, top_k, "
                             "route_layout(schema)); the table's schema metadata has none")
        if layout.top_k != top_k:
            raise ValueError(f"route column holds top-{layout.top_k} decisions, expected top_k={top_k}")
        return layout.decode(column, stored=stored)
    width = _list_width(column)
    if width % top_k:
        raise ValueError(f"route column has {width} items per row, not a multiple of top_k={top_k}")
    flat = _fixed_list_values(column, width, -1)
    if flat.dtype != np.int16:
        flat = flat.astype(np.int16)
    return flat.reshape(len(column), width // top_k, top_k)  # [rows, layers, top_k]


def iter_run_routes(
    run: str | Path,
    route_columns: Sequence[str],
    top_k: int,
    other_columns: Sequence[str] = (),
    steps: Iterable[int] | None = None,
    batch_rows: int | None = None,
    skipped: list[Skipped] | None = None,
    *,
    num_experts: int | None = None,
    stored: bool = False,
) -> Iterator[tuple[int, pa.RecordBatch, dict[str, np.ndarray]]]:
    """:func:`iter_run_batches` plus the route columns as int16 ``[rows, layers, top_k]`` arrays (:func:`route_array`,
    any layout: each table is decoded by its own column types and schema metadata), or with ``stored`` in the dtype
    the table stores them in (uint8, 255 = not recorded, or int16, -1).

    Yields ``(step, batch, {column: routes})``. A file whose route column is malformed (a width that
    is not a multiple of ``top_k``, route columns of different widths, a binary column without its layout, or, given
    ``num_experts``, an expert id outside ``0 .. num_experts - 1`` and -1) goes to ``skipped`` from there on (raises
    with ``skipped=None``).
    """
    bad: set[int] = set()
    first_row: dict[int, int] = {}  # step -> the file row of the batch's first row
    columns = [*route_columns, *(c for c in other_columns if c not in route_columns)]
    for step, batch in iter_run_batches(run, columns, steps=steps, batch_rows=batch_rows, skipped=skipped):
        offset = first_row.get(step, 0)
        first_row[step] = offset + batch.num_rows
        if step in bad:
            continue
        try:
            layout = route_layout(batch.schema)
            routes = {c: route_array(batch.column(c), top_k, layout, stored=stored) for c in route_columns}
            if len({r.dtype for r in routes.values()}) > 1:  # a list column beside a binary one: compare as int16
                routes = {c: route_array(batch.column(c), top_k, layout) for c in route_columns}
            if len({r.shape[1] for r in routes.values()}) > 1:
                raise ValueError(f"route columns {list(route_columns)} hold different numbers of layers")
            for column, ids in routes.items():
                if num_experts is not None:
                    _check_ids(ids, column, num_experts, offset)
                check_decisions(ids, column, offset)
        except (ValueError, pa.ArrowException) as exc:
            bad.add(step)
            where = Path(run) / schema.tokens_file(step)
            skip(skipped, RunFileError(where, f"malformed route column ({exc}); the rest of the file is left out"))
            continue
        yield step, batch, routes


DECISION_SAMPLE_ROWS = 256
"""Rows of each batch, evenly spread, whose decisions :func:`check_decisions` reads for an expert named twice. A
broken reference chain of a schema version 4 table decodes most rows to zero bytes (``[0, 0]``), so a sample finds
it without reading every decision twice; damage confined to a few rows may pass it (the id range is checked in
full)."""


def check_decisions(ids: np.ndarray, column: str, first_row: int, sample: int = DECISION_SAMPLE_ROWS) -> None:
    """ValueError naming the first of ``sample`` evenly spread rows of ``ids`` ``[rows, layers, top_k]`` (int16, -1
    not recorded; or stored uint8, 255) whose decision names one expert twice: a top-k decision holds k distinct
    experts, so the table's bytes, or the reference chain its route columns are decoded along, are damaged."""
    rows, _, k = ids.shape
    if rows == 0 or k < 2:
        return
    picked = np.unique(np.linspace(0, rows - 1, min(rows, sample)).astype(np.intp))  # [m]
    part = ids[picked].astype(np.int16)  # [m, layers, k]
    if ids.dtype == np.uint8:
        part[part == 255] = -1  # stored uint8's "not recorded"
    ordered = np.sort(part, axis=2)  # [m, layers, k]: a repeated expert sits beside itself
    repeated = ((ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] >= 0)).any(axis=2)  # [m, layers]
    if repeated.any():
        row, layer = (int(i) for i in np.argwhere(repeated)[0])
        raise ValueError(f"{column} row {first_row + int(picked[row])}, layer {layer} names an expert twice "
                         f"({part[row, layer].tolist()}); a top-k decision holds k distinct experts: the table's "
                         "route bytes or the reference chain they are decoded along (schema version 4) are damaged")


def check_token_table(path: str | Path, top_k: int, num_experts: int | None = None,
                      rows: int = DECISION_SAMPLE_ROWS, *, decisions: bool = True) -> None:
    """:class:`RunFileError` naming ``path`` when it cannot be opened, its route layout cannot be followed, or the
    route columns of its first ``rows`` rows hold an id outside ``num_experts`` or a decision naming an expert twice
    (:func:`check_decisions`): what a reader that needs no token table (metrics.jsonl at hand) still says of one.
    ``decisions=False``: the file and its route layout only (no row is read)."""
    parquet = open_token_file(path)
    names = set(parquet.schema_arrow.names)
    columns = [c for c in schema.ROUTE_COLUMNS if c in names]
    if not columns:
        return
    if not decisions:
        _stored(parquet, path, columns)  # raises for a layout this moestab cannot follow
        return
    batch = next(_batches_of(parquet, path, columns, rows), None)
    if batch is None:
        return
    try:
        layout = route_layout(batch.schema)
        for column in columns:
            ids = route_array(batch.column(column), top_k, layout)  # [rows, layers, top_k]
            if num_experts is not None:
                _check_ids(ids, column, num_experts, 0)
            check_decisions(ids, column, 0)
    except (ValueError, pa.ArrowException) as exc:
        raise RunFileError(path, f"malformed route column ({exc})") from exc


def _check_ids(ids: np.ndarray, column: str, num_experts: int, first_row: int) -> None:
    """ValueError naming the first row of ``ids`` ``[rows, layers, top_k]`` (``first_row``: the file row of its row 0)
    whose id is not an expert or "not recorded" (-1 in int16, 255 in stored uint8)."""
    absent = 255 if ids.dtype == np.uint8 else -1
    if ids.size == 0:
        return
    if ids.dtype == np.uint8:  # one pass: "not recorded" (255) wraps to 0, every expert to 1..num_experts
        if (ids + np.uint8(1)).max() <= num_experts:
            return
    elif ids.min() >= -1 and ids.max() < num_experts:
        return
    bad = ((ids < 0) | (ids >= num_experts)) & (ids != absent)
    if bad.any():
        row, layer, slot = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{column} row {first_row + row}, layer {layer}, slot {slot} holds expert id "
                         f"{int(ids[row, layer, slot])}; the run has {num_experts} experts (ids 0..{num_experts - 1}, "
                         "-1 for none)")


def margin_array(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``margin_old`` (FixedSizeList<float32>[layers]) as float32 ``[rows, layers]``, NaN for nulls."""
    width = _list_width(column)
    flat = _fixed_list_values(column, width, np.nan)
    if flat.dtype != np.float32:
        flat = flat.astype(np.float32)
    return flat.reshape(len(column), width)  # [rows, layers]


def _list_width(column: pa.Array | pa.ChunkedArray) -> int:
    if pa.types.is_fixed_size_list(column.type):
        return int(column.type.list_size)
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        chunk = column.chunk(0) if isinstance(column, pa.ChunkedArray) and column.num_chunks else column
        if isinstance(chunk, pa.ChunkedArray) or len(chunk) == 0:
            return 0
        offsets = chunk.offsets.to_numpy()
        lens = np.diff(offsets)[chunk.is_valid().to_numpy(zero_copy_only=False)]
        return int(lens[0]) if lens.size else 0
    raise ValueError(f"expected a list column, got {column.type}")


def scalar_columns(parquet_schema: pa.Schema) -> list[str]:
    """Names of the one-value-a-row columns of a per-token table schema: not the per-layer lists, nor the route
    columns in any layout (lists, or schema versions 3 and 4's fixed-size binary)."""
    return [f.name for f in parquet_schema
            if not pa.types.is_nested(f.type) and not pa.types.is_fixed_size_binary(f.type)]


def load_tokens(
    run: str | Path,
    columns: Sequence[str] | None = None,
    steps: Iterable[int] | None = None,
    skipped: list[Skipped] | None = None,
) -> pd.DataFrame:
    """The scalar per-token columns of a run's tables (``steps`` only, if given) as one DataFrame.

    ``columns`` defaults to every one-value-a-row column (:func:`scalar_columns`; route and margin columns are
    read with :func:`route_array` / :func:`margin_array` instead). Holds everything in memory: for large runs
    pass only the columns needed, or stream with :func:`iter_run_batches`. Unreadable files go to
    ``skipped`` (raise with ``skipped=None``).
    """
    wanted = list(columns) if columns is not None else None
    tables: list[pa.Table] = []
    files = list_token_files(run)
    if steps is not None:
        files = files[files["step"].isin(list(steps))]
    for path in files["path"]:
        try:
            parquet = open_token_file(path)
            names = wanted if wanted is not None else scalar_columns(parquet.schema_arrow)
            tables.append(_read_table(parquet, path, names))
        except RunFileError as exc:
            skip(skipped, exc)
    if not tables:
        return pd.DataFrame(columns=wanted or [])
    table = pa.concat_tables(tables, promote_options="default")
    return table.to_pandas()


def _read_table(parquet: pq.ParquetFile, path: str | Path, columns: Sequence[str] | None) -> pa.Table:
    wanted, read, decode = _stored(parquet, path, columns)
    try:
        table = parquet.read(columns=read)
    except (OSError, pa.ArrowException) as exc:
        raise RunFileError(path, f"corrupt Parquet data ({exc})") from exc
    return _decoded(table, path, wanted) if decode else table


def read_token_table(path: str | Path, columns: Sequence[str] | None = None) -> pa.Table:
    """One per-token table (``columns`` only, if given), whole, as an Arrow table whose route columns hold their ids
    (a schema version 4 table's decoded: version 3's binary columns and ``moestab.routes`` layout; version 2's
    lists as they are). What DuckDB or pandas can query as they would a version 3 file (docs/run-format.md, "Route
    columns"). Raises :class:`RunFileError` naming the file if it is corrupt or lacks a column."""
    return _read_table(open_token_file(path), path, columns)


def read_routes(path: str | Path, column: str, top_k: int) -> np.ndarray:
    """One route column of one per-token table (any layout), whole, as int16 ``[rows, layers, top_k]``."""
    table = read_token_table(path, [column])
    return route_array(table.column(column), top_k, route_layout(table.schema))


def finite_or_none(value: Any) -> float | None:
    """``value`` as a float, or ``None`` when missing, null or NaN (for JSON output)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


__all__ += [
    "DEFAULT_BATCH_VALUES",
    "MetricsFollower",
    "default_batch_rows",
    "finite_or_none",
    "iter_run_batches",
    "iter_run_routes",
    "iter_token_batches",
    "list_checkpoints",
    "list_token_files",
    "load_metrics",
    "load_runs_metrics",
    "load_tokens",
    "margin_array",
    "metrics_step_problem",
    "open_token_file",
    "read_routes",
    "read_token_table",
    "route_array",
    "route_layout",
    "scalar_columns",
]
