"""Writing a run folder (docs/run-format.md): run.json, metrics.jsonl, per-token Parquet tables."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from moestab.run_folder import schema
from moestab.run_folder.files import atomic_write_text, created, open_append, remove
from moestab.run_folder.folder import RUN_SUBFOLDERS, RunFolder
from moestab.run_folder.route_columns import token_parquet_options
from moestab.run_folder.run_info import ModelInfo, RunInfo, json_safe, now, read_run_info, this_writer

HEARTBEAT_S = 60.0
"""How often a running writer renews run.json's ``writer.heartbeat`` (see ``RunInfo.live_status``)."""
TOKEN_ROW_GROUP = 65_536
"""Rows per Parquet row group of a per-token table."""


class RunWriter:
    """Appends to one run folder; every file it writes is complete or absent (atomic renames).

    run.json is read-modify-written under a lock, so :meth:`beating` can renew the heartbeat from a
    thread while the loop updates the run.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.folder = RunFolder(run_dir)
        self.dir = self.folder.path
        self._lock = threading.Lock()

    @property
    def run_json(self) -> Path:
        return self.folder.run_json

    def read_info(self) -> RunInfo:
        return read_run_info(self.dir)

    def start(
        self, *, config: dict[str, Any], model: ModelInfo, environment: dict[str, Any], config_yaml: str,
        subfolders: Sequence[str] = RUN_SUBFOLDERS,
    ) -> RunInfo:
        """Create the folder layout and a ``running`` run.json.

        ``subfolders``: the folders of :data:`~moestab.run_folder.folder.RUN_SUBFOLDERS` this writer fills (``moestab
        train``: all). A writer that saves no checkpoints and no training state (the TRL integration) names only
        ``tokens``: an empty ``checkpoints/`` or ``state/`` would suggest a run that checkpoints and can be resumed.
        Any other name is a ``ValueError``, raised before anything is written."""
        if isinstance(subfolders, str):
            raise ValueError(f"subfolders is a sequence of folder names, got the string {subfolders!r}")
        unknown = [name for name in subfolders if name not in RUN_SUBFOLDERS]
        if unknown:
            raise ValueError(f"subfolders {unknown} are not run subfolders; valid: {list(RUN_SUBFOLDERS)}")
        self.dir.mkdir(parents=True, exist_ok=True)
        for name in subfolders:
            (self.dir / name).mkdir(exist_ok=True)
        atomic_write_text(self.folder.config_yaml, config_yaml)
        info = RunInfo(config=config, model=model, environment=environment, writer=this_writer(),
                       created=now(), updated=now())
        with self._lock:
            self._write_info(info)
        return info

    def update(self, **fields: Any) -> RunInfo:
        """Change ``fields`` of run.json (names of :class:`RunInfo` fields), stamp ``updated`` and the heartbeat.

        Also stamps the current ``schema_version``: a run of an older version this moestab continues (``--resume``)
        gets tables of the current layout, which that version's readers would misread."""
        with self._lock:
            info = self.read_info().updated_with(**fields, writer=this_writer(), schema_version=schema.SCHEMA_VERSION)
            self._write_info(info)
        return info

    def add_warning(self, message: str) -> RunInfo:
        """Append ``message`` to run.json's ``warnings`` (what the writer noticed that makes the numbers read
        oddly), under the same lock as :meth:`update`, so the heartbeat thread cannot write over it."""
        with self._lock:
            info = self.read_info()
            info = info.updated_with(warnings=(*info.warnings, message), writer=this_writer(),
                                     schema_version=schema.SCHEMA_VERSION)
            self._write_info(info)
        return info

    def _write_info(self, info: RunInfo) -> None:
        atomic_write_text(self.run_json, json.dumps(info.to_json(), indent=2) + "\n")

    def beating(self, every: float = HEARTBEAT_S) -> _Heartbeat:
        """Context manager: a daemon thread renews the heartbeat every ``every`` seconds while inside."""
        return _Heartbeat(self, every)

    def append_metrics(self, metrics: dict[str, Any]) -> None:
        with open_append(self.folder.metrics_file) as f:  # a planted link is refused, not appended through
            f.write((json.dumps(json_safe(metrics)) + "\n").encode())
            f.flush()

    def truncate_metrics(self, last_step: int) -> list[int]:
        """Drop metric lines after ``last_step`` (a resumed run recomputes them) and torn lines
        (:meth:`RunFolder.metric_lines`, which refuses a line whose ``step`` is not an integer).

        Returns the 1-based numbers of the torn lines dropped.
        """
        lines, torn = self.folder.metric_lines()
        if lines or torn:
            kept = "".join(f"{line}\n" for step, line in lines if step <= last_step)
            atomic_write_text(self.folder.metrics_file, kept)
        return torn

    def write_tokens(self, step: int, table: pa.Table, *, row_group_size: int = TOKEN_ROW_GROUP) -> None:
        """Write the per-token table of ``step`` (built by ``moestab.recording.token_table``), its binary route
        columns plain and uncompressed (:func:`~moestab.run_folder.route_columns.token_parquet_options`)."""
        path = self.folder.tokens_file(step)
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            with created(tmp) as f:
                pq.write_table(table, f, row_group_size=row_group_size, **token_parquet_options(table.schema))
            os.replace(tmp, path)
        finally:
            remove(tmp)  # a failed write leaves no temporary behind


class _Heartbeat:
    def __init__(self, writer: RunWriter, every: float) -> None:
        self.writer, self.every = writer, every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _Heartbeat:
        self._thread = threading.Thread(target=self._run, name="moestab-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            # A full disk must not kill the thread: the loop's own writes report the failure.
            with contextlib.suppress(OSError):
                self.writer.update()
