"""What the collapse watch costs a trainer per step (issue 57): ``CollapseMonitor.observe`` with the shipped rule,
fed a metrics.jsonl line of a 48-layer run (``experts/load_entropy`` a list of 48), against nothing.

    .venv/bin/python bench/bench_collapse_watch.py --steps 20000 --rounds 5

Prints the median over rounds of the time per step (µs) and, for scale, that time as a share of a 0.4 s step (the
default job's step on this project's CPU, docs/benchmarks.md "Training step").
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from moestab.metrics import keys
from moestab.metrics.collapse_warning import DEFAULT_RULE, SIGNALS
from moestab.recording.collapse_watch import CollapseMonitor


def lines(steps: int, seed: int = 0) -> list[tuple[int, dict]]:
    rng = random.Random(seed)
    out = []
    for step in range(1, steps + 1):
        line = {keys.STEP: step}
        for s in SIGNALS.values():
            line[s.key] = [rng.random() for _ in range(48)] if s.key == keys.EXPERTS_LOAD_ENTROPY else rng.random()
        out.append((step, line))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    data = lines(args.steps)
    per_step = []
    for _ in range(args.rounds):
        monitor = CollapseMonitor(rule=DEFAULT_RULE)
        t0 = time.perf_counter()
        for step, line in data:
            monitor.observe(step, line)
        per_step.append((time.perf_counter() - t0) / args.steps)
    median = statistics.median(per_step)
    print(f"collapse watch, rule {DEFAULT_RULE.name} ({len(DEFAULT_RULE.signals)} signals): "
          f"{median * 1e6:.1f} µs a step (median of {args.rounds} rounds of {args.steps} steps; "
          f"min {min(per_step) * 1e6:.1f}, max {max(per_step) * 1e6:.1f}); {median / 0.4:.1e} of a 0.4 s step")


if __name__ == "__main__":
    main()
