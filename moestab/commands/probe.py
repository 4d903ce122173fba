"""``moestab probe NAME CHECKPOINT ...``: run a probe (``moestab.probes``) on run folders or Hugging Face MoE folders.

Only parses arguments and calls ``moestab.probes``. Everything is checked (probe name, checkpoints, suite,
settings, output folders) before any model is loaded or anything is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HELP = "Probe MoE checkpoints without training: compare two, precision numerics, router saturation."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from moestab.probes.runner import PROBES
    from moestab.probes.suites import SUITE_FORMS

    parser.add_argument("probe", metavar="PROBE", help="; ".join(f"{k}: {v.help}" for k, v in PROBES.items()))
    parser.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT",
                        help="moestab run folder (compare / numerics: its last checkpoint; saturation: all of them) "
                             "or Hugging Face model folder")
    parser.add_argument("--suite", default="general", help=f"probe texts: {SUITE_FORMS}")
    parser.add_argument("--count", type=int, default=None, help="use the suite's first N texts (default: 256 for "
                        "built-in suites, all of a file)")
    parser.add_argument("--max-tokens", type=int, default=None, help="cut each text to N tokens")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16 (numerics: the reference)")
    parser.add_argument("--other-dtype", default="bfloat16", help="numerics: the precision compared with --dtype")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--reference", type=int, default=-1, help="saturation: index of the reference checkpoint")
    parser.add_argument("--out", type=Path, default=None, help="save the result as a probe folder (the dashboard's "
                        "Probes page reads these)")
    parser.add_argument("--json", metavar="FILE", default=None, help="write the result as JSON to FILE ('-' = stdout)")
    parser.add_argument("--csv", metavar="DIR", type=Path, default=None, help="write one CSV per table to DIR")
    parser.add_argument("--plots", metavar="DIR", type=Path, default=None, help="write PNG figures to DIR")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _check_out(path: Path | None, what: str) -> None:
    if path is not None and path.exists() and not path.is_dir():
        raise_error(f"{what} {path} exists and is not a folder")


def raise_error(message: str) -> None:
    from moestab.probes.errors import ProbeError

    raise ProbeError(message)


def run(args: argparse.Namespace) -> int:
    from moestab.probes.checkpoints import resolve_checkpoints
    from moestab.probes.errors import ProbeError
    from moestab.probes.folder import ProbeResult, write_probe_folder
    from moestab.probes.plots import plot_probe
    from moestab.probes.runner import ProbeSettings, get_probe, run_probe, select_checkpoints
    from moestab.probes.suites import load_suite

    try:
        get_probe(args.probe)
        settings = ProbeSettings(dtype=args.dtype, other_dtype=args.other_dtype, device=args.device,
                                 batch_size=args.batch_size, max_tokens=args.max_tokens, reference=args.reference,
                                 progress=not args.no_progress)
        settings.check()
        if args.count is not None and args.count < 1:
            raise ProbeError(f"--count must be >= 1, got {args.count}")
        checkpoints = select_checkpoints(args.probe, [resolve_checkpoints([c]) for c in args.checkpoints])
        suite = load_suite(args.suite, args.count)
        for path, what in ((args.out, "--out"), (args.csv, "--csv"), (args.plots, "--plots")):
            _check_out(path, what)
        result: ProbeResult = run_probe(args.probe, checkpoints, suite, settings)
    except ProbeError as exc:
        print(f"moestab probe: error: {exc}", file=sys.stderr)
        return 2
    print(f"probe {result.probe} on {', '.join(c.label for c in checkpoints)}; suite {suite.name} "
          f"({len(suite.texts)} texts, sha256 {suite.sha256[:12]})")
    for name, table in result.tables.items():
        print(f"\n{name}:\n{table.to_string(index=False, float_format=lambda x: f'{x:.4g}')}")
    if args.out is not None:
        print(f"\nprobe folder: {write_probe_folder(result, args.out)}")
    if args.json is not None:
        text = json.dumps(result.to_json(), indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text)
    if args.csv is not None:
        args.csv.mkdir(parents=True, exist_ok=True)
        for name, table in result.tables.items():
            table.to_csv(args.csv / f"{name}.csv", index=False)
    if args.plots is not None:
        for path in plot_probe(result, args.plots):
            print(f"figure: {path}")
    return 0
