"""Look for the regime of GSPO §5.3: token-level GRPO without replay less stable than GRPO + R2 and than GSPO.

Runs `moestab train` over a grid — learning rate x policy depth x task (response length) x {grpo, gspo} x
routing replay {off, old (R2), rollout (R3)} x seeds — with bf16 rollouts against an fp32 trainer, and prints
one row per setting (mean over seeds) of what instability looks like:

- ``final_acc``: eval accuracy at the end; ``reward_gain``: mean reward of the last quarter of the steps minus
  the first quarter;
- ``ratio_log_var``: mean per-step Var(log w); ``clip_later``: mean token clip fraction over minibatches 2..n;
- ``grad_spikes``: steps whose gradient norm max exceeds 3x the run's median; ``collapse``: share of seeds whose
  eval accuracy ended below the start by more than 10 points;
- ``vol``: mean old->new routing change; ``rollout_flip``: routers flipped between the rollout and free pi_old.

    .venv/bin/python scripts/stress_sweep.py --grid small   # 12 runs: a check that the sweep works
    .venv/bin/python scripts/stress_sweep.py --grid full    # the sweep behind docs/stress.md

Finished runs are reused and unfinished ones started over (moestab.experiments.grid; delete --out to start over);
the table is also written to OUT/sweep.csv.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import pandas as pd

from moestab.experiments.grid import grid_runs, quiet_process, run_grid
from moestab.experiments.stability import run_stability
from moestab.models.spec import parse_model_spec

# Each grid is a list of blocks; a block is the product of its lists. The full grid spends most of its budget
# around the learning rates where the default task starts to break (2e-4 is the default and stable), and two
# blocks on the long-response task (33-token responses: a step costs ~10x more), limited to the comparison of
# GSPO §5.3: GRPO without replay, GRPO + R2, GSPO without replay.
_REPLAYS = ["off", "old", "rollout"]
_LONG = {"lr": [5e-4], "layers": [4], "task": ["sort:length=32"], "seeds": [0, 1], "steps": 20}
GRIDS = {
    "small": [{"lr": [1e-3], "layers": [4], "task": ["arithmetic"], "algo": ["grpo", "gspo"],
               "replay": _REPLAYS, "seeds": [0, 1], "steps": 20}],
    "full": [
        {"lr": [5e-4, 1e-3], "layers": [4, 8], "task": ["arithmetic"], "algo": ["grpo", "gspo"],
         "replay": _REPLAYS, "seeds": [0, 1], "steps": 40},
        {**_LONG, "algo": ["grpo"], "replay": ["off", "old"]},
        {**_LONG, "algo": ["gspo"], "replay": ["off"]},
    ],
}


# The columns of docs/stress.md, in order (moestab.experiments.stability.run_stability defines each).
COLUMNS = ("final_acc", "reward_gain", "ratio_log_var", "clip_later", "grad_spikes", "collapse", "vol", "rollout_flip")


def run_row(out: Path) -> dict[str, float]:
    measures = run_stability(out)
    return {c: measures[c] for c in COLUMNS}


def markdown_table(table: pd.DataFrame) -> str:
    """The sweep as Markdown: setting columns as they are, each measure as ``mean +- sd``."""
    measures = [c for c in table.columns if f"{c}_sd" in table.columns]
    settings = [c for c in table.columns if c not in measures and not c.endswith("_sd")]
    lines = ["| " + " | ".join(settings + measures) + " |", "|" + "---|" * (len(settings) + len(measures))]
    for _, row in table.iterrows():
        cells = [str(row[c]) for c in settings] + [f"{row[c]:.3g} +- {row[c + '_sd']:.2g}" for c in measures]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", choices=sorted(GRIDS), default="small")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("runs/sweep"))
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--table-only", action="store_true", help="print the table of OUT/sweep.csv and exit")
    args = parser.parse_args(argv)
    if args.table_only:
        print(markdown_table(pd.read_csv(args.out / "sweep.csv")))
        return 0
    quiet_process(args.threads)
    rows = []
    for block in GRIDS[args.grid]:
        base = {"steps": block["steps"], "rollout_dtype": "bfloat16", "threads": args.threads,
                "cache_dir": args.cache_dir, "max_zero_advantage_steps": 0}
        axes = {"lr": block["lr"], "model": [f"embedded:layers={n}" for n in block["layers"]], "task": block["task"],
                "algo": block["algo"], "routing_replay": block["replay"]}
        runs = grid_runs(base, axes, block["seeds"], args.out)
        run_grid(runs, log=lambda line: print(line, flush=True))
        settings: dict[tuple, list[dict[str, float]]] = {}
        for run in runs:
            key = tuple(v for k, v in run.values.items() if k != "seed")
            settings.setdefault(key, []).append(run_row(run.run_dir))
        for (lr, model, task, algo, replay), per_seed in settings.items():
            stats = {}
            for key in per_seed[0]:
                values = [r[key] for r in per_seed]
                stats[key] = statistics.mean(values)
                stats[f"{key}_sd"] = statistics.stdev(values) if len(values) > 1 else float("nan")
            rows.append({"lr": lr, "layers": parse_model_spec(model).num_layers, "task": task, "steps": block["steps"],
                         "algo": algo, "replay": replay, "seeds": len(per_seed), **stats})
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "sweep.csv", index=False)
    print(f"\n{args.grid} grid, bf16 rollouts, fp32 trainer, {args.threads} threads; mean +- sd over seeds\n")
    print(markdown_table(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
