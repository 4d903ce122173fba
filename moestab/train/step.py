"""One RL step: rollout -> rewards and advantages -> pi_old -> one update per minibatch -> metrics.

The step trains; the forwards that exist only to measure (pi_old's free twin under R3 / TRR, routing's share around
each update, pi_new) are declared in :mod:`moestab.recording.measurements` and called at its three named points:
``before_updates``, around each update (``before_update`` / ``after_update``) and ``after_step``.

Routing Replay modes (the ``replay`` setting):

- ``off``: every forward routes freely.
- ``old`` (R2): the updates replay the routes the trainer chose under pi_old.
- ``rollout`` (R3): the pi_old log-probs and the updates replay the rollout engine's routes. The first minibatch's
  pi_old log-probs are its update forward's (same weights, rows and routes: the no-grad forward would repeat it bit
  for bit), so pi_old's replayed forward runs on the other minibatches only.
- ``rollout-gates`` (TRR, "Total Router Recall"): as R3, with the rollout engine's gate weights as given too
  (``RoutingReplay(force_gates=True)``): the router is frozen in those forwards.
- ``base`` (routing-constant): as R3, the rollout's routes being the frozen base's (``routing.base_routing``).

With ``replay_score_ratio`` > 0 (R2 / R3), the updates filter the replayed experts by the router's own scores
(score-threshold replay, prime-rl PR #2703): the routes an update used, recorded as ``routes_update``, differ from
the replayed ones in the slots it refilled (``routing/replay_replace_rate``). pi_old's replayed forward under R3
replays plainly, so the replaced share is measured against the routes of ``logp_old``.

A measurement budget (``measured``: :mod:`moestab.recording.measure_budget`) restricts the measurements to a sample of
whole groups, or to no row at all on an unmeasured step; the rows left out hold NaN log-probs and -1 routes, and
``StepTensors.measured`` / ``sampled`` say which. The sample is forwarded in the minibatches' chunks restricted to
its rows. Under R3 / TRR both sides of old->new are such chunks; under off / R2 pi_old's are the whole minibatches,
and the smaller shape changes a row's outputs by rounding only (on the CPU up to ~3e-7 in the logits, no routing
decision flipped: ``tests/train/test_measure_budget.py``; on a GPU kernels may round more differently between shapes).

Every trainer forward of the step (pi_old free, pi_old replayed, the updates, pi_new) runs in the
same row chunks, the minibatches: with no update in between, two forwards see bit-identical inputs
of identical shape, so a difference between them is the update's doing and never the batch shape's
(on a GPU, kernels and their rounding change with the batch shape).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from moestab import rl
from moestab.metrics import keys
from moestab.recording.batch import RolloutBatch, cat_batches
from moestab.recording.capture_check import refuse_broken_capture
from moestab.recording.measurements import (
    FreeOldPolicy,
    Measurement,
    Scored,
    UpdateView,
    measured_metrics,
    sampled_columns,
    step_measurements,
)
from moestab.recording.step_metrics import Updates, step_metrics
from moestab.recording.step_tensors import StepTensors, cat_loss_inputs, cat_step_tensors
from moestab.rl.shaping import overlong_penalty
from moestab.routing import gather_router_logprobs
from moestab.run_folder import schema
from moestab.tasks import Example, Task
from moestab.train.distributed import SINGLE, World, local_chunks
from moestab.train.engine import RolloutEngine
from moestab.train.forward import PolicyForward, chunk_logprobs, chunked_policy_forward, policy_forward, response_routes
from moestab.train.step_forwards import TrainForwards, measure_setup, needs_router_logprobs


class NonFiniteLossError(RuntimeError):
    """The policy loss became NaN or infinite."""


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
    routing_share: bool = False
    """Score each minibatch once more on its update's weights with the other routing (``measurements.RoutingShare``)
    for routing's share of the ratio (``routing_share/*``)."""
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


@dataclass(frozen=True)
class _OldPolicy:
    free: Scored | None  # free routing, routes recorded with router stats; None: a measurement's (R3 / TRR)
    logp: torch.Tensor  # [B, T] as used in the ratio (NaN on ``from_first_update`` rows until the first update)
    routes: torch.Tensor  # [B, L, layers, k] routes that produced ``logp``
    ref_logp: torch.Tensor | None  # [B, T] reference policy, for the KL penalty
    from_first_update: bool = False  # the first minibatch's ``logp`` is the first update forward's (see _old_policy)


@dataclass(frozen=True)
class _Updates:
    minibatch: torch.Tensor  # [B]
    logp: torch.Tensor  # [B, T]
    clipped: torch.Tensor  # [B, T] bool
    routes: torch.Tensor  # [B, L, layers, k]
    losses: list[float]  # the global minibatch loss (every rank's share summed)
    grad_norms: list[float]
    loss_metrics: list[dict[str, torch.Tensor]]  # this process's rows: the global minibatch in one process
    loss_inputs: list[dict | None]  # detached loss inputs per minibatch (distributed only: rank 0 re-evaluates)
    aux_losses: list[float | None]  # the global load-balancing loss per minibatch, when on


def reward_dtype(policy_dtype: torch.dtype) -> torch.dtype:
    """The dtype of rewards and advantages: float64 in a float64 run, else float32 (never a 16-bit type, and float32
    runs unchanged bit for bit). In float32, a reward like 0.1 and its group statistics would round by ~6e-8
    relative inside a run meant to be float64 throughout (issue 40.7)."""
    return torch.float64 if policy_dtype == torch.float64 else torch.float32


def _rewards(task: Task, examples: list[Example], batch: RolloutBatch, s: StepSettings, dtype: torch.dtype):
    """Per sequence ``[B]``: task reward, overlong penalty (zeros when shaping is off) and correctness."""
    per_seq = [ex for ex in examples for _ in range(s.group_size)]
    rewards = torch.tensor([task.reward(ex, c) for ex, c in zip(per_seq, batch.completions, strict=True)],
                           dtype=dtype)  # [B]
    correct = torch.tensor([task.is_correct(ex, c) for ex, c in zip(per_seq, batch.completions, strict=True)])
    penalty = torch.zeros_like(rewards)  # [B]
    if s.overlong_cache:
        penalty = overlong_penalty(batch.response_mask.sum(-1), s.max_new_tokens, s.overlong_cache).to(rewards.dtype)
    return rewards, penalty, correct


@dataclass(frozen=True)
class _Sampled:
    batch: RolloutBatch
    examples: list[Example]
    rewards: torch.Tensor  # [B] task reward + shaping: what the advantages use
    correct: torch.Tensor  # [B]
    metrics: dict[str, float]  # shaping and dynamic-sampling counts


_Part = tuple[RolloutBatch, list[Example], torch.Tensor, torch.Tensor, torch.Tensor]
"""Groups of one rollout round: their batch rows, prompts, task rewards ``[b]``, penalties ``[b]``, correctness
``[b]``."""


def _sample(
    engine: RolloutEngine, task: Task, examples: list[Example], s: StepSettings,
    draw_more: Callable[[int], list[Example]] | None, world: World = SINGLE, dtype: torch.dtype = torch.float32,
) -> _Sampled:
    """The rollout and its rewards; with dynamic sampling (DAPO), groups whose rewards are all equal (no
    signal: every advantage 0) are dropped and more prompts are drawn, up to ``s.dynamic_sampling_rounds``
    extra rollouts. If the budget runs out, dropped groups fill the batch, so its size stays fixed.

    Over several processes each samples its share of every round (``examples``, ``draw_more``), and the
    decisions are the whole step's: rounds go on until the groups with signal of *all* processes fill the
    batch, the groups are taken in one process's order, and each process keeps its block of them."""
    G, needed = s.group_size, len(examples)
    kept: list[tuple[int, _Part]] = []  # (round, groups with signal)
    spare: list[tuple[int, _Part]] = []  # (round, dropped groups)
    drawn = dropped = rounds = 0
    round_examples = examples
    while True:
        prompts = [ex.prompt for ex in round_examples for _ in range(G)]
        batch = engine.generate(prompts, max_new_tokens=s.max_new_tokens, temperature=s.temperature)
        task_rewards, penalty, correct = _rewards(task, round_examples, batch, s, dtype)
        drawn += len(round_examples)
        if not s.dynamic_sampling:
            kept.append((rounds, (batch, round_examples, task_rewards, penalty, correct)))
            break
        groups = (task_rewards + penalty).view(-1, G)  # [groups, G]
        signal = groups.max(dim=1).values != groups.min(dim=1).values  # [groups]
        dropped += int((~signal).sum())
        for flag, bucket in ((True, kept), (False, spare)):
            ids = torch.nonzero(signal == flag).flatten().tolist()
            if ids:
                rows = torch.tensor([g * G + j for g in ids for j in range(G)])
                bucket.append((rounds, (batch.select(rows), [round_examples[g] for g in ids], task_rewards[rows],
                                        penalty[rows], correct[rows])))
        have = world.sum(sum(len(part[1]) for _, part in kept))  # every process's groups with signal
        if have >= needed * world.size or draw_more is None or rounds >= s.dynamic_sampling_rounds:
            break
        rounds += 1
        round_examples = draw_more(rounds)
    if world.distributed and s.dynamic_sampling:
        parts, first = _whole_step_parts(world, kept, spare), world.rank * needed
    else:
        parts, first = [part for _, part in (*kept, *spare)], 0  # groups with signal first; dropped ones to fill
    skip, take, out = first, needed, []
    for batch, exs, task_rewards, penalty, correct in parts:  # the groups first .. first + needed, in order
        start = min(skip, len(exs))
        n = min(take, len(exs) - start)
        skip -= start
        if n > 0:
            rows = torch.arange(start * G, (start + n) * G)
            out.append((batch.select(rows), exs[start : start + n], task_rewards[rows], penalty[rows], correct[rows]))
            take -= n
    batch = cat_batches([p[0] for p in out], engine.tokenizer.pad_token_id)
    examples = [ex for p in out for ex in p[1]]
    task_rewards, penalty, correct = (torch.cat([p[i] for p in out]) for i in (2, 3, 4))
    metrics: dict[str, float] = {}
    if s.overlong_cache:
        metrics = {keys.REWARD_TASK_MEAN: task_rewards.mean().item(),
                   keys.REWARD_OVERLONG_PENALTY: penalty.mean().item(),
                   keys.REWARD_OVERLONG_FRAC: (penalty < 0).float().mean().item()}
    if s.dynamic_sampling:  # the whole step's counts, on every process
        with_signal = world.sum(sum(len(part[1]) for _, part in kept))
        filled = max(0, needed * world.size - int(with_signal))
        metrics.update({keys.SAMPLING_DRAWN: int(world.sum(drawn)), keys.SAMPLING_DROPPED: int(world.sum(dropped)),
                        keys.SAMPLING_EXTRA: rounds, keys.SAMPLING_FILLED: filled})
    return _Sampled(batch, examples, task_rewards + penalty, correct, metrics)


def _whole_step_parts(world: World, kept: list[tuple[int, _Part]], spare: list[tuple[int, _Part]]) -> list[_Part]:
    """Every process's rounds in one process's order: groups with signal by round, then by process (a round's
    prompts are split in contiguous blocks), then the dropped ones likewise; on the CPU, for every process."""
    def cpu(part: _Part) -> _Part:
        batch, exs, *tensors = part
        return (batch.to("cpu"), exs, *(t.cpu() for t in tensors))

    everyone = world.all_gather(([(r, cpu(p)) for r, p in kept], [(r, cpu(p)) for r, p in spare]))
    ordered = []
    for bucket in (0, 1):
        tagged = [(r, rank, part) for rank, buckets in enumerate(everyone) for r, part in buckets[bucket]]
        ordered += [part for _, _, part in sorted(tagged, key=lambda t: (t[0], t[1]))]
    return ordered


@torch.no_grad()
def _old_policy(
    model: PreTrainedModel, batch: RolloutBatch, chunks: list[torch.Tensor], s: StepSettings,
    ref_model: PreTrainedModel | None, forwards: TrainForwards,
) -> _OldPolicy:
    """pi_old as the ratio uses it: its free forward (routes recorded, for the records and R2; the forward the
    measurements run too, ``forwards.free``), or under R3 / TRR a forward replaying the rollout engine's routes
    (TRR: and its gates), whose free twin is a measurement (``measurements.FreeOldPolicy``) unless the objective reads
    the free routers' log-probs."""
    free = None if FreeOldPolicy.applies(measure_setup(s)) else forwards.free(
        None, entropy=True, router_stats=True, router_logprobs=needs_router_logprobs(s.preset))
    if schema.REPLAY_ROUTES[s.replay] != "rollout":
        logp, routes, from_first_update = free.logp, free.routes.indices, False
    else:
        # The first update forward replays the same routes (and gates) on the same weights and rows: its log-probs
        # are the replayed pi_old's, bit for bit on a deterministic model, so that minibatch's no-grad forward is
        # skipped and its rows are filled from the update (the ratio is then exactly 1 there by construction). Not
        # with score-threshold replay, whose updates refill slots pi_old's plain replay keeps.
        from_first_update = s.replay_score_ratio == 0
        logp = chunk_logprobs(model, batch, chunks[1:] if from_first_update else chunks, temperature=s.temperature,
                              replay=batch.routes, force_gates=s.replay in schema.GATE_REPLAY_MODES)  # [B, T]
        routes = batch.routes.indices
    ref_logp = None
    if "ref_logp" in s.preset.runtime_inputs:
        if ref_model is None:
            raise ValueError("kl_coef > 0 needs a reference model")
        ref_logp = chunked_policy_forward(ref_model, batch, chunks, temperature=s.temperature, record=False).logp
    return _OldPolicy(free=free, logp=logp, routes=routes, ref_logp=ref_logp, from_first_update=from_first_update)


@dataclass(frozen=True)
class _LossContext:
    """What the providers of :data:`RUNTIME_INPUTS` read for one minibatch."""

    settings: StepSettings
    batch: RolloutBatch
    rows: torch.Tensor  # [b] the minibatch's rows
    fwd: PolicyForward  # the update forward of those rows
    old: _OldPolicy


def _router_logp(routes, ctx: _LossContext) -> torch.Tensor:
    """Router log-probs of pi_old's chosen experts under ``routes``' routers: ``[b, T, layers, k]``."""
    old_idx = response_routes(ctx.old.free.routes, ctx.batch)[ctx.rows]  # [b, T, layers, k]
    return gather_router_logprobs(routes.router_logprobs[:, ctx.batch.prompt_len - 1 :], old_idx).nan_to_num(0.0)


RUNTIME_INPUTS: dict[str, Callable[[_LossContext], Any]] = {
    "norm_constant": lambda c: float(c.settings.max_new_tokens),
    "ref_logp": lambda c: c.old.ref_logp[c.rows],
    "router_logp_old": lambda c: _router_logp(c.old.free.routes.select(c.rows), c),
    "router_logp_new": lambda c: _router_logp(c.fwd.routes, c),
}
"""How the step fills each input an objective declares (``@objective(..., runtime_inputs=...)``, gathered with the
aggregation's and the KL penalty's in ``AlgorithmPreset.runtime_inputs``): one table, so a new objective that needs
a tensor no other one does adds an entry here instead of a branch in the step."""


def _loss_inputs(
    s: StepSettings, batch: RolloutBatch, rows: torch.Tensor, fwd: PolicyForward, old: _OldPolicy,
    advantages: torch.Tensor,
) -> dict:
    """Keyword arguments of the registered loss for one minibatch."""
    ctx = _LossContext(s, batch, rows, fwd, old)
    return {
        **s.preset.loss_kwargs(),
        "logp": fwd.logp, "old_logp": old.logp[rows], "advantages": advantages[rows], "mask": batch.response_mask[rows],
        **{name: RUNTIME_INPUTS[name](ctx) for name in s.preset.runtime_inputs},
    }


def _updates(
    model: PreTrainedModel, optimizer: torch.optim.Optimizer, batch: RolloutBatch, chunks: list[torch.Tensor],
    old: _OldPolicy, advantages: torch.Tensor, s: StepSettings, world: World, measured: torch.Tensor | None,
    measures: list[Measurement], forwards: TrainForwards,
) -> _Updates:
    """One optimizer step per minibatch, the measurements called around each (``Measurement.before_update`` /
    ``after_update``). The first minibatch of a ``from_first_update`` pi_old takes its pi_old log-probs from its own
    update forward (see :func:`_old_policy`)."""
    old_free_routes = None if old.free is None else old.free.routes  # [B, L, layers, k] R2's replay, or None (R3)
    replay_source = {None: None, "old": old_free_routes, "rollout": batch.routes}[schema.REPLAY_ROUTES[s.replay]]
    forwards.old_free_routes = old_free_routes  # routing share's other routing when the updates route freely
    watching = [measure for measure in measures if measure.watches_updates()]
    minibatch = torch.empty(batch.batch_size, dtype=torch.long)  # [B]
    logp = torch.zeros_like(old.logp)  # [B, T]
    clipped = torch.zeros_like(batch.response_mask)  # [B, T]
    routes = torch.empty_like(old.routes)  # [B, L, layers, k]
    losses, grad_norms, loss_metrics, loss_inputs, aux_losses = [], [], [], [], []
    model.train()
    for m, rows in enumerate(chunks):
        minibatch[rows] = m
        # A rank holding none of this minibatch still runs its forward and backward (FSDP's collectives), on a
        # stand-in row whose loss weighs 0.
        held = rows if len(rows) else rows.new_zeros(1)
        scored = torch.arange(len(held)) if measured is None else torch.nonzero(measured[held]).flatten()  # [b']
        for measure in watching:
            measure.before_update(forwards, held, scored)
        fwd = policy_forward(
            model, batch.select(held), temperature=s.temperature,
            replay=None if replay_source is None else replay_source.select(held),
            force_gates=s.replay in schema.GATE_REPLAY_MODES, score_ratio=s.replay_score_ratio,
            router_logprobs=needs_router_logprobs(s.preset), aux_loss=s.router_aux_loss_coef > 0,
        )
        if m == 0 and old.from_first_update and len(rows):
            old.logp[rows] = fwd.logp.detach().to(old.logp.dtype)  # pi_old's replayed log-probs: see _old_policy
        inputs = _loss_inputs(s, batch, held, fwd, old, advantages)
        parts = rl.compute_loss_parts(s.preset.loss, **inputs)
        if watching:
            update = UpdateView(logp=fwd.logp.detach(), clipped=lambda logp, inputs=inputs: rl.compute_clipped_mask(
                s.preset.loss, **{**inputs, "logp": logp}))  # logp [b, T]
            for measure in watching:
                measure.after_update(rows, update)
        loss, metrics = parts.loss, parts.metrics
        if fwd.aux_loss is not None:  # the load-balancing loss users keep on during RL (TRL's router_aux_loss_coef)
            loss = loss + s.router_aux_loss_coef * fwd.aux_loss
            metrics = {**metrics, "objective/router_aux_loss": fwd.aux_loss.detach()}
        # This rank's share of the global minibatch loss (one process: share 1.0, exactly).
        weight = rl.shard_weight(batch.response_mask[rows], s.preset.aggregation)
        total = world.sum(weight)
        share = weight / total if total else 0.0
        global_loss = world.sum(loss.item() * share)
        if not math.isfinite(global_loss):
            raise NonFiniteLossError(f"policy loss is {global_loss} at minibatch {m}")
        optimizer.zero_grad(set_to_none=True)
        (loss * (world.size * share)).backward()  # FSDP averages gradients over ranks: N * share undoes it
        grad_norm = _full(torch.nn.utils.clip_grad_norm_(model.parameters(), s.max_grad_norm))
        if not math.isfinite(grad_norm):
            raise NonFiniteLossError(f"gradient norm is {grad_norm} at minibatch {m}")
        optimizer.step()
        aux_losses.append(None if fwd.aux_loss is None else world.sum(fwd.aux_loss.item() * share))
        losses.append(global_loss)
        grad_norms.append(grad_norm)
        loss_metrics.append(metrics)
        if world.distributed:
            loss_inputs.append({k: v.detach() if torch.is_tensor(v) else v for k, v in inputs.items()}
                               if len(rows) else None)
        if len(rows):
            logp[rows] = fwd.logp.detach()
            clipped[rows] = parts.clipped
            routes[rows] = fwd.routes.indices
    return _Updates(minibatch, logp, clipped, routes, losses, grad_norms, loss_metrics, loss_inputs, aux_losses)


def _full(norm: torch.Tensor) -> float:
    """A gradient norm as a float; sharded parameters give a DTensor holding the global norm."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def run_step(
    *,
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    engine: RolloutEngine,
    task: Task,
    settings: StepSettings,
    examples: list[Example],
    generator: torch.Generator,
    ref_model: PreTrainedModel | None = None,
    draw_more: Callable[[int], list[Example]] | None = None,
    world: World = SINGLE,
    measured: torch.Tensor | None = None,
) -> tuple[dict, StepTensors]:
    """Run one step on ``examples`` (one prompt each; ``group_size`` samples per prompt).

    ``measured`` ``[B]`` bool: the rows the measure-only forwards score (``MeasureBudget.rows``); None: all.

    ``draw_more(round)`` supplies the prompts of dynamic sampling's extra rollouts (deterministic per round).
    Over several processes (``world``), ``examples`` are this rank's share of the step's prompts, and rank 0
    returns the metrics and tensors of the whole step (the other ranks: the metrics, and their own tensors).
    """
    s = settings
    t0 = time.perf_counter()
    global_size = len(examples) * s.group_size * world.size
    chunks = minibatch_rows(global_size, s.minibatches, generator)  # checked before the rollout
    chunks = local_chunks(chunks, world, global_size)
    engine.sync_weights()  # once per step on every rank (a collective when the policy is sharded)
    sampled = _sample(engine, task, examples, s, draw_more, world, reward_dtype(next(model.parameters()).dtype))
    batch, examples, rewards, correct = sampled.batch, sampled.examples, sampled.rewards, sampled.correct
    advantages = rl.compute_advantages(s.preset.advantage, rewards, s.group_size)  # [B]
    t_rollout = time.perf_counter() - t0
    if measured is not None and measured.shape != (batch.batch_size,):
        raise ValueError(f"measured must be [{batch.batch_size}] bool, got {tuple(measured.shape)}")
    if measured is not None and bool(measured.all()):
        measured = None  # every row: the plain forwards, exactly as without a budget
    if measured is not None and world.distributed and bool(measured.any()):
        # A sharded forward is a collective: every process must run the same forwards. An unmeasured step (no row
        # on any process) skips them everywhere; a sample of groups would not.
        raise ValueError("a measurement budget sampling groups (measure_fraction < 1) runs in one process only "
                         "(nproc 1); measure_every works with any nproc")
    forwards = TrainForwards(model, batch, chunks, s)
    old = _old_policy(model, batch, chunks, s, ref_model, forwards)
    mask = batch.response_mask  # [B, T]
    measures = step_measurements(measure_setup(s), tuple(mask.shape), old.logp.dtype, mask.device)
    if world.distributed and any(m.keys for m in measures):
        raise ValueError(f"{[type(m).__name__ for m in measures if m.keys]} report metrics of their own, which one "
                         "process would compute over its rows only: run them with nproc 1")
    for measure in measures:
        measure.before_updates(forwards, measured)
    if s.route_integrity == "refuse":  # before any update replays the captured routes
        filled = [m.filled()["routes_old_free"] for m in measures if "routes_old_free" in m.fills]
        refuse_broken_capture(batch, old.free.routes if old.free is not None else next(iter(filled), None), s.replay)
    t1 = time.perf_counter()
    up = _updates(model, optimizer, batch, chunks, old, advantages, s, world, measured, measures, forwards)
    t_update = time.perf_counter() - t1
    for measure in measures:
        measure.after_step(forwards, measured)
    free_old = {} if old.free is None else {"logp_old_free": old.free.logp, "routes_old_free": old.free.routes,
                                            "entropy": old.free.entropy}  # else FreeOldPolicy fills them
    tensors = StepTensors(
        batch=batch, examples=examples, rewards=rewards, correct=correct, advantages=advantages, minibatch=up.minibatch,
        logp_old=old.logp, logp_update=up.logp, clipped=up.clipped, routes_old=old.routes, routes_update=up.routes,
        **free_old, **{k: v for measure in measures for k, v in measure.filled().items()},
        measured=measured, sampled=sampled_columns(measures, measured),
    )
    per_minibatch, sampling = up.loss_metrics, sampled.metrics
    if world.distributed:
        local = tensors
        tensors, per_minibatch, sampling = _merge_ranks(world, tensors, up, sampled.metrics, s, engine)
        if tensors is None:  # not rank 0: rank 0 computes the step's metrics, every rank gets them
            return world.broadcast(None), local
    measured = {keys.TIME_STEP: time.perf_counter() - t0, keys.TIME_ROLLOUT: t_rollout, keys.TIME_UPDATE: t_update,
                **sampling, keys.MINIBATCHES: len(chunks), **measured_metrics(measures)}
    metrics = step_metrics(tensors, replay=s.replay, updates=Updates(up.losses, up.grad_norms, per_minibatch),
                           measured=measured)
    return world.broadcast(metrics), tensors


def _merge_ranks(
    world: World, tensors: StepTensors, up: _Updates, sampling: dict[str, float], s: StepSettings,
    engine: RolloutEngine,
) -> tuple[StepTensors | None, list[dict[str, torch.Tensor]], dict[str, float]]:
    """Every rank's tensors merged on rank 0 into the whole step's, with each minibatch's loss diagnostics
    re-evaluated over all its rows (the ranks' own are over their rows only); ``None`` elsewhere."""
    def cpu(inputs: dict | None) -> dict | None:  # a CUDA tensor would unpickle onto its sender's GPU
        return None if inputs is None else {k: v.cpu() if torch.is_tensor(v) else v for k, v in inputs.items()}

    parts = world.gather((tensors.to("cpu"), [cpu(inputs) for inputs in up.loss_inputs], sampling))
    if parts is None:
        return None, [], {}
    merged = cat_step_tensors([p[0] for p in parts], engine.tokenizer.pad_token_id)
    per_minibatch = []
    for m, aux in enumerate(up.aux_losses):
        inputs = cat_loss_inputs([p[1][m] for p in parts if p[1][m] is not None])
        with torch.no_grad():
            metrics = rl.compute_loss_parts(s.preset.loss, **inputs).metrics
        if aux is not None:
            metrics["objective/router_aux_loss"] = torch.tensor(aux)
        per_minibatch.append(metrics)
    # Dynamic sampling's counts are the whole step's on every rank; shaping means over equal shares are averaged.
    combined = {key: parts[0][2][key] if key in _WHOLE_STEP_COUNTS else _mean([p[2][key] for p in parts])
                for key in parts[0][2]}
    return merged, per_minibatch, combined


_WHOLE_STEP_COUNTS = frozenset({keys.SAMPLING_DRAWN, keys.SAMPLING_DROPPED, keys.SAMPLING_EXTRA, keys.SAMPLING_FILLED})
"""Dynamic sampling's counts: every rank already holds the whole step's."""


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def step_seed(seed: int, step: int) -> int:
    """Seed of ``step``: each step's randomness depends only on (seed, step), so --resume reproduces it."""
    return (seed * 1_000_003 + step * 7_919) % (2**31 - 1)


def step_examples(task: Task, n: int, seed: int, step: int) -> list[Example]:
    return task.sample(n, random.Random(step_seed(seed, step)))


def extra_examples(task: Task, n: int, seed: int, step: int) -> Callable[[int], list[Example]]:
    """``draw_more`` of ``step``: dynamic sampling's ``n`` extra prompts of round ``r`` (deterministic per round)."""
    base = step_seed(seed, step)
    return lambda r: task.sample(n, random.Random(base * 1009 + r))
