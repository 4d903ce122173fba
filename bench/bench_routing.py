"""Forward time with RoutingRecorder / RoutingReplay against a plain forward, as ratios.

Each context is built per forward, as a user of the library would; by default it first checks every router
against its family's adapter (moestab.routing.verify); the ``checked`` modes skip that, as the trainer does after
checking the model once at load. Modes are interleaved round by round in one process, in a rotating order (this
machine is noisy), and each ratio is median(mode) / median(plain), for wall time and for process CPU time (steadier
when other jobs share the cores). Usage: python bench/bench_routing.py [--rounds 15] [--threads 2]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from contextlib import nullcontext
from functools import partial

import torch
from transformers import AutoModelForCausalLM

from moestab.models import EmbeddedModelSpec, build_embedded_policy, tiny_config
from moestab.routing import RoutingRecorder, RoutingReplay


def models():
    embedded, tokenizer = build_embedded_policy(EmbeddedModelSpec())
    yield "embedded (4L, 8E, top-2, h128), batch 16x64", embedded, (16, 64), len(tokenizer)
    torch.manual_seed(0)
    large = AutoModelForCausalLM.from_config(
        tiny_config("qwen3_moe", vocab_size=1024, hidden_size=512, num_moe_layers=8, num_experts=32, top_k=4)
    )
    yield "qwen3_moe h512, 8L, 32E, top-4, batch 16x256", large, (16, 256), 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, {platform.processor() or platform.machine()}")
    print("| model / batch | clock | plain (ms) | recorder (x) | recorder, no stats (x) | replay (x) | "
          "recorder, model checked (x) | replay, model checked (x) |")
    print("|---|---|---|---|---|---|---|---|")
    for label, model, (batch, seq), vocab in models():
        model.eval()
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(4, vocab, (batch, seq), generator=g)
        mask = torch.ones_like(ids)
        mask[: batch // 2, : seq // 4] = 0  # left padding on half the rows
        with torch.no_grad(), RoutingRecorder(model) as rec:
            model(input_ids=ids, attention_mask=mask)
        routes = rec.routes
        modes = {
            "plain": nullcontext,
            "recorder": partial(RoutingRecorder, model),
            "recorder_nostats": partial(RoutingRecorder, model, margin=False, entropy=False),
            "replay": partial(RoutingReplay, model, routes),
            # The trainer's path: the model's routers were checked against their adapters once, at load.
            "recorder_checked": partial(RoutingRecorder, model, verify=False),
            "replay_checked": partial(RoutingReplay, model, routes, verify=False),
        }
        names = list(modes)
        wall: dict[str, list[float]] = {m: [] for m in modes}
        cpu: dict[str, list[float]] = {m: [] for m in modes}
        with torch.no_grad():
            for _ in range(2):  # warm-up
                model(input_ids=ids, attention_mask=mask)
            for r in range(args.rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    w0, c0 = time.perf_counter(), time.process_time()
                    with modes[name]():
                        model(input_ids=ids, attention_mask=mask)
                    wall[name].append(time.perf_counter() - w0)
                    cpu[name].append(time.process_time() - c0)
        for clock, times in (("wall", wall), ("cpu", cpu)):
            med = {m: statistics.median(v) for m, v in times.items()}
            print(
                f"| {label} | {clock} | {med['plain'] * 1e3:.1f} | {med['recorder'] / med['plain']:.3f} | "
                f"{med['recorder_nostats'] / med['plain']:.3f} | {med['replay'] / med['plain']:.3f} | "
                f"{med['recorder_checked'] / med['plain']:.3f} | {med['replay_checked'] / med['plain']:.3f} |"
            )


if __name__ == "__main__":
    main()
