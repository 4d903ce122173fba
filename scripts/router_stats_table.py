"""Router statistics of warm-started bases (``moestab probe routers``), as mean +- sd over seeds: docs/routers.md.

    .venv/bin/python scripts/router_stats_table.py --model embedded --aux 0 0.01 --seeds 0 1 2 3 4 5 6 7 8 9 \\
        --cache-dir runs/issue41/cache [--count 256]

For each warm-start load-balancing coefficient in ``--aux`` and each seed, the base ``moestab train --model MODEL
--seed SEED --warm-start-aux-loss-coef AUX`` starts from (``moestab.train.recipe.base_policy_path``: found in the
cache, or built as training would build it) is probed on the same held-out suite (``task:arithmetic``, ``--count``
problems); each base's layers are averaged, then the seeds summarised as mean +- sd.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from moestab.analysis.router_stats import COLUMNS
from moestab.configs import build_config
from moestab.probes.checkpoints import Checkpoint
from moestab.probes.routers import routers
from moestab.probes.suites import load_suite
from moestab.tasks import task_from_spec
from moestab.train import TrainConfig
from moestab.train.recipe import base_policy_path

SHOWN = [c for c in COLUMNS if c not in ("layer", "tokens")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="embedded", help="an embedded spec, e.g. embedded:fine")
    parser.add_argument("--aux", type=float, nargs="+", default=[0.0, 0.01], help="warm-start balancing coefficients")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cache-dir", type=Path, required=True, help="warm-start cache (bases reused or built)")
    parser.add_argument("--count", type=int, default=256, help="held-out problems probed")
    args = parser.parse_args(argv)
    task = task_from_spec("arithmetic")
    suite = load_suite("task:arithmetic", args.count)
    columns = []
    for aux in args.aux:
        per_seed = []
        for seed in args.seeds:
            config = build_config(TrainConfig, {"model": args.model, "seed": seed, "cache_dir": str(args.cache_dir),
                                                "warm_start_aux_loss_coef": aux})
            path, record = base_policy_path(config, task, log=lambda line: None)
            table = routers([Checkpoint(Path(path).name, Path(path))], suite.texts)
            means = {c: float(table[c].mean()) for c in SHOWN}
            per_seed.append(means)
            print(f"{args.model}, aux {aux}, seed {seed} ({Path(path).name}, {record['steps']} warm-start steps, "
                  f"accuracy {record['accuracy']:.1%}): " + ", ".join(f"{c} {v:.3g}" for c, v in means.items()),
                  flush=True)
        columns.append((f"aux {aux}", per_seed))
    print(f"\n{args.model}; suite task:arithmetic, {args.count} problems; per base the mean over its layers, then "
          f"mean +- sd over seeds {', '.join(map(str, args.seeds))}\n")
    print("| quantity | " + " | ".join(label for label, _ in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for column in SHOWN:
        cells = []
        for _, per_seed in columns:
            xs = [b[column] for b in per_seed]
            sd = statistics.stdev(xs) if len(xs) > 1 else float("nan")
            cells.append(f"{statistics.mean(xs):.3g} +- {sd:.2g}")
        print(f"| {column} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
