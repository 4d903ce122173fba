"""The rollout->trainer gap with a lower-precision rollout engine, without replay and with R3.

Runs the default job (GSPO, embedded policy, arithmetic) with ``--rollout-engine`` (the Hugging Face engine by
default, or vLLM) sampling in ``--rollout-dtype`` (bfloat16 by default; the trainer stays float32) and
``--routing-replay off`` and ``rollout`` over several seeds, and prints the step-mean rollout->trainer metrics on both
sides of pi_old as mean +- sd over seeds, then per MoE layer the share of activated experts that differ rollout ->
trainer (free routing) and the largest per-token log-prob gap of each step (both sides of pi_old, from the token
tables):

    .venv/bin/python scripts/rollout_gap.py [--seeds 0 1 2] [--steps 60] [--threads 2] [--out runs/gap]
    .venv-vllm/bin/python scripts/rollout_gap.py --rollout-engine vllm [--rollout-dtype float32] ...

``rollout_old`` is what the ratio sees (R3 replays the rollout's routes, so only precision is left);
``rollout_old_free`` is the gap routing creates. docs/metrics.md defines every key. Finished runs are reused.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
import pandas as pd

from moestab.metrics import keys
from moestab.run_folder import schema
from moestab.run_folder.reader import load_metrics, load_tokens, read_run_info
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


MAX_GAPS = (("largest per-token log-prob gap of a step, rollout vs pi_old as used", schema.COL_LOGP_OLD),
            ("largest per-token log-prob gap of a step, rollout vs free pi_old", schema.COL_LOGP_OLD_FREE))


def step_max_gap(run: Path, trainer_column: str) -> float:
    """The step mean of each step's largest ``|logp_trainer - logp_rollout|`` over its recorded response tokens."""
    tokens = load_tokens(run, columns=[schema.COL_STEP, schema.COL_LOGP_ROLLOUT, trainer_column])
    gap = (tokens[trainer_column] - tokens[schema.COL_LOGP_ROLLOUT]).abs()
    return float(gap.groupby(tokens[schema.COL_STEP]).max().mean())


def layer_changed(metrics: pd.DataFrame, pair: str) -> np.ndarray:
    """The step mean of ``routing/{pair}/changed_by_layer`` ``[layers]``."""
    rows = metrics[keys.ROUTING_CHANGED_BY_LAYER.format(pair=pair)].dropna()
    return np.mean(np.stack([np.asarray(r, float) for r in rows]), axis=0)


def mean_sd(xs: list[float], fmt: str) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else float("nan")
    return f"{fmt.format(statistics.mean(xs))} +- {fmt.format(sd)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rollout-engine", default="hf", choices=["hf", "vllm"])
    parser.add_argument("--rollout-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--out", type=Path, default=Path("runs/gap"))
    parser.add_argument("--cache-dir", default=None, help="warm-start cache (default: moestab's)")
    args = parser.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    import torch

    torch.set_num_threads(args.threads)  # what `moestab train --threads` does; train() leaves it to its caller

    engine = "" if args.rollout_engine == "hf" else f"{args.rollout_engine}-"  # hf runs keep their old folders
    values: dict[tuple[str, str], list[float]] = {}
    by_layer: dict[str, list[np.ndarray]] = {}
    for replay in ("off", "rollout"):
        for seed in args.seeds:
            out = args.out / f"{engine}gspo-{replay}-{args.rollout_dtype}-seed{seed}"
            if not (out / "run.json").is_file() or read_run_info(out).status != "finished":
                train(TrainConfig(routing_replay=replay, seed=seed, steps=args.steps, out=str(out),
                                  rollout_engine=args.rollout_engine, rollout_dtype=args.rollout_dtype,
                                  threads=args.threads, progress=False, measure_every=1,
                                  cache_dir=args.cache_dir), log=lambda s: None)
            metrics, info = load_metrics(out), read_run_info(out)
            for label, key, scale, _ in KEYS:
                value = info.final_accuracy if key is None else metrics[key].mean()
                values.setdefault((label, replay), []).append(scale * float(value))
            for label, column in MAX_GAPS:
                values.setdefault((label, replay), []).append(step_max_gap(out, column))
            by_layer.setdefault(replay, []).append(100 * layer_changed(metrics, "rollout_old_free"))
            print(f"{replay} seed {seed}: {out}", flush=True)

    print(f"\nfloat32 trainer, {args.rollout_engine} rollout engine in {args.rollout_dtype}; GSPO, {args.steps} steps; "
          f"seeds {', '.join(map(str, args.seeds))}; {args.threads} torch threads; step means, mean +- sd over seeds\n")
    print("| quantity | replay off | R3 (rollout) |\n|---|---|---|")
    labels = dict.fromkeys(label for label, _ in values)
    for label in labels:
        fmt = next((f for name, _, _, f in KEYS if name == label), "{:.2e}")
        print(f"| {label} | {' | '.join(mean_sd(values[(label, r)], fmt) for r in ('off', 'rollout'))} |")
    print("\n| MoE layer: activated experts that differ, rollout vs free pi_old | replay off | R3 (rollout) |")
    print("|---|---|---|")
    for layer in range(len(by_layer["off"][0])):
        cells = [mean_sd([float(x[layer]) for x in by_layer[r]], "{:.3f}%") for r in ("off", "rollout")]
        print(f"| {layer} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
