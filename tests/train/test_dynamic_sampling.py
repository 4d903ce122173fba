"""DAPO's dynamic sampling: groups whose rewards are all equal are dropped, more prompts drawn, counts logged."""

from __future__ import annotations

import random

import torch

from moestab import rl
from moestab.models import build_embedded_policy
from moestab.tasks import task_from_spec
from moestab.train.rollout import HFRolloutEngine
from moestab.train.step import run_step
from moestab.train.step_settings import StepSettings
from tests.support.train import REWARD

TASK = f"arithmetic:reward={REWARD}:low_first_digit_is_free"
G = 4


class LoggingEngine(HFRolloutEngine):
    """Keeps every rollout it makes, so the test can recount the groups independently."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rollouts = []

    def generate(self, prompts, **kwargs):
        batch = super().generate(prompts, **kwargs)
        self.rollouts.append((prompts, batch.completions))
        return batch


def step(dynamic: bool, rounds: int):
    torch.manual_seed(0)
    model, tokenizer = build_embedded_policy()
    task = task_from_spec(TASK)
    engine = LoggingEngine(model, tokenizer)
    settings = StepSettings(preset=rl.get_preset("dapo"), replay="off", minibatches=2, group_size=G, temperature=1.0,
                            max_new_tokens=4, max_grad_norm=1.0, dynamic_sampling=dynamic,
                            dynamic_sampling_rounds=rounds)
    metrics, t = run_step(
        model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), engine=engine, task=task,
        settings=settings, examples=task.sample(8, random.Random(0)), generator=torch.Generator().manual_seed(0),
        draw_more=lambda r: task.sample(8, random.Random(100 + r)),
    )
    return metrics, t, engine.rollouts, task


def signal(task, prompts, completions) -> list[bool]:
    """Per group: do its rewards differ? Recomputed with the task's reward function."""
    rewards = [task.reward(ex, c) for ex, c in zip(_examples(task, prompts), completions, strict=True)]
    return [len(set(rewards[g : g + G])) > 1 for g in range(0, len(rewards), G)]


def _examples(task, prompts):
    from moestab.tasks import Example

    return [Example(prompt=p, answer="") for p in prompts]


def test_groups_without_signal_are_dropped_refilled_and_counted():
    metrics, t, rollouts, task = step(dynamic=True, rounds=3)
    flags = [f for prompts, completions in rollouts for f in signal(task, prompts, completions)]
    assert len(rollouts) >= 2  # the first rollout had groups without signal, so more prompts were drawn
    assert metrics["sampling/groups_drawn"] == len(flags) == 8 * len(rollouts)
    assert metrics["sampling/groups_dropped"] == flags.count(False) > 0
    assert metrics["sampling/extra_rollouts"] == len(rollouts) - 1
    assert t.batch.batch_size == 8 * G  # the batch keeps its size
    rewards = t.rewards.view(-1, G)  # [groups, G]
    with_signal = (rewards.max(1).values != rewards.min(1).values).sum().item()
    assert with_signal == 8 - metrics["sampling/groups_filled"]
    if metrics["sampling/groups_filled"] == 0:
        assert with_signal == 8 and all(ex.prompt[0] not in "01234" for ex in t.examples)
    # the re-laid-out batch is still the trainer's layout: the trainer reproduces the rollout's log-probs
    assert metrics["mismatch/rollout_old_free/k3"] < 1e-9


def test_without_dynamic_sampling_one_rollout_keeps_every_group():
    metrics, t, rollouts, _ = step(dynamic=False, rounds=3)
    assert len(rollouts) == 1 and "sampling/groups_dropped" not in metrics and t.batch.batch_size == 8 * G


def test_a_spent_budget_fills_the_batch_with_dropped_groups():
    metrics, t, rollouts, task = step(dynamic=True, rounds=0)
    flags = [f for prompts, completions in rollouts for f in signal(task, prompts, completions)]
    assert len(rollouts) == 1 and metrics["sampling/extra_rollouts"] == 0
    assert metrics["sampling/groups_filled"] == flags.count(False) > 0 and t.batch.batch_size == 8 * G
