"""``moestab analyze RUN [RUN ...]``: summary table of run folders, as text, JSON or CSV, and figures.

Only parses arguments and calls ``moestab.analysis``. Problems with one run (not a run folder, a
newer schema, a missing or corrupt file) are reported on stderr naming the file, and the readable
part of every run is still summarised; the exit code is 1 only when no run could be read at all.
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


def _report(caught: list, stream) -> None:
    """Print the warnings caught while reading a run; re-show any other warning unchanged."""
    import warnings

    from moestab.analysis.errors import RunReadWarning

    for item in caught:
        if issubclass(item.category, RunReadWarning):
            print(f"moestab analyze: warning: {item.message}", file=stream)
        else:
            warnings.showwarning(item.message, item.category, item.filename, item.lineno)


def _format_table(frame) -> str:
    shown = frame.drop(columns=["path"])
    return shown.to_string(index=False, na_rep="-", float_format=lambda x: f"{x:.4g}")


def run(args: argparse.Namespace) -> int:
    import json
    import warnings

    from moestab.analysis.errors import AnalysisError
    from moestab.analysis.load import finite_or_none
    from moestab.analysis.summary import SUMMARY_COLUMNS, run_summary

    rows = []
    for path in args.runs:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                rows.append(run_summary(path))
            except AnalysisError as exc:
                print(f"moestab analyze: error: {exc}", file=sys.stderr)
        _report(caught, sys.stderr)
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
        _write_plots(args.plots, [Path(p) for p in frame["path"]], list(frame["run"]))
    return 0


def _write_plots(out: Path, runs: list[Path], names: list[str]) -> None:
    import warnings

    import pandas as pd

    from moestab.analysis.errors import AnalysisError, RunFileError, RunReadWarning
    from moestab.analysis.load import load_metrics
    from moestab.analysis.plots import plot_curves, save_figure, write_run_plots

    used: dict[str, int] = {}
    for path, name in zip(runs, names, strict=True):
        used[name] = used.get(name, 0) + 1
        folder = out / (name if used[name] == 1 else f"{name}_{used[name]}")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                written = write_run_plots(path, folder)
                print(f"moestab analyze: wrote {len(written)} figure(s) to {folder}", file=sys.stderr)
            except (AnalysisError, ValueError, KeyError) as exc:
                print(f"moestab analyze: error: no figures for {path}: {exc}", file=sys.stderr)
        _report(caught, sys.stderr)
    if len(runs) < 2:
        return
    frames = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RunReadWarning)  # already reported above
        for path, name in zip(runs, names, strict=True):
            try:
                metrics = load_metrics(path)
            except RunFileError:
                continue
            metrics.insert(0, "run", name)
            frames.append(metrics)
    if frames:
        path = save_figure(plot_curves(pd.concat(frames, ignore_index=True)), out / "curves.png")
        print(f"moestab analyze: wrote {path}", file=sys.stderr)
