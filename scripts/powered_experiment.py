"""Issue 41.4's experiment where the precondition holds (moestab.experiments.powered; docs/powered.md).

    .venv/bin/python scripts/powered_experiment.py plan --setting NAME       # runs, cost estimate, power
    .venv/bin/python scripts/powered_experiment.py register --setting NAME   # the block docs/powered.md commits
    .venv/bin/python scripts/powered_experiment.py run --setting NAME --shard 0/2 --cache-dir C   # one of 2 processes
    .venv/bin/python scripts/powered_experiment.py report --setting NAME     # docs/powered_results/ (all finished)

NAME is a setting of the precondition search (moestab.experiments.precondition.SETTINGS) that passed its check.
``run`` refuses unless docs/powered.md registers exactly this design; finished runs are reused.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from moestab.experiments import powered
from moestab.experiments import precondition as pre
from moestab.experiments.grid import quiet_process
from moestab.experiments.registration import block

ROOT = Path(__file__).resolve().parents[1]
REGISTRATION = ROOT / "docs" / "powered.md"
RESULTS = ROOT / "docs" / "powered_results"


def design_of(name: str, cache_dir: str | None) -> powered.Design:
    settings = {s.name: s for s in pre.SETTINGS}
    if name not in settings:
        raise SystemExit(f"unknown setting {name!r}; the search's settings: {', '.join(settings)}")
    s = settings[name]
    return powered.Design(model=s.model, lr=s.lr, aux=s.aux, task=s.task, cache_dir=cache_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("plan", "register", "run", "report"))
    parser.add_argument("--setting", required=True)
    parser.add_argument("--out", type=Path, default=Path("runs/issue41/powered"))
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--shard", default="0/1", help="i/n: this process runs every n-th run from the i-th")
    parser.add_argument("--step-seconds", type=float, default=1.2, help="estimated s per step (plan)")
    parser.add_argument("--eval-seconds", type=float, default=6.0, help="estimated s per evaluation (plan)")
    args = parser.parse_args(argv)
    design = design_of(args.setting, args.cache_dir)
    if args.command == "plan":
        runs = powered.all_runs(design, args.out)
        evals = design.steps // design.eval_every + 1
        hours = len(runs) * (design.steps * args.step_seconds + evals * args.eval_seconds) / 3600
        print(f"{len(runs)} runs ({len(powered.comparison_runs(design, args.out))} comparison), ~{hours:.1f} "
              f"core-hours at {args.step_seconds} s/step and {args.eval_seconds} s/eval; minimum detectable "
              f"difference {design.min_detectable():.2%} (sd {design.assumed_sd}, n {len(design.seeds)}, alpha "
              f"{design.contrast_alpha():.4f}, power {design.power})")
        return 0
    if args.command == "register":
        print(block(powered.registration(design)))
        return 0
    if args.command == "run":
        quiet_process(1)
        i, n = (int(v) for v in args.shard.split("/"))
        powered.run_experiment(design, args.out, REGISTRATION, shards=(i, n), log=lambda s: print(s, flush=True))
        return 0
    written = powered.write_results(design, args.out, RESULTS)
    print("wrote", ", ".join(p.relative_to(ROOT).as_posix() for p in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
