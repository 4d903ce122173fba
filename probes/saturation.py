"""Probe: when does routing settle? OLMoE-style router saturation over a run's checkpoints.

For every checkpoint of RUN, the share of the reference checkpoint's top-k experts (default: the
last checkpoint) that the checkpoint also picks, per MoE layer, on a fixed probe set: the run
task's held-out prompts and answers. Saturation near 1 early in training means RL barely moves
routing; low saturation in some layers says where routing keeps changing.

    python probes/saturation.py runs/gspo-off-seed0 [--probes 64] [--reference-step N] [--csv out.csv]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from moestab.analysis.saturation import run_saturation
from moestab.records.errors import RunError
from moestab.records.run_info import read_run_info
from moestab.tasks import task_from_spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder written by moestab train")
    parser.add_argument("--probes", type=int, default=64, help="held-out examples used as probe texts")
    parser.add_argument("--reference-step", type=int, default=None, help="checkpoint to compare against")
    parser.add_argument("--csv", type=Path, default=None, help="also write the per-layer table here")
    args = parser.parse_args(argv)

    try:
        config = read_run_info(args.run).config
    except RunError as exc:
        parser.error(str(exc))
    task = task_from_spec(config["task"])
    probes = [ex.prompt + ex.answer for ex in task.eval_set(args.probes, seed=config["seed"] + 1)]
    table = run_saturation(args.run, probes, reference_step=args.reference_step)
    wide = table.pivot(index="step", columns="layer", values="saturation")
    wide.columns = [f"layer {c}" for c in wide.columns]
    wide["mean"] = wide.mean(axis=1)
    print(f"top-k router saturation vs step {table.step.max() if args.reference_step is None else args.reference_step}"
          f" ({len(probes)} probes, {int(table.tokens.iloc[0])} tokens)")
    print(wide.round(4).to_string())
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
