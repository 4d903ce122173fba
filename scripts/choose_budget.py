"""Choose the default measurement budget from measurements: the sampling error of old->new router flips at each
budget fraction against their step-to-step spread, on the default job.

    .venv/bin/python scripts/choose_budget.py [--seed 900] [--steps 60] [--threads 1] [--run DIR]

Trains the default job (``moestab train``'s defaults: GSPO, replay off, the embedded policy, 32 prompts x 8) on a
seed reserved for this choice (900: the seeds results are reported on are never used to choose a setting), measured
in full (budget 1, every sequence in the tables), unless ``--run`` names such a run already. Then, per step, the
expected sampling error of ``routing/old_new/router_flip`` at each fraction (:mod:`moestab.analysis.budget_error`) and
the spread of the full rate over steps; a fraction passes when its largest error over the steps is below a tenth of
the spread. No fraction below 1 passes, so the default measures whole steps: every N-th one, in full (sampling
error 0). The last table shows what that costs the run mean (:func:`moestab.analysis.budget_error.every_errors`); N
itself is the smallest power of two meeting the speed targets of ``bench/bench_train.py --measure-every N``
(``moestab.recording.measure_budget.DEFAULT_EVERY``). docs/benchmarks.md records the output.

Why the last column: when the spread of the rate from step to step comes mostly from which prompts the step drew (a
between-group spread ``S / sqrt(M)``), the error of measuring ``m = f M`` of the ``M`` groups is about
``sqrt((1 - f) / f)`` times that spread, whatever ``M`` is; a tenth then needs ``f > 0.99``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from moestab.analysis.budget_error import budget_choice, budget_errors, every_errors, group_counts
from moestab.recording.measure_budget import MeasureBudget
from moestab.train import TrainConfig, train

FRACTIONS = (0.0625, 0.125, 0.25, 0.5, 1.0)
EVERIES = (1, 2, 4, 8, 16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=900)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--run", help="a run of the default job measured in full (skips training)")
    parser.add_argument("--out", default="runs/choose-budget")
    args = parser.parse_args()
    run = Path(args.run) if args.run else None
    if run is None:
        config = TrainConfig(seed=args.seed, steps=args.steps, threads=args.threads, out=args.out, progress=False,
                             overwrite=True, eval_every=10**6, measure_every=1)
        run = train(config, log=lambda s: None).run_dir
    for stat in ("router_flip", "changed"):
        errors = budget_errors(group_counts(run, "old_new", stat), FRACTIONS, seed=args.seed)
        choice = budget_choice(errors, FRACTIONS)
        passing = choice[choice.ok]
        groups = int(errors.groups.iloc[0])
        print(f"\nrouting/old_new/{stat} over {len(errors)} steps of {run} ({groups} groups a step): "
              f"mean {errors.value.mean():.5f}, step-to-step spread (sd over steps) {choice.spread.iloc[0]:.5f}")
        print("| fraction | groups measured | largest expected se over steps | mean expected se | largest se / spread "
              "| sqrt((1 - f) / f) | below spread / 10 |\n|---:|---:|---:|---:|---:|---:|---|")
        for row in choice.itertuples():
            measured = MeasureBudget(fraction=row.fraction).groups(groups, 0).numel()
            print(f"| {row.fraction:g} | {measured} | {row.max_se:.5f} | {row.mean_se:.5f} | "
                  f"{row.se_over_spread:.3f} | {math.sqrt((1 - row.fraction) / row.fraction):.3f} | "
                  f"{'yes' if row.ok else 'no'} |")
        drawn = errors[[c for c in errors if c.startswith("drawn_se_")]].mean()
        print("mean over steps of the error estimated from the budget's own sample (ratio_se): "
              + ", ".join(f"{c.removeprefix('drawn_se_')}: {v:.5f}" for c, v in drawn.items()))
        print(f"smallest passing fraction: {passing.fraction.min() if len(passing) else 'none'}")
        steps = errors.set_index("step")["value"]
        print(f"\nEvery N-th step in full (fraction 1: a measured step has sampling error 0, below spread / 10 = "
              f"{choice.spread.iloc[0] / 10:.5f}); what it costs the run mean {steps.mean():.5f} of {len(steps)} "
              "steps:\n| every | steps measured | error of the run mean (steps 1, 1 + N, ...) "
              "| rms error over the N phases | rms error / spread |\n|---:|---:|---:|---:|---:|")
        for row in every_errors(steps, EVERIES).itertuples():
            print(f"| {row.every} | {row.measured_steps} | {row.error:+.5f} | {row.rms_error:.5f} | "
                  f"{row.rms_error / row.spread:.3f} |")


if __name__ == "__main__":
    main()
