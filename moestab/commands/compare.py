"""``moestab compare RUNS...``: runs grouped by condition, each group's mean +- se over seeds and each group minus a
baseline paired by seed with its 95% interval, over one step window (``moestab.analysis.comparison``, the functions
the dashboard's Compare page uses). Text, ``--json`` / ``--csv`` (``moestab.commands.output``), and ``--report DIR``:
a Markdown report with its figures.

Exit status: 0 when the comparison was made; 1 when no run was readable or the runs cannot be compared (no common
step, an unknown field or group); 2 when an output cannot be written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from moestab.commands.analyze import step_window
from moestab.commands.output import OutputError, add_output_options, emit, output_problem, uses_stdout

HELP = "Compare groups of runs: mean +- se over seeds and paired differences with 95%% intervals, as text, JSON, CSV " \
       "or a Markdown report."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN", type=Path,
                        help="run folders, or folders of them (searched 3 levels down, as the dashboard searches)")
    parser.add_argument("--by", metavar="FIELD[,FIELD]", type=lambda t: [f for f in t.split(",") if f],
                        help="config fields that tell the groups apart (default: every field that differs between the "
                        "runs and changes training; how a run was measured is left out)")
    parser.add_argument("--metric", metavar="KEY", action="append", dest="metrics",
                        help="a metrics.jsonl key to compare (repeatable; default: reward, eval accuracy, old->new "
                        "routing change, rollout->trainer k3, Var(log w), the clipped share)")
    parser.add_argument("--steps", metavar="FIRST:LAST", type=step_window,
                        help="the step window each run is averaged over (default: the steps every run has)")
    parser.add_argument("--baseline", metavar="GROUP",
                        help="the group the others are compared with, as printed (default: the first group)")
    add_output_options(parser, json_what="the group means and the paired differences as JSON",
                       csv_what="the group means and the paired differences as CSV (one row each)")
    parser.add_argument("--report", metavar="DIR", type=Path,
                        help="write DIR/report.md with a figure per metric (needs the plots extra)")


def report_problem(folder: Path) -> str | None:
    """Why ``--report DIR`` could not be written, checked before any work: DIR a file, inside a run's or a model
    folder's own files (:func:`moestab.run_folder.owned.owner`), or not writable; None when it can."""
    from moestab.run_folder.files import read_only_above
    from moestab.run_folder.owned import owner

    if folder.exists() and not folder.is_dir():
        return f"--report {folder} is a file; give a folder for report.md and its figures"
    above = next((p for p in folder.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        return f"--report {folder}: {above} is a file, not a folder"
    taken = owner(folder / "report.md")
    if taken is not None:
        return f"--report {folder} would write into {taken.rsplit('/report.md', 1)[0]}; give another folder"
    stuck = read_only_above(folder / "report.md")
    if stuck is not None:
        return f"--report {folder}: {stuck} is not writable (read-only or not yours); give another folder"
    return None


def run(args: argparse.Namespace) -> int:
    import json

    from moestab.analysis.compare import DEFAULT_KEYS
    from moestab.analysis.comparison import compare_runs, comparison_markdown, comparison_text, write_figures
    from moestab.commands.analyze import expand_runs
    from moestab.extras import MissingExtraError, require
    from moestab.run_folder.errors import RunError

    problem = output_problem(args.json, args.csv)
    if problem is None and args.report is not None:
        problem = report_problem(args.report)
    if problem is None and args.report is not None:
        try:
            require("plots", "moestab compare --report")
        except MissingExtraError as exc:
            problem = str(exc)
    if problem is not None:
        print(f"moestab compare: error: {problem}", file=sys.stderr)
        return 2
    runs = [p for p in expand_runs(args.runs) if (p / "run.json").is_file()]
    for path in args.runs:
        if not any(r == path or path in r.parents for r in runs):
            print(f"moestab compare: warning: {path} holds no run folder: left out", file=sys.stderr)
    if not runs:
        print("moestab compare: error: no run folder among the folders given", file=sys.stderr)
        return 1
    skipped: list = []
    try:
        c = compare_runs(runs, by=args.by, metrics=args.metrics or DEFAULT_KEYS, steps=args.steps,
                         baseline=args.baseline, skipped=skipped)
    except (ValueError, KeyError, RunError) as exc:
        print(f"moestab compare: error: {exc}", file=sys.stderr)
        return 1
    for part in skipped:
        print(f"moestab compare: warning: skipped {part}", file=sys.stderr)
    try:
        if args.json is not None:
            emit(json.dumps({"window": list(c.window), "fields": list(c.fields), "baseline": c.baseline,
                             "groups": c.groups.to_dict(orient="records"),
                             "differences": c.differences.to_dict(orient="records")}, indent=2, allow_nan=False,
                            default=str).replace("NaN", "null"), args.json)
        if args.csv is not None:
            emit(c.groups.assign(kind="group").to_csv(index=False)
                 + c.differences.assign(kind="difference").to_csv(index=False), args.csv)
    except (OutputError, ValueError) as exc:
        print(f"moestab compare: error: {exc}", file=sys.stderr)
        return 2
    if not uses_stdout(args.json, args.csv):
        print(comparison_text(c))
    if args.report is not None:
        figures = write_figures(c, args.report)
        (args.report / "report.md").write_text(comparison_markdown(c, figures))
        print(f"moestab compare: wrote {args.report / 'report.md'} and {len(figures)} figure(s)", file=sys.stderr)
    return 0
