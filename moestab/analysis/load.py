"""Read run folders (docs/run-format.md, names in :mod:`moestab.records.schema`) into tidy data.

- :func:`load_run_info`     run.json -> :class:`RunInfo` (checks ``schema_version``)
- :func:`load_metrics`      metrics.jsonl -> one row per step
- :func:`list_token_files`, :func:`list_checkpoints`  what the run holds, by step
- :func:`iter_token_batches`, :func:`iter_run_batches`  per-token Parquet streamed by row group, so a
  record larger than memory can be summarised in bounded memory
- :func:`route_array`, :func:`margin_array`  FixedSizeList columns -> numpy, zero-copy
- :func:`load_tokens`       the scalar per-token columns of a run as one DataFrame (small runs)

Errors: :class:`NotARunError` (no run.json), :class:`SchemaVersionError` (newer run.json),
:class:`RunFileError` (the file asked for is missing or corrupt, named). Readers that go over many
files or lines skip the unreadable ones with a :class:`RunReadWarning` and return the rest.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from moestab.analysis.errors import NotARunError, RunFileError, RunReadWarning, SchemaVersionError
from moestab.records import schema

# Values (list items included) per streamed batch when ``batch_rows`` is not given. Decoding a
# FixedSizeList column from Parquet holds several bytes per value besides the result, so peak memory
# follows the batch size (measured in bench/bench_analysis.py): 4M values, e.g. 5,461 rows of two
# 48-layer top-8 route columns, keep a stream near 200 MiB.
DEFAULT_BATCH_VALUES = 1 << 22
_READ_BUFFER = 1 << 20  # bytes of Parquet read buffer per column

_STEP_NAME = re.compile(r"^step_(\d{6,})$")
_TOKENS_NAME = re.compile(r"^step_(\d{6,})\.parquet$")

# Config keys that name the policy loss and the routing-replay mode. The run format does not fix
# them (config is "every field" of the training config), so look for the usual names.
_ALGO_KEYS = ("algo", "algorithm", "loss", "policy_loss", "objective")
_REPLAY_KEYS = ("routing_replay", "replay", "replay_mode", "routing_replay_mode")
# moestab.train.TrainConfig.routing_replay values -> the names of the papers.
_REPLAY_NAMES = {"off": "off", "old": "R2", "rollout": "R3", "r2": "R2", "r3": "R3", "none": "off"}
_MODEL_KEYS = ("model", "model_name", "model_path", "base_model", "policy")


@dataclass(frozen=True)
class RunInfo:
    """What run.json says about a run, with the fields the analyzers use pulled out."""

    path: Path
    """The run folder."""
    name: str
    """The run folder's name."""
    schema_version: int
    """``run.json["schema_version"]`` (<= :data:`moestab.records.schema.SCHEMA_VERSION`)."""
    status: str
    """``running``, ``finished``, ``failed`` or ``interrupted``; ``unknown`` if absent."""
    algo: str | None
    """Policy loss name from the config (first of ``algo``, ``algorithm``, ``loss``, ...), if any."""
    replay: str | None
    """Routing-replay mode from the config: ``off``, ``R2`` (config ``old``: pi_old's trainer routes
    replayed), ``R3`` (config ``rollout``: the rollout engine's routes replayed), or the raw value."""
    model: str | None
    """Model name: from the config, else ``warm_start.path``, else ``model.family``."""
    num_layers: int | None
    """Number of MoE layers of the model."""
    num_experts: int | None
    """Routed experts per MoE layer."""
    top_k: int | None
    """Experts chosen per token and layer."""
    recorded_layers: tuple[int, ...]
    """MoE-layer ordinals present in the route columns, in column order."""
    last_step: int | None
    """Last completed step."""
    warm_start_accuracy: float | None
    """Eval accuracy of the starting policy."""
    final_accuracy: float | None
    """Eval accuracy after training (finished runs)."""
    error: str | None
    """Message of a failed run."""
    raw: dict[str, Any] = field(repr=False, compare=False)
    """The whole run.json."""


def _num(value: Any) -> float | None:
    """A JSON number as float, ``None`` for null / missing / non-numbers."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _first_key(config: dict[str, Any], keys: Sequence[str]) -> str | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, dict):  # e.g. {"model": {"name": ...}} or {"loss": {"name": ...}}
            for sub in ("name", "path", "mode"):
                if isinstance(value.get(sub), str):
                    return value[sub]
    return None


def _replay_name(value: str | None) -> str | None:
    return None if value is None else _REPLAY_NAMES.get(value.lower(), value)


def load_run_info(run: str | Path) -> RunInfo:
    """Read ``RUN/run.json``.

    Raises :class:`NotARunError` if ``run`` is not a folder with a run.json,
    :class:`RunFileError` if run.json is not a JSON object with an integer ``schema_version``, and
    :class:`SchemaVersionError` if that version is newer than
    :data:`moestab.records.schema.SCHEMA_VERSION`.
    """
    path = Path(run)
    if not path.is_dir():
        raise NotARunError(f"{path} is not a moestab run folder: not a directory")
    run_json = path / schema.RUN_JSON
    if not run_json.is_file():
        raise NotARunError(f"{path} is not a moestab run folder: it has no {schema.RUN_JSON}")
    try:
        raw = json.loads(run_json.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunFileError(run_json, f"unreadable or not valid JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise RunFileError(run_json, "not a JSON object")
    version = raw.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise RunFileError(run_json, f"schema_version missing or not an integer (got {version!r})")
    if version > schema.SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{run_json}: schema_version {version} is newer than this moestab reads "
            f"(<= {schema.SCHEMA_VERSION}); upgrade moestab to analyse this run"
        )
    config = raw.get("config") if isinstance(raw.get("config"), dict) else {}
    model = raw.get("model") if isinstance(raw.get("model"), dict) else {}
    warm = raw.get("warm_start") if isinstance(raw.get("warm_start"), dict) else {}
    final = raw.get("final") if isinstance(raw.get("final"), dict) else {}
    layers = model.get("recorded_layers")
    recorded = tuple(layers) if isinstance(layers, list) else ()
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in recorded):
        raise RunFileError(run_json, f"model.recorded_layers must be a list of integers, got {layers!r}")
    model_name = _first_key(config, _MODEL_KEYS)
    if model_name is None and isinstance(warm.get("path"), str):
        model_name = warm["path"]
    if model_name is None and isinstance(model.get("family"), str):
        model_name = model["family"]

    def _int(value: Any) -> int | None:
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

    return RunInfo(
        path=path,
        name=path.resolve().name,
        schema_version=version,
        status=str(raw.get("status", "unknown")),
        algo=_first_key(config, _ALGO_KEYS),
        replay=_replay_name(_first_key(config, _REPLAY_KEYS)),
        model=model_name,
        num_layers=_int(model.get("num_layers")),
        num_experts=_int(model.get("num_experts")),
        top_k=_int(model.get("top_k")),
        recorded_layers=recorded,
        last_step=_int(raw.get("last_step")),
        warm_start_accuracy=_num(warm.get("accuracy")),
        final_accuracy=_num(final.get("accuracy")),
        error=raw.get("error") if isinstance(raw.get("error"), str) else None,
        raw=raw,
    )


def load_metrics(run: str | Path) -> pd.DataFrame:
    """Read ``RUN/metrics.jsonl`` into a DataFrame, one row per step, sorted by ``step``.

    Columns are the keys of the lines (``step``, ``reward/mean``, ``routing/old_new/changed``, ...);
    JSON ``null`` becomes NaN in numeric columns, list-valued keys (``.../changed_by_layer``,
    ``experts/load``) stay as Python lists in object columns. A line that is not a JSON object with
    an integer ``step`` (e.g. the torn last line of a running run) is skipped with a
    :class:`RunReadWarning`; when a step appears twice (a resumed run) the last line wins. Raises
    :class:`RunFileError` if the file is missing or unreadable.
    """
    path = Path(run) / schema.METRICS_JSONL
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise RunFileError(path, "missing") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise RunFileError(path, f"unreadable ({exc})") from exc
    rows: list[dict[str, Any]] = []
    bad: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad.append(number)
            continue
        step = row.get("step") if isinstance(row, dict) else None
        if isinstance(step, bool) or not isinstance(step, int):
            bad.append(number)
            continue
        rows.append(row)
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (" ..." if len(bad) > 5 else "")
        warnings.warn(RunReadWarning(f"{path}: skipped {len(bad)} unreadable line(s) (line {shown})"), stacklevel=2)
    frame = pd.DataFrame.from_records(rows)
    if frame.empty:
        return pd.DataFrame({"step": pd.Series([], dtype="int64")})
    frame = frame.drop_duplicates("step", keep="last").sort_values("step", kind="stable")
    return frame.reset_index(drop=True)


def load_runs_metrics(runs: Iterable[str | Path]) -> pd.DataFrame:
    """:func:`load_metrics` of several runs stacked, with a leading ``run`` column (folder name)."""
    frames = []
    for run in runs:
        frame = load_metrics(run)
        frame.insert(0, "run", Path(run).resolve().name)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame({"run": [], "step": []})


def _list_steps(folder: Path, pattern: re.Pattern[str], want_dir: bool) -> pd.DataFrame:
    rows = []
    if folder.is_dir():
        for entry in folder.iterdir():
            match = pattern.match(entry.name)
            if match and entry.is_dir() == want_dir:
                rows.append({"step": int(match.group(1)), "path": entry})
    frame = pd.DataFrame(rows, columns=["step", "path"])
    return frame.sort_values("step", kind="stable").reset_index(drop=True).astype({"step": "int64"})


def list_token_files(run: str | Path) -> pd.DataFrame:
    """Per-token tables of a run: columns ``step`` (int) and ``path``, sorted by step (may be empty)."""
    return _list_steps(Path(run) / schema.TOKENS_DIR, _TOKENS_NAME, want_dir=False)


def list_checkpoints(run: str | Path) -> pd.DataFrame:
    """Checkpoint folders ``checkpoints/step_XXXXXX``: columns ``step`` and ``path``, sorted by step.

    Checkpoints are renamed into place when complete (run format), so every listed folder is whole.
    """
    return _list_steps(Path(run) / schema.CHECKPOINTS_DIR, _STEP_NAME, want_dir=True)


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
    """Rows per batch so that a batch of ``columns`` holds about :data:`DEFAULT_BATCH_VALUES` values."""
    names = list(columns) if columns is not None else arrow_schema.names
    width = 0
    for name in names:
        kind = arrow_schema.field(name).type
        width += int(kind.list_size) if pa.types.is_fixed_size_list(kind) else 1
    return max(1024, DEFAULT_BATCH_VALUES // max(width, 1))


def iter_token_batches(
    path: str | Path, columns: Sequence[str] | None = None, batch_rows: int | None = None
) -> Iterator[pa.RecordBatch]:
    """Stream one per-token table as record batches of at most ``batch_rows`` rows.

    Reads with ``ParquetFile.iter_batches``: only ``columns`` (all if ``None``) are decoded, one
    batch at a time, so memory follows the batch size, not the file size (default
    :func:`default_batch_rows`). Raises :class:`RunFileError` naming the file if it is corrupt or
    lacks a requested column (batches already yielded stay valid).
    """
    if batch_rows is not None and batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    parquet = open_token_file(path)
    if columns is not None:
        missing = [c for c in columns if c not in parquet.schema_arrow.names]
        if missing:
            raise RunFileError(path, f"missing column(s) {missing}; has {parquet.schema_arrow.names}")
    rows = batch_rows or default_batch_rows(parquet.schema_arrow, columns)
    try:
        yield from parquet.iter_batches(batch_size=rows, columns=list(columns) if columns else None)
    except (OSError, pa.ArrowException) as exc:
        raise RunFileError(path, f"corrupt Parquet data ({exc})") from exc


def iter_run_batches(
    run: str | Path,
    columns: Sequence[str] | None = None,
    steps: Iterable[int] | None = None,
    batch_rows: int | None = None,
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Stream the per-token tables of a run (``steps`` only, if given) as ``(step, batch)``.

    A file that is corrupt or lacks a column is skipped (from the point of failure) with a
    :class:`RunReadWarning` naming it; the other files are still read.
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
            note = f" after {rows} row(s)" if rows else ""
            warnings.warn(RunReadWarning(f"skipped{note}: {exc}"), stacklevel=2)


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


def route_array(column: pa.Array | pa.ChunkedArray, top_k: int) -> np.ndarray:
    """A route column (FixedSizeList<int16>[layers * top_k]) as an int16 array ``[rows, layers, top_k]``.

    Zero-copy when the column has no nulls (the normal case): the array is a read-only view of the
    Arrow buffer. Nulls, not part of the format, are read as -1 (not recorded).
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
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
) -> Iterator[tuple[int, pa.RecordBatch, dict[str, np.ndarray]]]:
    """:func:`iter_run_batches` plus the route columns as int16 ``[rows, layers, top_k]`` arrays.

    Yields ``(step, batch, {column: routes})``. A file whose route column is malformed (a width that
    is not a multiple of ``top_k``, route columns of different widths) is skipped from there on with
    a :class:`RunReadWarning` naming it.
    """
    bad: set[int] = set()
    columns = [*route_columns, *(c for c in other_columns if c not in route_columns)]
    for step, batch in iter_run_batches(run, columns, steps=steps, batch_rows=batch_rows):
        if step in bad:
            continue
        try:
            routes = {c: route_array(batch.column(c), top_k) for c in route_columns}
            if len({r.shape[1] for r in routes.values()}) > 1:
                raise ValueError(f"route columns {list(route_columns)} hold different numbers of layers")
        except (ValueError, pa.ArrowException) as exc:
            bad.add(step)
            problem = RunFileError(Path(run) / schema.tokens_file(step), f"malformed route column: {exc}")
            warnings.warn(RunReadWarning(f"skipped the rest of the file: {problem}"), stacklevel=2)
            continue
        yield step, batch, routes


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
    """Names of the non-list columns of a per-token table schema."""
    return [f.name for f in parquet_schema if not pa.types.is_nested(f.type)]


def load_tokens(
    run: str | Path,
    columns: Sequence[str] | None = None,
    steps: Iterable[int] | None = None,
) -> pd.DataFrame:
    """The scalar per-token columns of a run's tables (``steps`` only, if given) as one DataFrame.

    ``columns`` defaults to every non-list column (route and margin columns are read with
    :func:`route_array` / :func:`margin_array` instead). Holds everything in memory: for large runs
    pass only the columns needed, or stream with :func:`iter_run_batches`. Unreadable files are
    skipped with a :class:`RunReadWarning`.
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
            missing = [c for c in names if c not in parquet.schema_arrow.names]
            if missing:
                raise RunFileError(path, f"missing column(s) {missing}")
            tables.append(parquet.read(columns=names))
        except RunFileError as exc:
            warnings.warn(RunReadWarning(f"skipped: {exc}"), stacklevel=2)
        except (OSError, pa.ArrowException) as exc:
            warnings.warn(RunReadWarning(f"skipped: {path}: corrupt Parquet data ({exc})"), stacklevel=2)
    if not tables:
        return pd.DataFrame(columns=wanted or [])
    table = pa.concat_tables(tables, promote_options="default")
    return table.to_pandas()


def read_routes(path: str | Path, column: str, top_k: int) -> np.ndarray:
    """One route column of one per-token table, whole, as int16 ``[rows, layers, top_k]``."""
    parquet = open_token_file(path)
    if column not in parquet.schema_arrow.names:
        raise RunFileError(path, f"missing column {column!r}")
    try:
        table = parquet.read(columns=[column])
    except (OSError, pa.ArrowException) as exc:
        raise RunFileError(path, f"corrupt Parquet data ({exc})") from exc
    return route_array(table.column(column), top_k)


def finite_or_none(value: Any) -> float | None:
    """``value`` as a float, or ``None`` when missing, null or NaN (for JSON output)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
