"""Three rollout->trainer gaps on the same tokens: free routing, forced experts (R3), forced experts and gates (TRR).

For each seed: the warm-started base of the default job (``moestab train``'s, from the cache), a rollout batch
sampled by a bf16 rollout engine that records its experts and gate weights, then the fp32 trainer's log-probs
of exactly those tokens three ways -- routing freely (no replay), replaying the rollout's experts with gates
recomputed by the trainer's router (R3), and replaying experts and gates as given (TRR, router frozen) -- each
compared with the rollout's log-probs (k1, k3, F(2), docs/metrics.md) and, for free routing, the routers flipped.

    .venv/bin/python scripts/replay_gaps.py [--seeds 0 1 2] [--prompts 256] [--task arithmetic] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch

from moestab.experiments.gaps import replay_gaps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--prompts", type=int, default=256, help="sampled completions per seed")
    parser.add_argument("--task", default="arithmetic", help="task spec of the default job's base policy")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache-dir", default=None, help="warm-start cache (default: moestab's)")
    args = parser.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    rows = [replay_gaps(seed, args.task, args.prompts, args.cache_dir) for seed in args.seeds]
    print(f"task {args.task}, {args.prompts} bf16-sampled completions per seed, fp32 trainer, seeds "
          f"{', '.join(map(str, args.seeds))}, {args.threads} threads; mean +- sd over seeds\n")

    def cell(key: str, fmt: str) -> str:
        values = np.array([r[key] for r in rows])
        sd = statistics.stdev(values) if len(values) > 1 else float("nan")
        return f"{fmt.format(values.mean())} +- {fmt.format(sd)}"

    # The three gaps side by side (README's table), then every quantity measured.
    print(f"| rollout (bf16) vs fp32 trainer, mean +- sd over seeds {', '.join(map(str, args.seeds))} | k3 | "
          "routers flipped | tokens with >= 1 flipped layer |\n|---|---|---|---|")
    print(f"| free routing | {cell('free routing: k3', '{:.2e}')} | "
          f"{cell('free routing: routers flipped %', '{:.3f}%')} | "
          f"{cell('free routing: tokens with >= 1 flipped layer %', '{:.2f}%')} |")
    for label, mode in (("R3: forced experts, gates from the trainer's router", "R3: forced experts"),
                        ("TRR: forced experts and gates", "TRR: forced experts and gates")):
        print(f"| {label} | {cell(f'{mode}: k3', '{:.2e}')} | 0 (replayed) | 0 (replayed) |")
    print("\n| quantity | mean +- sd |\n|---|---|")
    for key in rows[0]:
        print(f"| {key} | {cell(key, '{:.3g}' if '%' in key or ':' not in key else '{:.2e}')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
