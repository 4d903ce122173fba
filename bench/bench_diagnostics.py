"""Benchmark: the diagnostics call for any trainer (``moestab.recording.diagnostics.route_diagnostics``) at
Qwen3-30B-A3B shape, in router decisions per second (decision = token x layer).

Default: 1,000,000 response tokens x 48 MoE layers x top-8 of 128 experts = 48M decisions per side, int16 routes
(what the importers produce), float32 log-probs of the same tokens. Measured, best of ``--rounds``:

1. ``route_diagnostics(rollout, trainer, logp_rollout=..., logp_trainer=...)``: routing change (overall, per layer,
   tokens with >= 1 flipped layer) and the log-prob mismatch (k1, k3, F(2), |d|, d^2, F(5), verl's probability
   differences), on 1 and 2 threads;
2. beside it, the kernel alone (``intersection_sizes``), the floor of any routing comparison;
3. the optional parts apart: ``num_experts=`` (the trainer's load counted from its routes, for ``experts/max_vio``)
   and an int32 payload (vLLM's / SGLang's width) converted on the way in;
4. with ``--parts``, on one thread, what the default call is made of: the repeated-expert check of each side
   (``repeated_experts``) and, inside it, the copy of a side's ids to slot-major uint8 alone; the comparison
   (``route_change_of``: the kernel, the counts and the per-token changes), the kernel alone and the per-token
   changes' share; the route-integrity checks given the comparison; CPU ns a decision.

Pairs (``moestab.analysis.synthetic.synthetic_routes``): *R3-level* (10% of decisions swap their k-th expert: R3's
"~10% of routers") and *GSPO-level* (80% swap: 10% of activated experts). Target (docs/benchmarks.md): >= 100M
decisions/s on the project's CPU machine. Run:

    .venv/bin/python bench/bench_diagnostics.py [--tokens 1000000] [--rounds 3] [--threads 1 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

CASES = (("R3-level", 0.1), ("GSPO-level", 0.8))


def best(fn, rounds: int) -> tuple[float, float]:
    """Best wall and CPU seconds of ``rounds`` calls of ``fn``."""
    wall, cpu = [], []
    for _ in range(rounds):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return min(wall), min(cpu)


def time_case(a: np.ndarray, b: np.ndarray, logp_rollout: np.ndarray, logp_trainer: np.ndarray,
              args: argparse.Namespace) -> list[tuple[str, int, float, float]]:
    """(what, threads, wall s, CPU s) of each timed call on the route pair ``a``, ``b``."""
    from moestab.metrics.routes import intersection_sizes
    from moestab.recording.diagnostics import route_diagnostics

    def full(threads: int) -> None:
        route_diagnostics(a, b, logp_rollout=logp_rollout, logp_trainer=logp_trainer, threads=threads)

    def kernel(threads: int) -> None:
        intersection_sizes(a, b, threads=threads)

    timed = []
    for threads in args.threads:
        timed.append(("`route_diagnostics` (routes + log-probs)", threads,
                      *best(lambda th=threads: full(th), args.rounds)))
        timed.append(("`intersection_sizes` (kernel alone)", threads,
                      *best(lambda th=threads: kernel(th), args.rounds)))
    if not args.skip_extras:
        wide = a.astype(np.int32), b.astype(np.int32)
        timed.append(("`route_diagnostics`, int32 routes in", 1,
                      *best(lambda: route_diagnostics(*wide, threads=1), args.rounds)))
        timed.append(("`route_diagnostics`, + `num_experts` (load counted)", 1,
                      *best(lambda: route_diagnostics(a, b, num_experts=args.experts, threads=1), 1)))
    return timed


def time_parts(a: np.ndarray, b: np.ndarray, rounds: int) -> list[tuple[str, float]]:
    """(part, CPU seconds) of each part of the default ``route_diagnostics`` call on one thread (``--parts``)."""
    from moestab.metrics.integrity import route_integrity
    from moestab.metrics.routes import DEFAULT_BLOCK, intersection_sizes, repeated_experts, route_change_of

    k = a.shape[2]
    flat = a.reshape(-1, k)  # [decisions, k]
    a_experts = int(max(a.max(), b.max())) + 1
    changes = route_change_of(a, b, threads=1, by_token=True)

    def slot_major() -> None:  # block by block, in cache, as repeated_experts copies them
        for start in range(0, len(flat), DEFAULT_BLOCK):
            flat[start:start + DEFAULT_BLOCK].T.astype(np.uint8, order="C")

    parts = [
        ("repeated-expert check, rollout side (`repeated_experts`)", lambda: repeated_experts(a)),
        ("repeated-expert check, trainer side", lambda: repeated_experts(b)),
        ("of which: one side's ids copied slot-major as uint8", slot_major),
        ("comparison and counts (`route_change_of`, per token too)",
         lambda: route_change_of(a, b, threads=1, by_token=True)),
        ("of which: the kernel (`intersection_sizes`)", lambda: intersection_sizes(a, b, threads=1)),
        ("of which: the per-token changes (`by_token`), over the comparison without them",
         lambda: route_change_of(a, b, threads=1, by_token=True), lambda: route_change_of(a, b, threads=1)),
        ("route-integrity checks, given the comparison (`route_integrity`)",
         lambda: route_integrity(a, b, num_experts=a_experts, changes=changes, distinct=True)),
    ]
    out = []
    for what, fn, *without in parts:  # a part given with its call without it: the difference of the two
        cpu = best(fn, rounds)[1]
        out.append((what, cpu - best(without[0], rounds)[1] if without else cpu))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--skip-extras", action="store_true", help="time only the default call and the kernel")
    parser.add_argument("--parts", action="store_true", help="also time the default call's parts on one thread")
    args = parser.parse_args()

    from moestab.analysis.synthetic import synthetic_routes

    decisions = args.tokens * args.layers
    gen = np.random.default_rng(0)
    logp_rollout = (-gen.exponential(0.5, args.tokens)).astype(np.float32)
    # A trainer's log-prob is a log-prob too (route_diagnostics refuses one above 0)
    logp_trainer = np.minimum(logp_rollout + gen.normal(0, 0.02, args.tokens), 0).astype(np.float32)
    print(f"numpy {np.__version__}; {platform.machine()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; {args.tokens} tokens x {args.layers} layers x top-{args.top_k} of "
          f"{args.experts} = {decisions / 1e6:.0f}M decisions; best of {args.rounds}", file=sys.stderr)
    rows = []
    parts = []
    for case, flip in CASES:
        a, b = synthetic_routes(args.tokens, args.layers, args.top_k, args.experts, flip=flip, reorder=0.05)
        timed = time_case(a, b, logp_rollout, logp_trainer, args)
        for what, threads, wall, cpu in timed:
            rows.append((case, what, threads, wall, cpu, decisions / wall / 1e6, decisions / cpu / 1e6))
        if args.parts:
            parts += [(case, what, cpu) for what, cpu in time_parts(a, b, args.rounds)]
        del a, b
    print("| pair | what | threads | wall (s) | CPU (s) | M decisions/s (wall) | M decisions/s (CPU) |")
    print("|---|---|---|---|---|---|---|")
    for case, what, threads, wall, cpu, rate, cpu_rate in rows:
        print(f"| {case} | {what} | {threads} | {wall:.3f} | {cpu:.3f} | {rate:.0f} | {cpu_rate:.0f} |")
    if parts:
        print()
        print("| pair | part (one thread) | CPU ns a decision |")
        print("|---|---|---|")
        for case, what, cpu in parts:
            print(f"| {case} | {what} | {cpu / decisions * 1e9:.2f} |")


if __name__ == "__main__":
    main()
