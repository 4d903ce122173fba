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

Finished runs are reused (delete --out to start over); the table is also written to OUT/sweep.csv.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from pathlib import Path

import pandas as pd

from moestab.records.reader import load_metrics, read_run_info
from moestab.train import TrainConfig, train

GRIDS = {
    "small": {"lr": [1e-3], "layers": [4], "task": ["arithmetic"], "algo": ["grpo", "gspo"],
              "replay": ["off", "old", "rollout"], "seeds": [0, 1], "steps": 20},
    "full": {"lr": [2e-4, 1e-3], "layers": [4, 8], "task": ["arithmetic"], "algo": ["grpo", "gspo"],
             "replay": ["off", "old", "rollout"], "seeds": [0, 1], "steps": 60},
}


def run_row(out: Path, start_accuracy: float | None) -> dict[str, float]:
    m = load_metrics(out)
    info = read_run_info(out)
    quarter = max(1, len(m) // 4)
    grad = m["grad_norm_max"]
    return {
        "final_acc": info.final_accuracy,
        "reward_gain": m["reward/mean"].iloc[-quarter:].mean() - m["reward/mean"].iloc[:quarter].mean(),
        "ratio_log_var": m["ratio/token_log_var"].mean(),
        "clip_later": m["clip/token_frac_later"].mean(),
        "grad_spikes": float((grad > 3 * grad.median()).sum()),
        "collapse": float(start_accuracy is not None and info.final_accuracy is not None
                          and info.final_accuracy < start_accuracy - 0.10),
        "vol": m["routing/old_new/changed"].mean(),
        "rollout_flip": m["routing/rollout_old_free/router_flip"].mean(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", choices=sorted(GRIDS), default="small")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("runs/sweep"))
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args(argv)
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    grid = GRIDS[args.grid]
    rows = []
    for lr, layers, task, algo, replay in itertools.product(
        grid["lr"], grid["layers"], grid["task"], grid["algo"], grid["replay"]
    ):
        per_seed = []
        for seed in grid["seeds"]:
            name = f"{task.split(':')[0]}-l{layers}-lr{lr:g}-{algo}-{replay}-seed{seed}"
            out = args.out / name
            if not (out / "run.json").is_file():
                config = TrainConfig(algo=algo, routing_replay=replay, model=f"embedded:layers={layers}", task=task,
                                     lr=lr, steps=grid["steps"], seed=seed, out=str(out), rollout_dtype="bfloat16",
                                     threads=args.threads, progress=False, cache_dir=args.cache_dir,
                                     max_zero_advantage_steps=0)
                train(config, log=lambda s: None)
            per_seed.append(run_row(out, read_run_info(out).warm_start_accuracy))
            print(f"done {name}", flush=True)
        mean = {k: statistics.mean(r[k] for r in per_seed) for k in per_seed[0]}
        rows.append({"lr": lr, "layers": layers, "task": task, "algo": algo, "replay": replay, **mean})
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "sweep.csv", index=False)
    print(f"\n{args.grid} grid, {len(grid['seeds'])} seeds, {grid['steps']} steps, bf16 rollouts, fp32 trainer, "
          f"{args.threads} threads; means over seeds\n")
    print("| " + " | ".join(table.columns) + " |\n|" + "---|" * len(table.columns))
    for row in table.itertuples(index=False):
        print("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
