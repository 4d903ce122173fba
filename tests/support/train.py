"""Tiny training budgets shared by the training tests."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from pathlib import Path

import torch

from moestab import rl
from moestab.configs import build_config
from moestab.models import build_embedded_policy
from moestab.tasks import task_from_spec
from moestab.train import TrainConfig
from moestab.train.step import run_step
from moestab.train.step_settings import StepSettings

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
        # Every step measured: the tests read each step's volatility and tables (the default budget measures every
        # 4th step: tests/train/test_measure_budget.py covers it).
        "measure_every": 1,
        **overrides,
    }
    return build_config(TrainConfig, values)


def one_grpo_step(replay: str, engine: Callable, measured: torch.Tensor | None = None, **settings):
    """One grpo ``run_step`` of a fresh embedded policy on 4 prompts x 4 samples with ``engine(model, tokenizer)``
    as the rollout engine: ``(model before the step, model after, metrics, step tensors)``. ``settings`` override
    the ``StepSettings`` (2 minibatches, temperature 1, 4 new tokens, ...); ``measured`` is ``run_step``'s."""
    torch.manual_seed(0)
    model, tokenizer = build_embedded_policy()
    before = copy.deepcopy(model)
    task = task_from_spec(TASK)
    settings = StepSettings(
        **{"preset": rl.get_preset("grpo"), "replay": replay, "minibatches": 2, "group_size": 4, "temperature": 1.0,
           "max_new_tokens": 4, "max_grad_norm": 1.0, **settings},
    )
    metrics, tensors = run_step(
        model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), engine=engine(model, tokenizer),
        task=task, settings=settings, examples=task.sample(4, random.Random(0)),
        generator=torch.Generator().manual_seed(0), measured=measured,
    )
    return before, model, metrics, tensors
