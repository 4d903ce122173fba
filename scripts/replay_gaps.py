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
import random
import statistics

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from moestab.metrics.mismatch import mismatch_stats
from moestab.metrics.routes import intersection_sizes, route_change
from moestab.tasks import task_from_spec
from moestab.train import TrainConfig
from moestab.train.forward import chunked_policy_forward, response_routes
from moestab.train.loop import base_policy_path
from moestab.train.rollout import HFRolloutEngine

SIDES = (("free routing", {}), ("R3: forced experts", {"replay": True}),
         ("TRR: forced experts and gates", {"replay": True, "force_gates": True}))


def gaps(seed: int, task_spec: str, prompts: int, cache_dir: str | None) -> dict[str, float]:
    config = TrainConfig(task=task_spec, seed=seed, cache_dir=cache_dir)
    task = task_from_spec(config.task)
    path, _ = base_policy_path(config, task, log=lambda s: None)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = HFRolloutEngine(model, tokenizer, dtype=torch.bfloat16, gates=True)
    torch.manual_seed(seed)
    texts = [ex.prompt for ex in task.sample(prompts, random.Random(seed))]
    batch = engine.generate(texts, max_new_tokens=task.max_answer_chars + 1, temperature=1.0)
    mask = batch.response_mask  # [B, T]
    chunks = list(torch.arange(batch.batch_size).split(64))
    out: dict[str, float] = {"response tokens": float(mask.sum())}
    for name, how in SIDES:  # no grad: the three forwards are measurements
        with torch.no_grad():
            fwd = chunked_policy_forward(model, batch, chunks, temperature=1.0, replay=batch.routes if how else None,
                                         force_gates=how.get("force_gates", False), record=not how)
        stats = mismatch_stats(fwd.logp[mask].numpy(), batch.logp_rollout[mask].numpy())
        out.update({f"{name}: k1": stats["k1"], f"{name}: k3": stats["k3"], f"{name}: F(2)": stats["f2"]})
        if not how:  # the replayed sides use the rollout's experts by construction
            inter = intersection_sizes(response_routes(fwd.routes, batch)[mask].numpy(),
                                       response_routes(batch.routes, batch)[mask].numpy())
            rates = route_change(inter, batch.routes.top_k)
            out["free routing: routers flipped %"] = 100 * float(rates["router_flip"][0])
            out["free routing: tokens with >= 1 flipped layer %"] = 100 * float(rates["token_flip"][0])
    return out


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
    rows = [gaps(seed, args.task, args.prompts, args.cache_dir) for seed in args.seeds]
    print(f"task {args.task}, {args.prompts} bf16-sampled completions per seed, fp32 trainer, seeds "
          f"{', '.join(map(str, args.seeds))}, {args.threads} threads; mean +- sd over seeds\n")
    print("| quantity | mean +- sd |\n|---|---|")
    for key in rows[0]:
        values = np.array([r[key] for r in rows])
        sd = statistics.stdev(values) if len(values) > 1 else float("nan")
        fmt = "{:.3g}" if "%" in key or ":" not in key else "{:.2e}"
        print(f"| {key} | {fmt.format(values.mean())} +- {fmt.format(sd)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
