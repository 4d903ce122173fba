"""Are two run folders the same run, bit for bit? For checking that a change of code left behaviour unchanged.

    python scripts/same_run.py RUN_A RUN_B
    python scripts/same_run.py RUN_A RUN_B --declare docs/EXPERIMENT_results/same_code.csv


Compares what a run's numbers are: every metrics.jsonl value but wall times (``time/...``), every per-token table
(all columns, exact), every checkpoint's files (bytes; the optimizer / loop state, where the checkpoint keeps one,
compared as loaded tensors) and run.json's config (a setting a run predates counts at its default), model and
accuracies. Prints each difference and exits 1 if any, else prints what was compared and exits 0. Used to check
restructurings against the previous commit: run the same command with both commits' code into two folders and
compare them.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from moestab.experiments.provenance import DECLARATION_COLUMNS, read_declarations
from moestab.run_folder import schema
from moestab.run_folder.reader import list_checkpoints, list_token_files, load_metrics, read_run_info
from moestab.train.run_lifetime import config_defaults

TIMING_PREFIX = "time/"


def _same_value(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _metrics(a: Path, b: Path) -> tuple[list[str], int]:
    ma, mb = load_metrics(a), load_metrics(b)
    keys_a = {k for k in ma.columns if not k.startswith(TIMING_PREFIX)}
    keys_b = {k for k in mb.columns if not k.startswith(TIMING_PREFIX)}
    only = ((a, keys_a - keys_b), (b, keys_b - keys_a))
    out = [f"metrics key only in {p}: {k}" for p, ks in only for k in sorted(ks)]
    if len(ma) != len(mb):
        return [*out, f"metrics.jsonl: {len(ma)} vs {len(mb)} lines"], 0
    compared = 0
    for key in sorted(keys_a & keys_b):
        for row, (x, y) in enumerate(zip(ma[key].tolist(), mb[key].tolist(), strict=True)):
            compared += 1
            if not _same_value(x, y):
                out.append(f"metrics line {row + 1} {key}: {x!r} vs {y!r}")
    return out, compared


def _same_column(x: pa.ChunkedArray, y: pa.ChunkedArray) -> bool:
    """Equal values, NaN equal to NaN (a TRL run's rewards are NaN: Arrow's equality calls such a column different
    from itself)."""
    if x.equals(y):
        return True
    if x.type != y.type or not pa.types.is_floating(x.type):
        return False
    nulls_x, nulls_y = x.is_null().to_numpy(zero_copy_only=False), y.is_null().to_numpy(zero_copy_only=False)
    values_x, values_y = x.fill_null(0).to_numpy(), y.fill_null(0).to_numpy()
    return bool((nulls_x == nulls_y).all()) and bool(np.array_equal(values_x, values_y, equal_nan=True))


def _tokens(a: Path, b: Path) -> tuple[list[str], int]:
    fa, fb = list_token_files(a), list_token_files(b)
    if fa["step"].tolist() != fb["step"].tolist():
        return [f"token tables of steps {fa['step'].tolist()} vs {fb['step'].tolist()}"], 0
    out = []
    for pa_, pb_ in zip(fa["path"], fb["path"], strict=True):
        ta, tb = pq.read_table(pa_), pq.read_table(pb_)
        differ = [c for c in ta.column_names if c not in tb.column_names or not _same_column(ta[c], tb[c])]
        differ += [c for c in tb.column_names if c not in ta.column_names]
        if differ or ta.column_names != tb.column_names:
            out.append(f"{Path(pa_).name}: columns differ: {differ or 'in order'}")
    return out, len(fa)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _state_equal(x: object, y: object) -> bool:
    if torch.is_tensor(x) and torch.is_tensor(y):
        return x.dtype == y.dtype and x.shape == y.shape and bool(torch.equal(x, y))
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_state_equal(x[k], y[k]) for k in x)
    if isinstance(x, list | tuple) and isinstance(y, list | tuple):
        return len(x) == len(y) and all(_state_equal(u, v) for u, v in zip(x, y, strict=True))
    return _same_value(x, y)


def _checkpoints(a: Path, b: Path) -> tuple[list[str], int]:
    ca, cb = list_checkpoints(a), list_checkpoints(b)
    if ca["step"].tolist() != cb["step"].tolist():
        return [f"checkpoints of steps {ca['step'].tolist()} vs {cb['step'].tolist()}"], 0
    out, compared = [], 0
    for step in ca["step"].tolist():
        folder_a, folder_b = a / schema.checkpoint_dir(step), b / schema.checkpoint_dir(step)
        names = sorted(p.name for p in folder_a.iterdir())
        if names != sorted(p.name for p in folder_b.iterdir()):
            out.append(f"checkpoint {step}: files differ")
            continue
        for name in names:
            compared += 1
            if _digest(folder_a / name) != _digest(folder_b / name):
                out.append(f"checkpoint {step}: {name} differs")
        state_a, state_b = a / schema.state_file(step), b / schema.state_file(step)
        if state_a.is_file() != state_b.is_file():  # older checkpoints keep weights only (checkpoint.KEEP_STATES)
            out.append(f"checkpoint {step}: a training state in {a if state_a.is_file() else b} only")
            continue
        if not state_a.is_file():
            continue
        sa = torch.load(state_a, map_location="cpu", weights_only=True)
        sb = torch.load(state_b, map_location="cpu", weights_only=True)
        compared += 1
        if not _state_equal(sa, sb):
            out.append(f"checkpoint {step}: optimizer / loop state differs")
    return out, compared


def _run_info(a: Path, b: Path) -> list[str]:
    ia, ib = read_run_info(a), read_run_info(b)
    out = []
    # A run recorded before a setting existed had it at its default (as --resume reads it).
    defaults = config_defaults()
    config_a = {k: v for k, v in {**defaults, **ia.config}.items() if k != "out"}
    config_b = {k: v for k, v in {**defaults, **ib.config}.items() if k != "out"}
    if config_a != config_b:
        differ = sorted(k for k in config_a.keys() | config_b.keys() if config_a.get(k) != config_b.get(k))
        out.append(f"run.json config differs: {differ}")
    for field in ("status", "last_step", "model", "warm_start_accuracy", "final_accuracy"):
        if not _same_value(getattr(ia, field), getattr(ib, field)):
            out.append(f"run.json {field}: {getattr(ia, field)!r} vs {getattr(ib, field)!r}")
    return out


def compare(a: Path, b: Path) -> tuple[list[str], str]:
    """The differences between runs ``a`` and ``b`` (empty: the same run) and a line saying what was compared."""
    metric_diffs, n_values = _metrics(a, b)
    token_diffs, n_tables = _tokens(a, b)
    checkpoint_diffs, n_files = _checkpoints(a, b)
    diffs = [*_run_info(a, b), *metric_diffs, *token_diffs, *checkpoint_diffs]
    return diffs, f"{n_values} metric values, {n_tables} token tables, {n_files} checkpoint files and states"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--declare", type=Path, default=None,
                        help="on a pass, append the runs' commits to this declarations file (CSV)")
    args = parser.parse_args(argv)
    diffs, what = compare(args.run_a, args.run_b)
    for line in diffs:
        print(line)
    print(f"{'DIFFERENT' if diffs else 'same'}: compared {what}")
    if diffs:
        return 1
    if args.declare is not None:
        return declare(args.run_a, args.run_b, args.declare)
    return 0


def declare(a: Path, b: Path, path: Path) -> int:
    """Append the commits of runs ``a`` and ``b`` (found the same) to the declarations at ``path``."""
    codes = [read_run_info(run).environment.get("code") or {} for run in (a, b)]
    for run, code in zip((a, b), codes, strict=True):
        if not code.get("commit") or code.get("dirty") is not False:
            print(f"{run}: no clean commit on record (environment.code {code}); nothing declared")
            return 1
    row = pd.DataFrame([{"commit_a": codes[0]["commit"], "commit_b": codes[1]["commit"], "run_a": str(a),
                         "run_b": str(b), "checked": datetime.now(UTC).isoformat(timespec="seconds")}],
                       columns=list(DECLARATION_COLUMNS))
    existing = read_declarations(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.concat([existing, row], ignore_index=True).to_csv(path, index=False)
    print(f"declared {codes[0]['commit'][:12]} and {codes[1]['commit'][:12]} the same run in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
