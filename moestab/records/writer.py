"""Writing a run folder (docs/run-format.md): run.json, metrics.jsonl, per-token Parquet tables."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from moestab.records import schema
from moestab.records.run_info import ModelInfo, RunInfo, json_safe, now, read_run_info


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class RunWriter:
    """Appends to one run folder; every file it writes is complete or absent (atomic renames)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.dir = Path(run_dir)

    @property
    def run_json(self) -> Path:
        return self.dir / schema.RUN_JSON

    def read_info(self) -> RunInfo:
        return read_run_info(self.dir)

    def start(
        self, *, config: dict[str, Any], model: ModelInfo, environment: dict[str, Any], config_yaml: str
    ) -> RunInfo:
        """Create the folder layout and a ``running`` run.json."""
        for sub in (schema.TOKENS_DIR, schema.CHECKPOINTS_DIR, schema.STATE_DIR):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.dir / schema.CONFIG_YAML, config_yaml)
        info = RunInfo(config=config, model=model, environment=environment, created=now(), updated=now())
        self._write_info(info)
        return info

    def update(self, **fields: Any) -> RunInfo:
        """Change ``fields`` of run.json (names of :class:`RunInfo` fields) and stamp ``updated``."""
        info = self.read_info().updated_with(**fields)
        self._write_info(info)
        return info

    def _write_info(self, info: RunInfo) -> None:
        atomic_write_text(self.run_json, json.dumps(info.to_json(), indent=2) + "\n")

    def append_metrics(self, metrics: dict[str, Any]) -> None:
        with (self.dir / schema.METRICS_JSONL).open("a") as f:
            f.write(json.dumps(json_safe(metrics)) + "\n")
            f.flush()

    def truncate_metrics(self, last_step: int) -> None:
        """Drop metric lines after ``last_step`` (a resumed run recomputes them)."""
        path = self.dir / schema.METRICS_JSONL
        if not path.exists():
            return
        keep = []
        for line in path.read_text().splitlines():
            if line.strip() and json.loads(line)["step"] <= last_step:
                keep.append(line)
        atomic_write_text(path, "".join(f"{line}\n" for line in keep))

    def write_tokens(self, step: int, table: pa.Table) -> None:
        path = self.dir / schema.tokens_file(step)
        tmp = path.with_name(f".{path.name}.tmp")
        pq.write_table(table, tmp, row_group_size=65_536)
        os.replace(tmp, path)
