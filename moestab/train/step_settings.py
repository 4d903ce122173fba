"""What one RL step needs to know (:class:`StepSettings`, resolved from ``TrainConfig`` and the algorithm preset), what
decides its measurements, and the step's own randomness: its minibatch split, its seed, its prompts."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from moestab import rl
from moestab.recording.measurements import MeasureSetup
from moestab.tasks import Example, Task


@dataclass(frozen=True)
class StepSettings:
    """What one step needs to know, resolved from ``TrainConfig`` and the algorithm preset."""

    preset: rl.AlgorithmPreset
    """The objective with every setting resolved (clip range, kl_coef, loss-specific ones such as gamma_min)."""
    replay: str
    minibatches: int
    group_size: int
    temperature: float
    max_new_tokens: int
    max_grad_norm: float
    router_aux_loss_coef: float = 0.0
    """Weight of the model's load-balancing loss added to the policy loss in the updates (0: none)."""
    overlong_cache: int | None = None
    """DAPO's overlong reward shaping: ``L_cache`` tokens below ``max_new_tokens`` (None: off)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: drop groups whose rewards are all equal and draw more prompts."""
    dynamic_sampling_rounds: int = 0
    """Budget of extra rollouts (each of as many prompts as the step) for dynamic sampling."""
    replay_score_ratio: float = 0.0
    """Score-threshold replay in the updates (``RoutingReplay(score_ratio=...)``); 0: plain replay."""
    measure_switches: frozenset[str] = frozenset()
    """The measurement switches the run's config turns on (``measurements.switched_on``: ``routing_share`` scores each
    minibatch once more with the other routing, for routing's share of the ratio)."""
    route_integrity: str = "warn"
    """``refuse``: judge the rollout's routes before the updates (``recording.capture_check``) and stop on a broken
    capture; ``warn``: the step's ``routes/integrity/*`` keys only."""


def minibatch_rows(batch_size: int, minibatches: int, generator: torch.Generator) -> list[torch.Tensor]:
    """A random split of ``batch_size`` rows into ``minibatches`` equal minibatches (rows sorted in each).

    Raises ``ValueError`` when ``minibatches`` does not divide ``batch_size`` (unequal minibatches
    would weigh sequences differently), listing the valid counts.
    """
    if minibatches < 1 or batch_size % minibatches:
        valid = [d for d in range(1, batch_size + 1) if batch_size % d == 0]
        raise ValueError(f"minibatches={minibatches} does not divide the rollout batch of {batch_size} sequences; "
                         f"valid: {', '.join(map(str, valid))}")
    order = torch.randperm(batch_size, generator=generator)
    return [rows.sort().values for rows in order.chunk(minibatches)]


def reward_dtype(policy_dtype: torch.dtype) -> torch.dtype:
    """The dtype of rewards and advantages: float64 in a float64 run, else float32 (never a 16-bit type, and float32
    runs unchanged bit for bit). In float32, a reward like 0.1 and its group statistics would round by ~6e-8
    relative inside a run meant to be float64 throughout (issue 40.7)."""
    return torch.float64 if policy_dtype == torch.float64 else torch.float32


def needs_router_logprobs(preset: rl.AlgorithmPreset) -> bool:
    """Whether the objective reads the routers' log-probs (RSPO's router shift)."""
    return any(name.startswith("router_logp") for name in preset.runtime_inputs)


def measure_setup(s: StepSettings) -> MeasureSetup:
    """What decides which measurements a step of settings ``s`` runs."""
    return MeasureSetup(replay=s.replay, switched_on=s.measure_switches,
                        router_logprobs=needs_router_logprobs(s.preset))


def step_seed(seed: int, step: int) -> int:
    """Seed of ``step``: each step's randomness depends only on (seed, step), so --resume reproduces it."""
    return (seed * 1_000_003 + step * 7_919) % (2**31 - 1)


def step_examples(task: Task, n: int, seed: int, step: int) -> list[Example]:
    return task.sample(n, random.Random(step_seed(seed, step)))


def extra_examples(task: Task, n: int, seed: int, step: int) -> Callable[[int], list[Example]]:
    """``draw_more`` of ``step``: dynamic sampling's ``n`` extra prompts of round ``r`` (deterministic per round)."""
    base = step_seed(seed, step)
    return lambda r: task.sample(n, random.Random(base * 1009 + r))
