"""Tiny training budgets shared by the training tests."""

from __future__ import annotations

from pathlib import Path

from moestab.configs import build_config
from moestab.train import TrainConfig

REWARD = Path(__file__).with_name("rewards.py")
TASK = f"arithmetic:reward={REWARD}:length_parity"


def tiny_config(out: Path, cache: Path, **overrides) -> TrainConfig:
    values = {
        "task": TASK,
        "steps": 2,
        "prompts_per_step": 4,
        "group_size": 4,
        "minibatches": 2,
        "eval_size": 8,
        "eval_every": 1,
        "save_every": 1,
        "warm_start_max_steps": 0,  # untrained embedded policy: the parity reward still varies
        "cache_dir": str(cache),
        "out": str(out),
        "progress": False,
        "threads": 1,
        **overrides,
    }
    return build_config(TrainConfig, values)
