"""Seconds per RL step and per-step routing change (``routing/old_new/changed``) of the default embedded policy and
its fine-grained variant (and the dense control) on configs/fine-grained.yaml's long-response task.

    .venv/bin/python scripts/fine_grained_bench.py [--models embedded embedded:fine embedded:dense] [--steps 5]
        [--seeds 0] [--prompts 2] [--threads 2] [--warm-start] [--out runs/fine-grained-bench]

Each model runs configs/fine-grained.yaml at the config's default lr with only the model, seed, steps, prompts per
step, thread count and output folder changed. Two regimes:

- default (untrained): no warm start and the reward below (the parity of the response's length), so an untrained
  policy's groups have unequal rewards and every step has a gradient;
- ``--warm-start``: the config as shipped (supervised warm start to its target accuracy, cached in --cache, then
  the task's own reward). Steps whose every group had equal rewards carry no gradient; they are counted and left
  out of the routing-change mean (the weights did not move).

This measures the step's cost and how far one step's updates move the routes, not learning. docs/benchmarks.md
records its output. Step times exclude the warm start (built before step 1).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from moestab.configs import load_yaml
from moestab.metrics import keys
from moestab.run_folder.reader import load_metrics
from moestab.train import TrainConfig, train

CHANGED = keys.ROUTING_CHANGED.format(pair="old_new")  # routing/old_new/changed
CONFIG = Path(__file__).resolve().parents[1] / "configs" / "fine-grained.yaml"


def length_parity(prompt: str, completion: str, answer: str) -> float:
    """1 for an odd-length response: varies within a group of an untrained policy's samples."""
    return float(len(completion) % 2)


def run(model: str, seed: int, args: argparse.Namespace) -> dict:
    """One short run: its step times, per-step routing change on steps with a gradient, and zero-gradient steps."""
    values = {**load_yaml(CONFIG), "model": model, "seed": seed, "steps": args.steps,
              "prompts_per_step": args.prompts, "threads": args.threads, "max_zero_advantage_steps": 0,
              "eval_every": 10**6, "eval_size": 8, "save_every": 10**6, "progress": False, "overwrite": True,
              "cache_dir": str(Path(args.cache).resolve()),
              "out": str(Path(args.out) / f"{model.replace(':', '-')}-seed{seed}")}
    if not args.warm_start:
        values["warm_start_max_steps"] = 0
        values["task"] = f"{values['task']},reward={Path(__file__).resolve()}:length_parity"
    result = train(TrainConfig(**values), log=lambda s: None)
    metrics = load_metrics(result.run_dir)
    moved = metrics[metrics[keys.ADVANTAGE_NONZERO] > 0]
    return {"seconds": [float(v) for v in metrics[keys.TIME_STEP]],
            "changed": [float(v) for v in moved[CHANGED]] if CHANGED in moved else [0.0] * len(moved),
            "flat_steps": int(len(metrics) - len(moved))}


def mean_sd(values: list[float]) -> str:
    if not values:
        return "n/a"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4g} +- {sd:.2g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["embedded", "embedded:fine", "embedded:dense"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step (x group size 8)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warm-start", action="store_true", help="the config as shipped: warm start, task reward")
    parser.add_argument("--cache", default="runs/fine-grained-bench/cache", help="warm-start cache folder")
    parser.add_argument("--out", default="runs/fine-grained-bench")
    args = parser.parse_args()
    regime = "warm start, task reward" if args.warm_start else "no warm start, length-parity reward"
    print(f"config {CONFIG.name} ({regime}), {args.steps} steps, {args.prompts} prompts x 8, "
          f"{args.threads} threads, seeds {args.seeds}")
    print("| model | seed | s / step (mean +- sd over steps) | `routing/old_new/changed` per step with a gradient "
          "(mean +- sd over steps) | steps without gradient |\n|---|---:|---:|---:|---:|", flush=True)
    for model in args.models:
        seed_means: list[float] = []
        seed_seconds: list[float] = []
        for seed in args.seeds:
            row = run(model, seed, args)
            print(f"| `{model}` | {seed} | {mean_sd(row['seconds'])} | {mean_sd(row['changed'])} | "
                  f"{row['flat_steps']} |", flush=True)
            seed_seconds.append(statistics.mean(row["seconds"]))
            if row["changed"]:
                seed_means.append(statistics.mean(row["changed"]))
        print(f"| `{model}` | all (mean +- sd over seeds) | {mean_sd(seed_seconds)} | {mean_sd(seed_means)} | |",
              flush=True)


if __name__ == "__main__":
    main()
