"""The reference runs of a restructuring: short ``moestab train`` runs (and TRL runs, where TRL is installed) covering
every replay mode, the measurements, a measurement budget and two processes, run with whatever moestab is importable
(``PYTHONPATH=CHECKOUT``), so that two checkouts' runs can be compared bit for bit (scripts/same_run.py):

    PYTHONPATH=/tmp/before python scripts/reference_runs.py run /tmp/ref-before
    PYTHONPATH=.           python scripts/reference_runs.py run /tmp/ref-after
    python scripts/reference_runs.py compare /tmp/ref-before /tmp/ref-after

Each run is the tests' tiny setting (their length-parity reward, 4 prompts x 4 samples, 2 minibatches, 2 steps, the
embedded model untrained, every step measured, one thread), the warm-start cache beside ``OUT`` (the same for the
folders compared); finished runs are kept. ``compare`` runs same_run.py on
each pair and exits 1 if any differs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REWARD = HERE.parent / "tests" / "support" / "rewards.py"  # the tests' reward: varies for an untrained policy
TINY = {"task": f"arithmetic:reward={REWARD}:length_parity", "steps": 2, "prompts_per_step": 4, "group_size": 4,
        "minibatches": 2, "eval_size": 8, "eval_every": 1, "save_every": 1, "warm_start_max_steps": 0,
        "progress": False, "threads": 1, "measure_every": 1, "lr": 1e-3}
RUNS = {
    "grpo-off": {"algo": "grpo", "routing_replay": "off"},
    "gspo-r2-share": {"algo": "gspo", "routing_replay": "old", "routing_share": True},
    "grpo-r3-budget": {"algo": "grpo", "routing_replay": "rollout", "measure_fraction": 0.5, "routing_share": True},
    "grpo-trr": {"algo": "grpo", "routing_replay": "rollout-gates"},
    "grpo-base": {"algo": "grpo", "routing_replay": "base"},
    "rspo-r3": {"algo": "rspo", "routing_replay": "rollout"},
    "dapo-off": {"algo": "dapo", "routing_replay": "off"},
    "grpo-off-2proc": {"algo": "grpo", "routing_replay": "off", "nproc": 2, "dtype": "float64"},
}
"""Name -> settings over :data:`TINY`."""
TRL_RUNS = {
    "trl-share": {"accumulation": 1, "routing_share": True},
    "trl-no-old-forward": {"accumulation": 2, "routing_share": True},
}


def run(out: Path) -> None:
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    cache = out.parent / "reference-cache"  # shared by the folders compared: run.json's cache_dir is compared too
    for name, settings in RUNS.items():
        folder = out / name
        if (folder / "run.json").is_file() and json.loads((folder / "run.json").read_text())["status"] == "finished":
            continue
        config = out / f"{name}.yaml"
        config.write_text(yaml.safe_dump({**TINY, **settings, "cache_dir": str(cache), "out": str(folder)}))
        done = subprocess.run([sys.executable, "-m", "moestab.cli", "train", "--config", str(config)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        print(f"{name}: done", flush=True)
    try:
        import trl  # noqa: F401
    except ImportError:
        print("TRL is not installed: no TRL runs")
        return
    for name, settings in TRL_RUNS.items():
        if not (out / name / "run.json").is_file():
            _trl_run(out / name, **settings)
            print(f"{name}: done", flush=True)


def _trl_run(folder: Path, accumulation: int, routing_share: bool) -> None:
    import torch
    from datasets import Dataset
    from trl import GRPOConfig

    from moestab.integrations.trl import MoestabGRPOTrainer, RecordSettings
    from moestab.models import EmbeddedModelSpec, build_embedded_policy

    torch.manual_seed(0)
    model, tokenizer = build_embedded_policy(EmbeddedModelSpec(num_layers=2, hidden_size=64))
    prompts = [f"{a}+{b}=" for a in range(4) for b in range(2)]
    args = GRPOConfig(output_dir=str(folder.with_name(f"{folder.name}-trl")), use_cpu=True, bf16=False,
                      report_to="none", disable_tqdm=True, save_strategy="no", logging_steps=1, seed=0,
                      per_device_train_batch_size=8, num_generations=4, gradient_accumulation_steps=accumulation,
                      steps_per_generation=2, max_completion_length=6, learning_rate=1e-2, loss_type="grpo",
                      epsilon=0.05, max_steps=4 // accumulation)

    def reward(completions, **_):
        return [float(len(c) % 2) for c in completions]

    trainer = MoestabGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=reward,
                                 train_dataset=Dataset.from_dict({"prompt": prompts}), args=args,
                                 moestab=RecordSettings(folder, routing_share=routing_share))
    trainer.train()


def compare(a: Path, b: Path) -> int:
    names = [name for name in (*RUNS, *TRL_RUNS) if (a / name).is_dir() or (b / name).is_dir()]
    failed = []
    for name in names:
        done = subprocess.run([sys.executable, str(HERE / "same_run.py"), str(a / name), str(b / name)],
                              capture_output=True, text=True, check=False)
        print(f"{name}: {'same' if done.returncode == 0 else 'DIFFERENT'}; {done.stdout.strip().splitlines()[-1:]}")
        if done.returncode != 0:
            failed.append(name)
            print(done.stdout[-2000:])
    return 1 if failed else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run").add_argument("out", type=Path)
    both = sub.add_parser("compare")
    both.add_argument("a", type=Path)
    both.add_argument("b", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        run(args.out)
    else:
        raise SystemExit(compare(args.a, args.b))


if __name__ == "__main__":
    main()
