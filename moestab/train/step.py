"""One RL step: rollout -> rewards -> advantages -> pi_old -> minibatch updates -> pi_new -> metrics.

Routing Replay modes (the ``replay`` setting):

- ``off``: every forward routes freely.
- ``old`` (R2): the updates replay the routes the trainer chose under pi_old.
- ``rollout`` (R3): the pi_old log-probs and the updates replay the rollout engine's routes.

Whatever the mode, the trainer's *free* routes under pi_old and, after the updates, under the new
policy are recorded, so routing volatility is measured even when replay hides it from the loss.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from moestab import rl
from moestab.routing import Routes, gather_router_logprobs
from moestab.tasks import Example, Task
from moestab.train.batch import RolloutBatch
from moestab.train.forward import chunked_policy_forward, policy_forward, response_routes
from moestab.train.rollout import HFRolloutEngine
from moestab.train.step_metrics import routing_metrics, scalar_metrics


class NonFiniteLossError(RuntimeError):
    """The policy loss became NaN or infinite."""


@dataclass(frozen=True)
class StepSettings:
    """What one step needs to know, resolved from ``TrainConfig`` and the algorithm preset."""

    preset: rl.AlgorithmPreset
    clip_low: float
    clip_high: float
    kl_coef: float
    gamma_min: float
    replay: str
    minibatches: int
    group_size: int
    temperature: float
    max_new_tokens: int
    max_grad_norm: float


@dataclass
class StepTensors:
    """Everything a step computed per response token, for the run records (all ``[B, T]`` unless noted)."""

    batch: RolloutBatch
    examples: list[Example]
    rewards: torch.Tensor  # [B]
    advantages: torch.Tensor  # [B]
    minibatch: torch.Tensor  # [B] index of the minibatch that updated each sequence
    logp_old: torch.Tensor  # as used in the ratio
    logp_old_free: torch.Tensor
    logp_update: torch.Tensor
    logp_new: torch.Tensor
    clipped: torch.Tensor  # bool
    routes_old: Routes  # free, [B, L, layers, k]
    routes_update: torch.Tensor  # [B, L, layers, k]
    routes_new: Routes


def run_step(
    *,
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    engine: HFRolloutEngine,
    task: Task,
    settings: StepSettings,
    examples: list[Example],
    generator: torch.Generator,
    ref_model: PreTrainedModel | None = None,
) -> tuple[dict, StepTensors]:
    """Run one step on ``examples`` (one prompt each; ``group_size`` samples per prompt)."""
    s = settings
    t0 = time.perf_counter()
    prompts = [ex.prompt for ex in examples for _ in range(s.group_size)]
    batch = engine.generate(prompts, max_new_tokens=s.max_new_tokens, temperature=s.temperature)
    t_rollout = time.perf_counter() - t0
    per_seq = [ex for ex in examples for _ in range(s.group_size)]
    rewards = torch.tensor([task.reward(ex, c) for ex, c in zip(per_seq, batch.completions, strict=True)])
    correct = torch.tensor([task.is_correct(ex, c) for ex, c in zip(per_seq, batch.completions, strict=True)])
    advantages = rl.compute_advantages(s.preset.advantage, rewards, s.group_size)  # [B]
    mask = batch.response_mask  # [B, T]
    is_rspo = s.preset.loss == "rspo"

    order = torch.randperm(batch.batch_size, generator=generator)
    chunks = [rows.sort().values for rows in order.chunk(s.minibatches)]  # the minibatches
    fwd_args = {"temperature": s.temperature}

    # pi_old: the free forward records the trainer's own routes (and margins for the records). It runs
    # in the update chunks when its log-probs enter the ratio; under R3 the ratio uses a replayed
    # forward instead, so the free one (kept for the rollout->trainer mismatch) runs in one piece.
    with torch.no_grad():
        free_args = {**fwd_args, "router_logprobs": is_rspo, "entropy": True, "router_stats": True}
        if s.replay == "rollout":
            old_free = policy_forward(model, batch, **free_args)
            old_used = chunked_policy_forward(model, batch, chunks, **fwd_args, replay=batch.routes, record=False)
        else:
            old_free = old_used = chunked_policy_forward(model, batch, chunks, **free_args)
        ref_logp = None
        if s.kl_coef > 0:
            if ref_model is None:
                raise ValueError("kl_coef > 0 needs a reference model")
            ref_logp = chunked_policy_forward(ref_model, batch, chunks, **fwd_args, record=False).logp

    replay_source = {"off": None, "old": old_free.routes, "rollout": batch.routes}[s.replay]
    minibatch_of = torch.empty(batch.batch_size, dtype=torch.long)
    logp_update = torch.zeros_like(old_free.logp)
    clipped = torch.zeros_like(mask)
    routes_update = torch.empty_like(old_free.routes.indices)
    losses, grad_norms, loss_metrics = [], [], []
    t1 = time.perf_counter()
    model.train()
    for m, rows in enumerate(chunks):
        minibatch_of[rows] = m
        mb = batch.select(rows)
        fwd = policy_forward(
            model, mb, **fwd_args,
            replay=None if replay_source is None else replay_source.select(rows),
            router_logprobs=is_rspo,
        )
        kwargs = {
            **s.preset.loss_kwargs(),
            "logp": fwd.logp, "old_logp": old_used.logp[rows], "advantages": advantages[rows],
            "mask": mb.response_mask, "clip_low": s.clip_low, "clip_high": s.clip_high, "kl_coef": s.kl_coef,
        }
        if ref_logp is not None:
            kwargs["ref_logp"] = ref_logp[rows]
        if s.preset.aggregation == "seq-mean-token-sum-norm":
            kwargs["norm_constant"] = float(s.max_new_tokens)
        if is_rspo:
            old_idx = response_routes(old_free.routes, batch)[rows]  # [b, T, layers, k]
            kwargs["gamma_min"] = s.gamma_min
            kwargs["router_logp_old"] = gather_router_logprobs(
                old_free.routes.router_logprobs[rows][:, batch.prompt_len - 1 :], old_idx).nan_to_num(0.0)
            kwargs["router_logp_new"] = gather_router_logprobs(
                fwd.routes.router_logprobs[:, batch.prompt_len - 1 :], old_idx).nan_to_num(0.0)
        parts = rl.compute_loss_parts(s.preset.loss, **kwargs)
        if not torch.isfinite(parts.loss):
            raise NonFiniteLossError(f"policy loss is {parts.loss.item()} at minibatch {m}")
        optimizer.zero_grad(set_to_none=True)
        parts.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), s.max_grad_norm)
        if not torch.isfinite(grad_norm):
            raise NonFiniteLossError(f"gradient norm is {grad_norm.item()} at minibatch {m}")
        optimizer.step()
        losses.append(parts.loss.item())
        grad_norms.append(grad_norm.item())
        loss_metrics.append(parts.metrics)
        logp_update[rows] = fwd.logp.detach()
        clipped[rows] = parts.clipped
        routes_update[rows] = fwd.routes.indices
    t_update = time.perf_counter() - t1

    # pi_new: free forward after all updates, on the same tokens (one forward: no exactness at stake).
    with torch.no_grad():
        new = policy_forward(model, batch, **fwd_args)

    tensors = StepTensors(
        batch=batch, examples=examples, rewards=rewards, advantages=advantages, minibatch=minibatch_of,
        logp_old=old_used.logp, logp_old_free=old_free.logp, logp_update=logp_update, logp_new=new.logp,
        clipped=clipped, routes_old=old_free.routes, routes_update=routes_update, routes_new=new.routes,
    )
    metrics = {
        "time/step_s": time.perf_counter() - t0,
        "time/rollout_s": t_rollout,
        "time/update_s": t_update,
        "reward/mean": rewards.mean().item(),
        "reward/std": rewards.std().item() if len(rewards) > 1 else 0.0,
        "accuracy": correct.float().mean().item(),
        "response/length_mean": mask.sum(-1).float().mean().item(),
        "response/length_max": int(mask.sum(-1).max()),
        "loss": sum(losses) / len(losses),
        "grad_norm": sum(grad_norms) / len(grad_norms),
        "entropy": rl.masked_mean(old_free.entropy, mask).item(),
        **scalar_metrics(loss_metrics),
        **routing_metrics(tensors, replay=s.replay),
    }
    return metrics, tensors


def step_seed(seed: int, step: int) -> int:
    """Seed of ``step``: each step's randomness depends only on (seed, step), so --resume reproduces it."""
    return (seed * 1_000_003 + step * 7_919) % (2**31 - 1)


def step_examples(task: Task, n: int, seed: int, step: int) -> list[Example]:
    return task.sample(n, random.Random(step_seed(seed, step)))
