"""The probe folder: what a probe computed, on what, with which settings (``probe.json``) and its tables (CSV).

The one reader and writer of the format; the CLI and the dashboard's Probes page go through it.

    PROBE_DIR/probe.json      {"probe", "checkpoints", "suite" (manifest), "settings", "tables": [names]}
    PROBE_DIR/<table>.csv     one file per table
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from moestab.probes.errors import ProbeError
from moestab.run_folder.files import atomic_write_text, read_only_above

PROBE_JSON = "probe.json"
TABLE_COLUMN = "table"
"""First column of :meth:`ProbeResult.stacked_tables`: the table a row belongs to."""
_TABLE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class ProbeResult:
    """One probe's output."""

    probe: str
    checkpoints: list[str]
    suite: dict[str, object]
    settings: dict[str, object]
    tables: dict[str, pd.DataFrame]

    def to_json(self) -> dict[str, object]:
        return {"probe": self.probe, "checkpoints": self.checkpoints, "suite": self.suite, "settings": self.settings,
                "tables": {name: json.loads(t.to_json(orient="records")) for name, t in self.tables.items()}}

    def stacked_tables(self) -> pd.DataFrame:
        """Every table one under the other, a first column ``table`` naming the table of each row (columns: the
        union, in order of appearance; a column another table lacks is empty there): the whole result as one CSV
        (``moestab probe --csv``), where the probe folder keeps one CSV per table."""
        frames = [table.assign(**{TABLE_COLUMN: name}) for name, table in self.tables.items()]
        if not frames:
            return pd.DataFrame(columns=[TABLE_COLUMN])
        stacked = pd.concat(frames, ignore_index=True)
        return stacked[[TABLE_COLUMN, *stacked.columns.drop(TABLE_COLUMN)]]


def write_probe_folder(result: ProbeResult, out: str | Path) -> Path:
    """Write ``result`` to ``out`` (created; an existing probe folder there is replaced file by file)."""
    out = Path(out)
    problem = _out_problem(out)
    if problem:
        raise ProbeError(problem)
    for name in result.tables:
        if not _TABLE_NAME.match(name):
            raise ProbeError(f"table name {name!r} is not a valid file name")
    out.mkdir(parents=True, exist_ok=True)
    for name, table in result.tables.items():  # replaced by rename, never written through a planted link
        atomic_write_text(out / f"{name}.csv", table.to_csv(index=False))
    meta = {"probe": result.probe, "checkpoints": result.checkpoints, "suite": result.suite,
            "settings": result.settings, "tables": list(result.tables)}
    atomic_write_text(out / PROBE_JSON, json.dumps(meta, indent=2))  # last: marks a complete folder
    return out


def _out_problem(out: Path) -> str | None:
    """Why a probe folder cannot be written at ``out``: a file, or a folder holding something else (a run)."""
    if out.exists() and not out.is_dir():
        return f"--out {out} exists and is not a folder"
    if out.is_dir() and any(out.iterdir()) and not (out / PROBE_JSON).is_file():
        return f"--out {out} exists and is not a probe folder; choose an empty or new folder"
    stuck = read_only_above(out)
    if stuck is not None:
        return f"--out {out}: {stuck} is not writable (read-only or not yours); choose another folder"
    return None


def check_output_targets(*, out: Path | None = None, plots: Path | None = None) -> None:
    """Refuse, before a probe runs, ``moestab probe --out`` where :func:`write_probe_folder` would refuse, and
    ``--plots`` naming an existing file. (``--json`` and ``--csv`` are files, checked by the commands' shared rule
    for them.)"""
    problem = _out_problem(out) if out is not None else None
    if problem:
        raise ProbeError(problem)
    if plots is not None and plots.exists() and not plots.is_dir():
        raise ProbeError(f"--plots {plots} exists and is not a folder")


def read_probe_folder(path: str | Path) -> ProbeResult:
    """The probe folder at ``path``; a damaged one (probe.json not JSON or lacking a key, a listed table missing or
    not CSV) raises :class:`ProbeError` naming the file."""
    path = Path(path)
    meta_file = path / PROBE_JSON
    if not meta_file.is_file():
        raise ProbeError(f"{path} is not a probe folder: it has no {PROBE_JSON}")
    try:
        meta = json.loads(meta_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProbeError(f"{meta_file} is not valid JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise ProbeError(f"{meta_file} is not a JSON object")
    kinds = {"probe": str, "checkpoints": list, "suite": dict, "settings": dict, "tables": list}
    wrong = [f"{key!r} ({kind.__name__})" for key, kind in kinds.items() if not isinstance(meta.get(key), kind)]
    if wrong:
        raise ProbeError(f"{meta_file} lacks {', '.join(wrong)}")
    tables = {}
    for name in meta["tables"]:
        if not isinstance(name, str) or not _TABLE_NAME.match(name):
            raise ProbeError(f"{meta_file} lists table {name!r}, not a valid table name")
        tables[name] = _read_table(path / f"{name}.csv")
    return ProbeResult(meta["probe"], meta["checkpoints"], meta["suite"], meta["settings"], tables)


def _read_table(file: Path) -> pd.DataFrame:
    if not file.is_file():
        raise ProbeError(f"{file} is missing ({PROBE_JSON} lists it)")
    try:
        return pd.read_csv(file)
    except pd.errors.EmptyDataError:  # a table without columns is written as an empty line
        return pd.DataFrame()
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise ProbeError(f"{file} is not a readable CSV table: {exc}") from None


def find_probe_folders(root: str | Path) -> list[Path]:
    """Probe folders at or below ``root`` (sorted)."""
    root = Path(root)
    return sorted(p.parent for p in root.rglob(PROBE_JSON))


def describe_probe_folders(path: str | Path, *, limit: int = 5) -> str | None:
    """One line naming the probe folders ``path`` is or holds, each with its probe as :func:`read_probe_folder`
    reads it (or ``unreadable``); ``None`` when it holds none. What a command reading run folders says of the probe
    folders it was handed (``moestab analyze runs/*`` meets ``runs/probes``): known, so skipped, not an error.
    ``limit``: folders named; the others are counted."""
    path = Path(path)
    folders = find_probe_folders(path) if path.is_dir() else []
    if not folders:
        return None
    if folders == [path]:
        return f"{path} is a probe folder ({_probe_of(path)}), not a run"
    named = [f"{folder.relative_to(path).as_posix()} ({_probe_of(folder)})" for folder in folders[:limit]]
    more = f" and {len(folders) - limit} more" if len(folders) > limit else ""
    return f"{path} holds {len(folders)} probe folder(s), not a run: {', '.join(named)}{more}"


def _probe_of(folder: Path) -> str:
    """The probe that wrote ``folder``, or ``unreadable`` (:func:`read_probe_folder` says why)."""
    try:
        return read_probe_folder(folder).probe
    except ProbeError:
        return "unreadable"
