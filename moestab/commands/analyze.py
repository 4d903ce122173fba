"""``moestab analyze RUN [RUN ...]``: summary table of run folders, as text, JSON or CSV, and figures.

Only parses arguments and calls ``moestab.analysis``. Problems with one run (not a run folder, a newer schema, a
missing or corrupt file) are reported on stderr naming the file, and the readable part of every run is still
summarised. Probe folders (``moestab probe --out``), and folders holding them, are known: each is skipped with a
one-line note, so ``moestab analyze runs/*`` works beside ``runs/probes``. ``--json`` / ``--csv`` follow
:mod:`moestab.commands.output`.

Exit status: 0 when every folder given was a readable run or a probe folder; 1 when one was neither, a run could
not be read, a run is ``damaged`` (its metrics.jsonl steps repeat or go back: the summary is printed, the damage is
said on stderr) or no run was given at all; 2 when ``--json`` / ``--csv`` cannot be written (nothing is read).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from moestab.commands.output import OutputError, add_output_options, emit, output_problem, uses_stdout

HELP = "Summarise run folders: stability metrics per run as a table, JSON or CSV, and PNG figures."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN", type=Path,
                        help="run folder written by `moestab train`, or a folder of them (searched 3 levels down, as "
                        "the dashboard searches; probe folders are skipped, with a note)")
    add_output_options(parser, json_what="the summary as a JSON list of objects (one per run)",
                       csv_what="the summary as CSV (one row per run)")
    parser.add_argument(
        "--steps", metavar="FIRST:LAST", type=step_window,
        help="average the stability columns over these steps only (both included), the same for every run: runs of "
        "different lengths compared over the steps they all have (the dashboard's Compare page uses the same window)",
    )
    parser.add_argument(
        "--plots",
        metavar="DIR",
        type=Path,
        help="write PNG figures to DIR/<run>/ (curves, volatility heatmaps, ratio histograms, "
        "attribution) and, for several runs, DIR/curves.png",
    )


def step_window(text: str) -> tuple[int, int]:
    """``FIRST:LAST`` -> (first, last), 1 <= first <= last; argparse's error otherwise."""
    first, sep, last = text.partition(":")
    try:
        window = (int(first), int(last))
    except ValueError:
        window = None
    if not sep or window is None or not 1 <= window[0] <= window[1]:
        raise argparse.ArgumentTypeError(f"give the steps as FIRST:LAST with 1 <= FIRST <= LAST (e.g. 1:17), got "
                                         f"{text!r}")
    return window


def _report(skipped: list, stream, said: set) -> None:
    """Print what the readers left out of a run (file, line, reason), once per file and line, however many readers
    met it: ``said`` holds the (file, line) pairs printed."""
    for part in skipped:
        if (part.file, part.line) not in said:
            said.add((part.file, part.line))
            print(f"moestab analyze: warning: skipped {part}", file=stream)


def _format_table(frame) -> str:
    """One column per run, one row per field: readable however many metrics there are. Each metric in its key's
    unit, as every surface shows it (shares in percent: ``moestab.analysis.labels``); JSON and CSV keep fractions."""
    from moestab.analysis.labels import format_value, is_percent
    from moestab.analysis.summary import column_key

    shown = frame.drop(columns=["path", "damage"]).set_index("run").astype(object)  # damage: said on stderr
    for column in shown.columns:
        key = column_key(column)
        if key is not None:
            percent = is_percent(key)
            shown[column] = [format_value(v, percent) or "-" if v is not None else "-" for v in shown[column]]
    return shown.T.to_string(na_rep="-")


def expand_runs(paths: list[Path]) -> list[Path]:
    """Each path that is a run folder as itself; each other folder as the run folders under it, found as the
    dashboard finds them (:func:`moestab.analysis.dashboard_data.find_runs`, 3 levels down), with a note naming how many
    and which it left out as too deep; a folder with no run under it stays, to be reported."""
    from moestab.analysis.dashboard_data import find_runs, runs_too_deep
    from moestab.run_folder import RunFolder

    out: list[Path] = []
    for path in paths:
        if not path.is_dir() or RunFolder(path).holds_run:
            out.append(path)
            continue
        found = find_runs(path)
        deep = runs_too_deep(path)
        if not found:
            out.append(path)  # not a run, none under it: a probe folder's note or an error, below
            continue
        print(f"moestab analyze: note: {path} holds {len(found)} run folder(s) (searched 3 levels down)"
              + (f"; {len(deep)} lie deeper and are left out (give them directly): "
                 + ", ".join(str(d) for d in deep[:3]) + (" ..." if len(deep) > 3 else "") if deep else ""),
              file=sys.stderr)
        out.extend(found)
    return list(dict.fromkeys(out))  # a run named twice (a folder and a run in it) is summarised once


def _summaries(paths: list[Path], said: set, steps: tuple[int, int] | None = None) -> tuple[list[dict], int]:
    """The summary row of each readable run, and how many folders were errors (neither a run nor a probe folder,
    or a run that cannot be read); each error and each skipped probe folder is said on stderr."""
    from moestab.analysis.summary import run_summary
    from moestab.run_folder.errors import NotARunError, RunError

    rows, errors = [], 0
    for path in paths:
        skipped: list = []
        try:
            rows.append(run_summary(path, skipped, steps))
        except NotARunError as exc:
            from moestab.probes.folder import describe_probe_folders  # torch: only when a folder is not a run

            note = describe_probe_folders(path)
            if note is None:
                errors += 1
                print(f"moestab analyze: error: {exc}; give run folders written by `moestab train`", file=sys.stderr)
            else:
                print(f"moestab analyze: note: skipped {note} (the dashboard's Probes page shows probe folders)",
                      file=sys.stderr)
        except RunError as exc:
            errors += 1
            print(f"moestab analyze: error: {exc}", file=sys.stderr)
        _report(skipped, sys.stderr, said)
    return rows, errors


def run(args: argparse.Namespace) -> int:
    import json

    from moestab.analysis.summary import SUMMARY_COLUMNS
    from moestab.extras import MissingExtraError, require
    from moestab.run_folder.reader import finite_or_none

    problem = output_problem(args.json, args.csv)
    if problem is None and args.plots is not None and args.plots.exists() and not args.plots.is_dir():
        problem = f"--plots {args.plots} is a file; give a folder for the figures (it is created if missing)"
    if problem is None and args.plots is not None:
        try:
            require("plots", "moestab analyze --plots")
        except MissingExtraError as exc:
            problem = str(exc)
    if problem is not None:
        print(f"moestab analyze: error: {problem}", file=sys.stderr)
        return 2
    said: set = set()  # the summary and --plots may both find a corrupt file: said once
    runs = expand_runs(args.runs)
    rows, errors = _summaries(runs, said, args.steps)
    if not rows:
        print("moestab analyze: error: no readable run among the folders given", file=sys.stderr)
        return 1

    import pandas as pd

    frame = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
    if frame["run"].duplicated().any():  # seed-1 of two sweeps: name each by its path instead
        frame["run"] = frame["path"]
    try:
        if args.json is not None:
            records = [
                {k: (finite_or_none(v) if isinstance(v, float) else v) for k, v in row.items()}
                for row in frame.to_dict(orient="records")
            ]
            emit(json.dumps(records, indent=2), args.json)
        if args.csv is not None:
            emit(frame.to_csv(index=False), args.csv)
    except OutputError as exc:
        print(f"moestab analyze: error: {exc}", file=sys.stderr)
        return 2
    if not uses_stdout(args.json, args.csv):
        print(_format_table(frame))

    if args.plots is not None:
        _write_plots(args.plots, [Path(p) for p in frame["path"]], list(frame["run"]),
                     list(frame["warm_start_accuracy"]), said)
    damaged = [row for row in rows if row["damage"]]
    for row in damaged:
        print(f"moestab analyze: error: {row['path']} is damaged: {row['damage']}", file=sys.stderr)
    return 1 if damaged or errors else 0


def _write_plots(out: Path, runs: list[Path], names: list[str], starts: list[float], said: set) -> None:
    """Each run's figures in ``out/<run>/`` (``<run>_2`` for a name given twice) and, for several runs, their curves
    overlaid in ``out/curves.png`` under the same names (``starts``: each run's start eval accuracy, at step 0)."""
    import pandas as pd

    from moestab.analysis.plots import plot_curves, save_figure, write_run_plots
    from moestab.run_folder.errors import RunError
    from moestab.run_folder.reader import load_metrics

    used: dict[str, int] = {}
    frames, start_of = [], {}
    for path, name, start in zip(runs, names, starts, strict=True):
        used[name] = used.get(name, 0) + 1
        label = name if used[name] == 1 else f"{name}_{used[name]}"
        folder = out / label
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
        metrics.insert(0, "run", label)
        frames.append(metrics)
        start_of[label] = start
    if len(runs) >= 2 and frames:
        path = save_figure(plot_curves(pd.concat(frames, ignore_index=True), start_of), out / "curves.png")
        print(f"moestab analyze: wrote {path}", file=sys.stderr)
