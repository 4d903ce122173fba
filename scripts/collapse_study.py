"""Issue 57's study: a collapse warning from moestab's per-step signals, fitted on development runs and scored once
on held-out ones (moestab.experiments.collapse_study; docs/collapse.md registers it).

    .venv/bin/python scripts/collapse_study.py plan              # the runs and their estimated cost
    .venv/bin/python scripts/collapse_study.py register          # the block docs/collapse.md commits
    .venv/bin/python scripts/collapse_study.py run --shard 0/2   # the study's own runs; finished runs are reused
    .venv/bin/python scripts/collapse_study.py fit               # candidates calibrated and chosen on the dev runs
    .venv/bin/python scripts/collapse_study.py report            # the chosen rule scored on the held-out runs

The development runs are issue 52's stage-1 runs (``--drift-out``) and the study's lr 1e-3 runs; the held-out runs are
new seeds and the default model. ``run``, ``fit`` and ``report`` refuse unless docs/collapse.md registers exactly this
design; ``report`` refuses unless ``fit`` wrote its choice first (docs/collapse_results/chosen.json).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from moestab.experiments import collapse_study as study
from moestab.experiments import precondition as pre
from moestab.experiments.grid import quiet_process, run_grid, shard
from moestab.experiments.powered import Design
from moestab.experiments.registration import block, check_registered

ROOT = Path(__file__).resolve().parents[1]
REGISTRATION = ROOT / "docs" / "collapse.md"
RESULTS = ROOT / "docs" / "collapse_results"
SETTING = "fine8-lr5e-4"


def powered(cache_dir: str | None) -> Design:
    s = {s.name: s for s in pre.SETTINGS}[SETTING]
    return Design(model=s.model, lr=s.lr, aux=s.aux, task=s.task, cache_dir=cache_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("plan", "register", "run", "fit", "report"))
    parser.add_argument("--out", type=Path, default=Path("runs/issue57"))
    parser.add_argument("--drift-out", type=Path, default=Path("runs/issue52/drift"))
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--shard", default="0/1", help="i/n: this process runs every n-th run from the i-th")
    args = parser.parse_args(argv)
    design = powered(args.cache_dir)
    runs = study.new_runs(design.base(), design.model, args.out)
    if args.command == "plan":
        print(study.plan(runs))
        return 0
    if args.command == "register":
        print(block(study.registration()))
        return 0
    check_registered(REGISTRATION, study.registration())
    if args.command == "run":
        quiet_process(1)
        i, n = (int(v) for v in args.shard.split("/"))
        run_grid(shard(runs, i, n), log=lambda s: print(s, flush=True))
        return 0
    every = study.study_runs(args.drift_out, args.out, design.seeds)
    if args.command == "fit":
        written = study.write_fit(every, RESULTS)
    else:
        chosen = RESULTS / "chosen.json"
        if not chosen.is_file():
            parser.error(f"{chosen} is missing: run `fit` first (the rule is chosen on the development runs)")
        written = study.write_report(every, json.loads(chosen.read_text()), RESULTS, args.out)
    print("wrote", ", ".join(p.relative_to(ROOT).as_posix() for p in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
