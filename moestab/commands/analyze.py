"""``moestab analyze RUN [RUN ...]``: summary table of run folders, as text, JSON or CSV, and figures.

Only parses arguments and calls ``moestab.analysis``. Problems with one run (not a run folder, a
newer schema, a missing or corrupt file) are reported on stderr naming the file, and the readable
part of every run is still summarised. The exit status is 1 when no run could be read at all, or when
a run is ``damaged`` (its metrics.jsonl steps repeat or go back: the summary is printed, the damage
is said on stderr); else 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "Summarise run folders: stability metrics per run as a table, JSON or CSV, and PNG figures."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN", type=Path, help="run folder written by `moestab train`")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the summary as a JSON list of objects")
    output.add_argument("--csv", action="store_true", help="print the summary as CSV")
    parser.add_argument(
        "--plots",
        metavar="DIR",
        type=Path,
        help="write PNG figures to DIR/<run>/ (curves, volatility heatmaps, ratio histograms, "
        "attribution) and, for several runs, DIR/curves.png",
    )


def _report(skipped: list, stream, said: set) -> None:
    """Print what the readers left out of a run (file, line, reason), once per file and line, however many readers
    met it: ``said`` holds the (file, line) pairs printed."""
    for part in skipped:
        if (part.file, part.line) not in said:
            said.add((part.file, part.line))
            print(f"moestab analyze: warning: skipped {part}", file=stream)


def _format_table(frame) -> str:
    """One column per run, one row per field: readable however many metrics there are."""
    shown = frame.drop(columns=["path", "damage"]).set_index("run").T  # damage: said on stderr
    return shown.to_string(na_rep="-", float_format=lambda x: f"{x:.4g}")


def run(args: argparse.Namespace) -> int:
    import json

    from moestab.analysis.summary import SUMMARY_COLUMNS, run_summary
    from moestab.records.errors import RunError
    from moestab.records.reader import finite_or_none

    rows = []
    said: set = set()  # the summary and --plots may both find a corrupt file: said once
    for path in args.runs:
        skipped: list = []
        try:
            rows.append(run_summary(path, skipped))
        except RunError as exc:
            print(f"moestab analyze: error: {exc}", file=sys.stderr)
        _report(skipped, sys.stderr, said)
    if not rows:
        print("moestab analyze: error: no readable run among the folders given", file=sys.stderr)
        return 1

    import pandas as pd

    frame = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
    if args.json:
        records = [
            {k: (finite_or_none(v) if isinstance(v, float) else v) for k, v in row.items()}
            for row in frame.to_dict(orient="records")
        ]
        print(json.dumps(records, indent=2))
    elif args.csv:
        frame.to_csv(sys.stdout, index=False)
    else:
        print(_format_table(frame))

    if args.plots is not None:
        _write_plots(args.plots, [Path(p) for p in frame["path"]], list(frame["run"]), said)
    damaged = [row for row in rows if row["damage"]]
    for row in damaged:
        print(f"moestab analyze: error: {row['path']} is damaged: {row['damage']}", file=sys.stderr)
    return 1 if damaged else 0


def _write_plots(out: Path, runs: list[Path], names: list[str], said: set) -> None:
    import pandas as pd

    from moestab.analysis.plots import plot_curves, save_figure, write_run_plots
    from moestab.records.errors import RunError
    from moestab.records.reader import load_metrics

    used: dict[str, int] = {}
    frames = []
    for path, name in zip(runs, names, strict=True):
        used[name] = used.get(name, 0) + 1
        folder = out / (name if used[name] == 1 else f"{name}_{used[name]}")
        skipped: list = []
        try:
            written = write_run_plots(path, folder, skipped)
            print(f"moestab analyze: wrote {len(written)} figure(s) to {folder}", file=sys.stderr)
        except (RunError, ValueError, KeyError) as exc:
            print(f"moestab analyze: error: no figures for {path}: {exc}", file=sys.stderr)
        _report(skipped, sys.stderr, said)
        try:
            metrics = load_metrics(path, skipped=[])  # what it skips was reported above
        except RunError:
            continue
        metrics.insert(0, "run", name)
        frames.append(metrics)
    if len(runs) >= 2 and frames:
        path = save_figure(plot_curves(pd.concat(frames, ignore_index=True)), out / "curves.png")
        print(f"moestab analyze: wrote {path}", file=sys.stderr)
