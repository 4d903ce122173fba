"""Rerun README's default job (`moestab train --routing-replay off`), or the job of a config file, over several
seeds and print its headline numbers as mean +- sd, in the Markdown table README and docs show.

    .venv/bin/python scripts/default_run_stats.py [--seeds 0 1 2] [--threads 2] [--out runs/readme]
    .venv/bin/python scripts/default_run_stats.py --config configs/long.yaml     # docs/tasks.md

Every number in README's "What the default run does" and docs/tasks.md's long-response table comes from
this script's output. The warm-started
base does not depend on the thread count (it is built single-threaded); the RL steps do (CPU float
reductions split by thread), so the count is an argument and is printed with the table.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from moestab.metrics import keys
from moestab.recording.environment import cpu
from moestab.run_folder.reader import load_metrics, read_run_info
from moestab.train import TrainConfig, train

ROWS = (
    # (label, function of (run info, metrics frame) -> value, format)
    ("warm-start steps", lambda info, m: info.warm_start["record"]["steps"], "{:.0f}"),
    ("eval accuracy at the start", lambda info, m: 100 * info.warm_start_accuracy, "{:.1f}%"),
    ("eval accuracy at the end", lambda info, m: 100 * info.final_accuracy, "{:.1f}%"),
    ("mean reward, first 5 steps", lambda info, m: m[keys.REWARD_MEAN].iloc[:5].mean(), "{:.3f}"),
    ("mean reward, last 5 steps", lambda info, m: m[keys.REWARD_MEAN].iloc[-5:].mean(), "{:.3f}"),
    ("sampled response length, tokens (step mean)", lambda info, m: m[keys.RESPONSE_LENGTH_MEAN].mean(), "{:.1f}"),
    ("RL wall time, s (sum of step times)", lambda info, m: m[keys.TIME_STEP].sum(), "{:.0f}"),
    ("routing changed old->new (slots, step mean)",
     lambda info, m: 100 * m[keys.ROUTING_CHANGED.format(pair="old_new")].mean(), "{:.2f}%"),
    ("routers flipped old->new", lambda info, m: 100 * m[keys.ROUTING_ROUTER_FLIP.format(pair="old_new")].mean(),
     "{:.2f}%"),
    ("tokens with >= 1 flipped layer old->new",
     lambda info, m: 100 * m[keys.ROUTING_TOKEN_FLIP.format(pair="old_new")].mean(), "{:.1f}%"),
    *(
        (f"update->old changed, minibatch {i + 1}",
         lambda info, m, i=i: 100 * m[keys.ROUTING_UPDATE_DRIFT].map(lambda v: v[i]).mean(),
         "{:.2f}%")
        for i in range(4)
    ),
    ("GSPO clipped sequences, minibatches 2-4", lambda info, m: 100 * m[keys.CLIP_SEQ_FRAC_LATER].mean(), "{:.1f}%"),
    ("GSPO clipped tokens, minibatches 2-4", lambda info, m: 100 * m[keys.CLIP_TOKEN_FRAC_LATER].mean(), "{:.1f}%"),
    ("rollout->trainer routers flipped (free pi_old)",
     lambda info, m: 100 * m[keys.ROUTING_ROUTER_FLIP.format(pair="rollout_old_free")].mean(), "{:.3f}%"),
    ("rollout->trainer k3 (free pi_old)", lambda info, m: m[keys.MISMATCH_K3.format(pair="rollout_old_free")].mean(),
     "{:.1e}"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads of the RL steps")
    parser.add_argument("--out", type=Path, default=Path("runs/readme"))
    parser.add_argument("--cache-dir", default=None, help="warm-start cache (default: moestab's)")
    parser.add_argument("--config", type=Path, default=None,
                        help="YAML config of the job (default: the default job, replay off); seed and out are set here")
    args = parser.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    import torch

    torch.set_num_threads(args.threads)  # what `moestab train --threads` does; train() leaves it to its caller

    from moestab.configs import build_config, load_yaml

    fields = load_yaml(args.config) if args.config else {"routing_replay": "off"}
    name = args.config.stem if args.config else "gspo-off"
    values: dict[str, list[float]] = {label: [] for label, _, _ in ROWS}
    times = []
    for seed in args.seeds:
        out = args.out / f"{name}-seed{seed}"
        if not (out / "run.json").is_file():
            start = time.perf_counter()
            # Every step measured (the default budget measures one step in 4; the training is the same bit for bit):
            # the routing rows average every step, and the wall time includes pi_new on every step.
            config = build_config(TrainConfig, {"measure_every": 1, **fields},
                                  {"seed": seed, "out": str(out), "threads": args.threads, "progress": False,
                                   "cache_dir": args.cache_dir})
            train(config, log=lambda s: None)
            times.append(time.perf_counter() - start)
        info, metrics = read_run_info(out), load_metrics(out)
        for label, get, _ in ROWS:
            values[label].append(float(get(info, metrics)))
        recorded = info.environment.get("cpu") or {}  # absent in runs written before run.json named the CPU
        print(f"seed {seed}: {out} ({info.status}, {info.environment.get('torch_threads')} threads, CPU "
              f"{recorded.get('model')} {recorded.get('capability')}): eval accuracy "
              f"{100 * info.warm_start_accuracy:.1f}% -> {100 * info.final_accuracy:.1f}%", flush=True)

    here = cpu()
    print(f"\nCPU of this process: {here['model']} ({here['machine']}, torch kernels {here['capability']})")
    print(f"{len(args.seeds)} seeds ({', '.join(map(str, args.seeds))}), {args.threads} torch threads; "
          f"{name}; wall time per run (warm start + RL): "
          + (", ".join(f"{t:.0f} s" for t in times) if times else "runs reused"))
    print("\n| quantity | mean +- sd |\n|---|---|")
    for label, _, fmt in ROWS:
        xs = values[label]
        sd = statistics.stdev(xs) if len(xs) > 1 else float("nan")
        print(f"| {label} | {fmt.format(statistics.mean(xs))} +- {fmt.format(sd)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
