"""Forward time with RoutingRecorder / RoutingReplay against a plain forward, as ratios.

Two tables. ``forward``: a left-padded batch on the embedded model and on a larger qwen3_moe, with the recorder and
replay in several modes. Each context is built per forward, as a user of the library would; by default it first
checks every router against its family's adapter (moestab.routing.verify); the ``checked`` modes skip that, as the
trainer does after checking the model once at load.

``trainer``: the recorder where the trainer puts it, on the embedded model with the ``arithmetic`` task (what
bench/bench_train.py times inside a step): a no-grad forward of 32 rollout sequences (prompt + 4 sampled tokens,
left-padded) with the recorder ``policy_forward`` builds (routes only, no adapter check; and, apart, one such recorder
built once and entered per forward: what finding the routers costs), and ``generate()`` of
16 prompts x 8 samples, 4 new tokens, with the recorder the rollout engine builds (routes only, no check) and with
the library's default check; routes are read after each, as the callers do.

Modes are interleaved round by round in one process, in a rotating order (this machine is noisy), and each ratio
is median(mode) / median(plain), for wall time and for process CPU time (steadier when other jobs share the cores);
the ``trainer`` table adds the p25-p75 of the per-round ratios (mode / plain of the same round).

Usage: python bench/bench_routing.py [--rounds 15] [--threads 2] [--tables forward,trainer] [--skip-large]
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial

import torch
from transformers import AutoModelForCausalLM

from moestab.models import EmbeddedModelSpec, build_embedded_policy, tiny_config
from moestab.routing import RoutingRecorder, RoutingReplay
from moestab.tasks import task_from_spec


def models(skip_large: bool):
    embedded, tokenizer = build_embedded_policy(EmbeddedModelSpec())
    yield "embedded (4L, 8E, top-2, h128), batch 16x64", embedded, (16, 64), len(tokenizer)
    if skip_large:
        return
    torch.manual_seed(0)
    large = AutoModelForCausalLM.from_config(
        tiny_config("qwen3_moe", vocab_size=1024, hidden_size=512, num_moe_layers=8, num_experts=32, top_k=4)
    )
    yield "qwen3_moe h512, 8L, 32E, top-4, batch 16x256", large, (16, 256), 1024


def interleave(modes: dict[str, Callable[[], object]], rounds: int, warmup: int = 2) -> tuple[dict, dict]:
    """Wall and process CPU seconds of each mode over ``rounds`` rounds, the order rotated each round."""
    names = list(modes)
    wall: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(warmup + rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            w0, c0 = time.perf_counter(), time.process_time()
            modes[name]()
            if r >= warmup:
                wall[name].append(time.perf_counter() - w0)
                cpu[name].append(time.process_time() - c0)
    return wall, cpu


def paired_ratio(mine: list[float], plain: list[float]) -> tuple[float, float, float]:
    """median(mine) / median(plain), and the p25 and p75 of the per-round ratios (mine / plain of the same round)."""
    rounds = [m / p for m, p in zip(mine, plain, strict=True)]
    q1, _, q3 = statistics.quantiles(rounds, n=4) if len(rounds) > 1 else (rounds[0],) * 3
    return statistics.median(mine) / statistics.median(plain), q1, q3


def forward_table(rounds: int, skip_large: bool) -> None:
    print("| model / batch | clock | plain (ms) | recorder (x) | recorder, no stats (x) | replay (x) | "
          "recorder, model checked (x) | replay, model checked (x) |")
    print("|---|---|---|---|---|---|---|---|")
    for label, model, (batch, seq), vocab in models(skip_large):
        model.eval()
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(4, vocab, (batch, seq), generator=g)
        mask = torch.ones_like(ids)
        mask[: batch // 2, : seq // 4] = 0  # left padding on half the rows
        with torch.no_grad(), RoutingRecorder(model) as rec:
            model(input_ids=ids, attention_mask=mask)
        routes = rec.routes
        contexts = {
            "plain": nullcontext,
            "recorder": partial(RoutingRecorder, model),
            "recorder_nostats": partial(RoutingRecorder, model, margin=False, entropy=False),
            "replay": partial(RoutingReplay, model, routes),
            # The trainer's path: the model's routers were checked against their adapters once, at load.
            "recorder_checked": partial(RoutingRecorder, model, verify=False),
            "replay_checked": partial(RoutingReplay, model, routes, verify=False),
        }
        call = partial(model, input_ids=ids, attention_mask=mask)
        wall, cpu = interleave({name: partial(_run, call, c) for name, c in contexts.items()}, rounds)
        for clock, times in (("wall", wall), ("cpu", cpu)):
            med = {m: statistics.median(v) for m, v in times.items()}
            print(
                f"| {label} | {clock} | {med['plain'] * 1e3:.1f} | {med['recorder'] / med['plain']:.3f} | "
                f"{med['recorder_nostats'] / med['plain']:.3f} | {med['replay'] / med['plain']:.3f} | "
                f"{med['recorder_checked'] / med['plain']:.3f} | {med['replay_checked'] / med['plain']:.3f} |"
            )


def _run(call: Callable[[], object], context: Callable[[], object]) -> None:
    with torch.no_grad(), context():
        call()


def trainer_table(rounds: int) -> None:
    model, tokenizer = build_embedded_policy(EmbeddedModelSpec())
    model.eval()
    task = task_from_spec("arithmetic")
    prompts = [e.prompt for e in task.sample(16, random.Random(0)) for _ in range(8)]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    new_tokens = task.max_answer_chars + 1  # answer + EOS, as moestab train sets it
    generate = partial(model.generate, input_ids=enc.input_ids, attention_mask=enc.attention_mask, do_sample=True,
                       temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                       output_logits=True, return_dict_in_generate=True)
    torch.manual_seed(0)
    with torch.no_grad():
        sequences = generate().sequences  # [128, P + T]
    ids = sequences[:32, :-1]  # [32, L] the trainer's input: the last sampled token is never fed
    mask = torch.cat([enc.attention_mask[:32], torch.ones(32, ids.shape[1] - enc.input_ids.shape[1],
                                                         dtype=torch.long)], dim=1)  # [32, L]
    positions = (mask.cumsum(-1) - 1).clamp_min(0)  # [32, L]

    reused = RoutingRecorder(model, margin=False, entropy=False, verify=False)

    def forward(record: bool, recorder: RoutingRecorder | None = None) -> None:
        if recorder is None:
            recorder = RoutingRecorder(model, margin=False, entropy=False, verify=False) if record else nullcontext()
        with torch.no_grad(), recorder:
            model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
        if record:
            recorder.routes  # noqa: B018 -- policy_forward reads them

    def sample(record: bool, verify: bool = False) -> None:
        torch.manual_seed(1)  # the same samples in every mode
        recorder = RoutingRecorder(model, margin=False, entropy=False, verify=verify) if record else nullcontext()
        with torch.no_grad(), recorder:
            generate()
        if record:
            recorder.routes  # noqa: B018 -- stitching the decode steps is part of recording

    cases = (
        (f"no-grad forward, 32 x {ids.shape[1]} tokens (policy_forward's recorder)",
         {"plain": partial(forward, False), "recorder": partial(forward, True),
          # What finding the routers costs each time: one recorder built once and entered per forward.
          "recorder built once": partial(forward, True, reused)}),
        (f"generate, {len(prompts)} x {enc.input_ids.shape[1]} prompt + {new_tokens} new tokens",
         {"plain": partial(sample, False), "recorder": partial(sample, True),
          "recorder, routers checked": partial(sample, True, verify=True)}),
    )
    print("| embedded model (4L, 8E, top-2, h128) | mode | clock | plain (ms) | mode (ms) | ratio (x) | "
          "per-round ratio p25-p75 |")
    print("|---|---|---|---|---|---|---|")
    for label, modes in cases:
        wall, cpu = interleave(modes, rounds)
        for name in list(modes)[1:]:
            for clock, times in (("wall", wall), ("cpu", cpu)):
                plain, mine = times["plain"], times[name]
                ratio, q1, q3 = paired_ratio(mine, plain)
                print(f"| {label} | {name} | {clock} | {statistics.median(plain) * 1e3:.2f} | "
                      f"{statistics.median(mine) * 1e3:.2f} | {ratio:.3f} | {q1:.3f}-{q3:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tables", default="forward,trainer", help="comma-separated: forward, trainer")
    parser.add_argument("--skip-large", action="store_true", help="forward table: embedded model only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tables = set(args.tables.split(","))
    print(f"torch {torch.__version__}, {args.threads} threads, {platform.processor() or platform.machine()}, "
          f"{args.rounds} rounds")
    if "forward" in tables:
        forward_table(args.rounds, args.skip_large)
    if "trainer" in tables:
        print()
        trainer_table(args.rounds)


if __name__ == "__main__":
    main()
