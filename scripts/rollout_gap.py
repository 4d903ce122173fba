"""The rollout->trainer gap with a lower-precision rollout engine, without replay and with R3.

Runs the default job (GSPO, embedded policy, arithmetic) with ``--rollout-dtype`` (bfloat16 by default;
the trainer stays float32) and ``--routing-replay off`` and ``rollout`` over several seeds, and prints
the step-mean rollout->trainer metrics on both sides of pi_old as mean +- sd over seeds:

    .venv/bin/python scripts/rollout_gap.py [--seeds 0 1 2] [--steps 60] [--threads 2] [--out runs/gap]

``rollout_old`` is what the ratio sees (R3 replays the rollout's routes, so only precision is left);
``rollout_old_free`` is the gap routing creates. docs/metrics.md defines every key.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from moestab.metrics import keys
from moestab.run_folder.reader import load_metrics, read_run_info
from moestab.train import TrainConfig, train

KEYS = (
    ("routers flipped, rollout vs pi_old as used", keys.ROUTING_ROUTER_FLIP.format(pair="rollout_old"), 100, "{:.3f}%"),
    ("tokens with >= 1 flipped layer, as used", keys.ROUTING_TOKEN_FLIP.format(pair="rollout_old"), 100, "{:.2f}%"),
    ("k3, rollout vs pi_old as used", keys.MISMATCH_K3.format(pair="rollout_old"), 1, "{:.2e}"),
    ("routers flipped, rollout vs free pi_old", keys.ROUTING_ROUTER_FLIP.format(pair="rollout_old_free"), 100,
     "{:.3f}%"),
    ("tokens with >= 1 flipped layer, free", keys.ROUTING_TOKEN_FLIP.format(pair="rollout_old_free"), 100,
     "{:.2f}%"),
    ("k3, rollout vs free pi_old", keys.MISMATCH_K3.format(pair="rollout_old_free"), 1, "{:.2e}"),
    ("eval accuracy at the end", None, 100, "{:.1f}%"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rollout-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--out", type=Path, default=Path("runs/gap"))
    parser.add_argument("--cache-dir", default=None, help="warm-start cache (default: moestab's)")
    args = parser.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    import torch

    torch.set_num_threads(args.threads)  # what `moestab train --threads` does; train() leaves it to its caller

    values: dict[tuple[str, str], list[float]] = {}
    for replay in ("off", "rollout"):
        for seed in args.seeds:
            out = args.out / f"gspo-{replay}-{args.rollout_dtype}-seed{seed}"
            if not (out / "run.json").is_file():
                train(TrainConfig(routing_replay=replay, seed=seed, steps=args.steps, out=str(out),
                                  rollout_dtype=args.rollout_dtype, threads=args.threads, progress=False,
                                  measure_every=1,
                                  cache_dir=args.cache_dir), log=lambda s: None)
            metrics, info = load_metrics(out), read_run_info(out)
            for label, key, scale, _ in KEYS:
                value = info.final_accuracy if key is None else metrics[key].mean()
                values.setdefault((label, replay), []).append(scale * float(value))
            print(f"{replay} seed {seed}: {out}", flush=True)

    print(f"\nfloat32 trainer, {args.rollout_dtype} rollout engine; GSPO, {args.steps} steps; seeds "
          f"{', '.join(map(str, args.seeds))}; {args.threads} torch threads; step means, mean +- sd over seeds\n")
    print("| quantity | replay off | R3 (rollout) |\n|---|---|---|")
    for label, _, _, fmt in KEYS:
        cells = []
        for replay in ("off", "rollout"):
            xs = values[(label, replay)]
            sd = statistics.stdev(xs) if len(xs) > 1 else float("nan")
            cells.append(f"{fmt.format(statistics.mean(xs))} +- {fmt.format(sd)}")
        print(f"| {label} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
