"""Seconds per RL step and per-step routing change (``routing/old_new/changed``) of the default embedded policy and
its fine-grained variant (and the dense control) on configs/fine-grained.yaml's long-response task.

    .venv/bin/python scripts/fine_grained_bench.py [--models embedded embedded:fine embedded:dense] [--steps 5]
        [--seeds 0] [--prompts 2] [--threads 2] [--out runs/fine-grained-bench]

Untuned, at the config's default lr: each model runs configs/fine-grained.yaml with only the model, seed, steps,
prompts per step, thread count and output folder changed, and with no warm start and the reward below (the parity of
the response's length), so an untrained policy's groups have unequal rewards and every step has a gradient: this
measures the step's cost and how far one step's updates move the routes, not learning. docs/benchmarks.md records
its output. The first step includes nothing extra (the untrained base is built before step 1).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from moestab.configs import load_yaml
from moestab.metrics import keys
from moestab.records.reader import load_metrics
from moestab.train import TrainConfig, train

CHANGED = keys.ROUTING_CHANGED.format(pair="old_new")  # routing/old_new/changed
CONFIG = Path(__file__).resolve().parents[1] / "configs" / "fine-grained.yaml"


def length_parity(prompt: str, completion: str, answer: str) -> float:
    """1 for an odd-length response: varies within a group of an untrained policy's samples."""
    return float(len(completion) % 2)


def run(model: str, seed: int, args: argparse.Namespace, cache: Path) -> tuple[float, float]:
    """(mean seconds per step, mean routing/old_new/changed) of one short run."""
    values = {**load_yaml(CONFIG), "model": model, "seed": seed, "steps": args.steps,
              "prompts_per_step": args.prompts, "threads": args.threads, "warm_start_max_steps": 0,
              "max_zero_advantage_steps": 0, "eval_every": 10**6, "eval_size": 8, "save_every": 10**6,
              "progress": False, "overwrite": True, "cache_dir": str(cache),
              "out": str(Path(args.out) / f"{model.replace(':', '-')}-seed{seed}")}
    values["task"] = f"{values['task']},reward={Path(__file__).resolve()}:length_parity"
    result = train(TrainConfig(**values), log=lambda s: None)
    metrics = load_metrics(result.run_dir)
    return float(metrics[keys.TIME_STEP].mean()), float(metrics[CHANGED].mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["embedded", "embedded:fine", "embedded:dense"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step (x group size 8)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="runs/fine-grained-bench")
    args = parser.parse_args()
    print(f"config {CONFIG.name}, {args.steps} steps, {args.prompts} prompts x 8, {args.threads} threads, "
          f"seeds {args.seeds}")
    print("| model | s / step | routing/old_new/changed per step |\n|---|---:|---:|")
    with tempfile.TemporaryDirectory() as cache:
        for model in args.models:
            rows = [run(model, seed, args, Path(cache)) for seed in args.seeds]
            seconds = statistics.mean(r[0] for r in rows)
            changed = statistics.mean(r[1] for r in rows)
            print(f"| `{model}` | {seconds:.2f} | {changed:.4f} |", flush=True)


if __name__ == "__main__":
    main()
