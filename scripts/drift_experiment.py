"""Issue 52's experiment: which routing change breaks GRPO, within a step or across steps (moestab.experiments.drift;
docs/drift.md).

    .venv/bin/python scripts/drift_experiment.py plan           # runs, cost estimate, minimum detectable differences
    .venv/bin/python scripts/drift_experiment.py register       # the block docs/drift.md commits
    .venv/bin/python scripts/drift_experiment.py run --shard 0/2   # one of 2 processes; finished runs are reused
    .venv/bin/python scripts/drift_experiment.py report         # docs/drift_results/ from the finished runs

The setting, seeds, length and eval set are the powered experiment's (``fine8-lr5e-4``, docs/powered.md); the lr of
the lr-matched GRPO arm comes from its committed curves (docs/powered_results/curves.csv). ``run`` refuses unless
docs/drift.md registers exactly this design.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from moestab.experiments import drift
from moestab.experiments import precondition as pre
from moestab.experiments.grid import quiet_process
from moestab.experiments.powered import Design
from moestab.experiments.registration import block

ROOT = Path(__file__).resolve().parents[1]
REGISTRATION = ROOT / "docs" / "drift.md"
RESULTS = ROOT / "docs" / "drift_results"
POWERED_CURVES = ROOT / "docs" / "powered_results" / "curves.csv"
SETTING = "fine8-lr5e-4"


def design_of(cache_dir: str | None) -> drift.DriftDesign:
    s = {s.name: s for s in pre.SETTINGS}[SETTING]
    powered = Design(model=s.model, lr=s.lr, aux=s.aux, task=s.task, cache_dir=cache_dir)
    return drift.DriftDesign(powered, lr_match=drift.matching_lr(pd.read_csv(POWERED_CURVES)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("plan", "register", "run", "report"))
    parser.add_argument("--out", type=Path, default=Path("runs/issue52/drift"))
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--shard", default="0/1", help="i/n: this process runs every n-th run from the i-th")
    parser.add_argument("--run-seconds", type=float, default=217.0, help="estimated s per run (plan)")
    parser.add_argument("--base-seconds", type=float, default=250.0, help="estimated s per warm-started base (plan)")
    args = parser.parse_args(argv)
    design = design_of(args.cache_dir)
    if args.command == "plan":
        runs = drift.all_runs(design, args.out)
        bases = len(design.powered.seeds) * 2  # a MoE and a dense base per seed
        hours = (len(runs) * args.run_seconds + bases * args.base_seconds) / 3600
        by_stage = {s: sum(1 for r in runs if drift.ARMS[r.run_dir.parent.name][0] == s) for s in design.stages}
        print(f"{len(runs)} runs (per stage {by_stage}) and {bases} bases: ~{hours:.1f} core-hours at "
              f"{args.run_seconds:.0f} s per run and {args.base_seconds:.0f} s per base; lr match {design.lr_match}; "
              "minimum detectable difference in mean eval accuracy "
              + ", ".join(f"stage {s} {design.min_detectable(s):.2%}" for s in drift.CONTRASTS))
        return 0
    if args.command == "register":
        print(block(drift.registration(design)))
        return 0
    if args.command == "run":
        quiet_process(1)
        i, n = (int(v) for v in args.shard.split("/"))
        drift.run_experiment(design, args.out, REGISTRATION, shards=(i, n), log=lambda s: print(s, flush=True))
        return 0
    written = drift.write_results(design, args.out, RESULTS, ROOT / "docs" / "powered_results" / "outcomes.csv")
    print("wrote", ", ".join(p.relative_to(ROOT).as_posix() for p in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
