"""``moestab probe NAME CHECKPOINT ...``: run a probe (``moestab.probes``) on run folders or Hugging Face MoE folders.

Only parses arguments and calls ``moestab.probes``. Everything is checked (probe name, checkpoints, suite,
settings, output targets) before any model is loaded or anything is written. ``--json`` / ``--csv`` follow
:mod:`moestab.commands.output` (``--csv``: every table in one CSV, a first column ``table`` naming each row's; the
probe folder of ``--out`` keeps one CSV per table).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from moestab.commands.output import OutputError, add_output_options, emit, output_problem, uses_stdout

if TYPE_CHECKING:
    from moestab.probes.folder import ProbeResult

HELP = ("Probe MoE checkpoints without training: compare two, precision numerics, router saturation, one RL step's "
        "volatility by lr and minibatches, volatility against depth.")


def _folder(value: str) -> Path:
    """argparse type of an output folder: an empty value is refused (``Path("")`` would be the current folder)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("the value is empty; give a folder")
    return Path(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from moestab.configs import MAX_NEW_TOKENS
    from moestab.probes.runner import PROBES, ProbeSettings
    from moestab.probes.suites import SUITE_FORMS

    d = ProbeSettings()

    parser.add_argument("probe", metavar="PROBE", help="; ".join(f"{k}: {v.help}" for k, v in PROBES.items()))
    parser.add_argument("checkpoints", nargs="*", metavar="CHECKPOINT",
                        help="moestab run folder (compare / numerics / step-volatility: its last checkpoint; "
                             "saturation: all of them) or Hugging Face model folder; depth takes none")
    parser.add_argument("--suite", default=None, help=f"probe texts (default: general): {SUITE_FORMS}; the step "
                        "probes take none (they run on --task's prompts)")
    parser.add_argument("--count", type=int, default=None, help="use the suite's first N texts (default: 256 for "
                        "built-in suites, all of a file)")
    parser.add_argument("--max-tokens", type=int, default=None, help="cut each text to N tokens")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16 (numerics: the reference)")
    parser.add_argument("--other-dtype", default="bfloat16", help="numerics: the precision compared with --dtype")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--reference", type=int, default=-1, help="saturation: index of the reference checkpoint")
    step = parser.add_argument_group("step probes (step-volatility, depth): one RL step as moestab train's step 1")
    step.add_argument("--task", default=None, help="task spec of the step (default: the run's task for a run folder, "
                      "else arithmetic)")
    step.add_argument("--algo", default=d.algo, help=f"objective preset (default {d.algo}); routing replay is off")
    step.add_argument("--prompts", type=int, default=d.prompts, help=f"prompts of the step (default {d.prompts})")
    step.add_argument("--group-size", type=int, default=d.group_size, help=f"samples per prompt (default "
                      f"{d.group_size})")
    step.add_argument("--seed", type=int, default=d.seed, help="the step is moestab train's step 1 with this seed; "
                      "depth: also the policies' initialisation; 0 <= seed < 2**63")
    step.add_argument("--max-new-tokens", type=int, default=None, help=f"response cap, 1 to {MAX_NEW_TOKENS} (default: "
                      "the task's longest answer plus end-of-sequence)")
    step.add_argument("--lrs", type=float, nargs="+", default=list(d.lrs), metavar="LR",
                      help=f"step-volatility: learning rates (default {' '.join(map(str, d.lrs))}; 0 = the no-change "
                      "control)")
    step.add_argument("--minibatch-counts", type=int, nargs="+", default=list(d.minibatch_counts), metavar="N",
                      help=f"step-volatility: updates per step (default {' '.join(map(str, d.minibatch_counts))}); "
                      "each must divide prompts x group size")
    step.add_argument("--layers", type=int, nargs="+", default=list(d.layers), metavar="N",
                      help=f"depth: MoE layer counts (default {' '.join(map(str, d.layers))})")
    step.add_argument("--lr", type=float, default=d.lr, help=f"depth: learning rate of the update (default {d.lr})")
    step.add_argument("--model", default=d.model, help="depth: embedded variant whose depth varies, without layers "
                      "(e.g. embedded:experts=32,top_k=4)")
    step.add_argument("--warm-start", action="store_true", help="depth: start from moestab train's supervised warm "
                      "start of each variant (cached, shared with training; minutes per deep variant the first "
                      "time) instead of fresh weights")
    step.add_argument("--cache-dir", default=None, help="depth: warm-start cache (default $MOESTAB_CACHE or "
                      "~/.cache/moestab)")
    parser.add_argument("--out", type=_folder, default=None, help="save the result as a probe folder (the dashboard's "
                        "Probes page reads these)")
    add_output_options(parser, json_what="the result as JSON (probe, checkpoints, suite, settings, every table)",
                       csv_what="every table as one CSV (a first column 'table' names each row's table)")
    parser.add_argument("--plots", metavar="DIR", type=_folder, default=None, help="write PNG figures to DIR")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads, 1 to 4096 (default: torch's "
                        "choice)")


def run(args: argparse.Namespace) -> int:
    from moestab.extras import MissingExtraError, require
    from moestab.probes.errors import ProbeError
    from moestab.probes.folder import check_output_targets
    from moestab.probes.runner import ProbeSettings, probe_inputs, run_probe
    from moestab.text import MESSAGE_LIMIT, clip

    try:
        settings = ProbeSettings(dtype=args.dtype, other_dtype=args.other_dtype, device=args.device,
                                 batch_size=args.batch_size, max_tokens=args.max_tokens, reference=args.reference,
                                 task=args.task, algo=args.algo, prompts=args.prompts, group_size=args.group_size,
                                 seed=args.seed, max_new_tokens=args.max_new_tokens, lrs=tuple(args.lrs),
                                 minibatch_counts=tuple(args.minibatch_counts), layers=tuple(args.layers), lr=args.lr,
                                 model=args.model, warm_start=args.warm_start, cache_dir=args.cache_dir,
                                 progress=not args.no_progress, threads=args.threads)
        checkpoints, suite = probe_inputs(args.probe, args.checkpoints, args.suite, args.count, settings)
        check_output_targets(out=args.out, plots=args.plots)
        if args.plots is not None:
            require("plots", "moestab probe --plots")
        problem = output_problem(args.json, args.csv)
        if problem is not None:
            raise ProbeError(problem)
        if args.threads is not None:  # the process's environment is the command's to set, not the library's
            import torch

            torch.set_num_threads(args.threads)
        result = run_probe(args.probe, checkpoints, suite, settings)
    except (ProbeError, MissingExtraError) as exc:
        print(f"moestab probe: error: {clip(str(exc), MESSAGE_LIMIT)}", file=sys.stderr)
        return 2
    if not uses_stdout(args.json, args.csv):  # else stdout carries the JSON or CSV only
        _print_result(result, ", ".join(c.label for c in checkpoints) or "its own policies")
    try:
        _save_result(result, args)
    except (OutputError, OSError) as exc:  # checked before the probe ran; this is what changed since
        print(f"moestab probe: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _print_result(result: ProbeResult, on: str) -> None:
    """The probe, what it ran on, and each of its tables."""
    manifest = result.suite
    print(f"probe {result.probe} on {on}; suite {manifest['name']} ({manifest['count']} texts, sha256 "
          f"{str(manifest['sha256'])[:12]})")
    for name, table in result.tables.items():
        print(f"\n{name}:\n{table.to_string(index=False, float_format=lambda x: f'{x:.4g}')}")


def _save_result(result: ProbeResult, args: argparse.Namespace) -> None:
    """Whichever of --out, --json, --csv and --plots were given; what was written is said on stderr (stdout may
    carry the JSON or CSV)."""
    from moestab.probes.folder import write_probe_folder
    from moestab.probes.plots import plot_probe

    if args.out is not None:
        print(f"probe folder: {write_probe_folder(result, args.out)}", file=sys.stderr)
    if args.json is not None:
        emit(json.dumps(result.to_json(), indent=2), args.json)
    if args.csv is not None:
        emit(result.stacked_tables().to_csv(index=False), args.csv)
    if args.plots is not None:
        for path in plot_probe(result, args.plots):
            print(f"figure: {path}", file=sys.stderr)
