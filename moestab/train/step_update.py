"""pi_old and the minibatch updates of a step: pi_old as the ratio uses it (free, or replaying the rollout's routes),
then one optimizer step per minibatch, each minibatch's loss inputs filled from the objective's declared runtime
inputs (:data:`RUNTIME_INPUTS`), the measurements called around each update."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from moestab import rl
from moestab.recording.batch import RolloutBatch
from moestab.recording.measurements import FreeOldPolicy, Measurement, MeasureSetup, Scored, UpdateView
from moestab.routing import Routes, gather_router_logprobs
from moestab.run_folder import schema
from moestab.train.distributed import World
from moestab.train.forward import PolicyForward, chunk_logprobs, chunked_policy_forward, policy_forward, response_routes
from moestab.train.step_forwards import TrainForwards
from moestab.train.step_settings import StepSettings, needs_router_logprobs


class NonFiniteLossError(RuntimeError):
    """The policy loss became NaN or infinite."""


@dataclass(frozen=True)
class OldPolicy:
    free: Scored | None  # free routing, routes recorded with router stats; None: a measurement's (R3 / TRR)
    logp: torch.Tensor  # [B, T] as used in the ratio (NaN on ``from_first_update`` rows until the first update)
    routes: torch.Tensor  # [B, L, layers, k] routes that produced ``logp``
    ref_logp: torch.Tensor | None  # [B, T] reference policy, for the KL penalty
    from_first_update: bool = False  # the first minibatch's ``logp`` is the first update forward's (see _old_policy)


@dataclass(frozen=True)
class StepUpdates:
    minibatch: torch.Tensor  # [B]
    logp: torch.Tensor  # [B, T]
    clipped: torch.Tensor  # [B, T] bool
    routes: torch.Tensor  # [B, L, layers, k]
    losses: list[float]  # the global minibatch loss (every rank's share summed)
    grad_norms: list[float]
    loss_metrics: list[dict[str, torch.Tensor]]  # this process's rows: the global minibatch in one process
    loss_inputs: list[dict | None]  # detached loss inputs per minibatch (distributed only: rank 0 re-evaluates)
    aux_losses: list[float | None]  # the global load-balancing loss per minibatch, when on


@torch.no_grad()
def old_policy(
    model: PreTrainedModel, batch: RolloutBatch, chunks: list[torch.Tensor], s: StepSettings, setup: MeasureSetup,
    ref_model: PreTrainedModel | None, forwards: TrainForwards,
) -> OldPolicy:
    """pi_old as the ratio uses it: its free forward (routes recorded, for the records and R2; the forward the
    measurements run too, ``forwards.free``), or under R3 / TRR a forward replaying the rollout engine's routes
    (TRR: and its gates), whose free twin is a measurement (``measurements.FreeOldPolicy``) unless the objective reads
    the free routers' log-probs."""
    free = None if FreeOldPolicy.applies(setup) else forwards.free(
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
    return OldPolicy(free=free, logp=logp, routes=routes, ref_logp=ref_logp, from_first_update=from_first_update)


@dataclass(frozen=True)
class _LossContext:
    """What the providers of :data:`RUNTIME_INPUTS` read for one minibatch."""

    settings: StepSettings
    batch: RolloutBatch
    rows: torch.Tensor  # [b] the minibatch's rows
    fwd: PolicyForward  # the update forward of those rows
    old: OldPolicy


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


def loss_inputs(
    s: StepSettings, batch: RolloutBatch, rows: torch.Tensor, fwd: PolicyForward, old: OldPolicy,
    advantages: torch.Tensor,
) -> dict:
    """Keyword arguments of the registered loss for one minibatch."""
    ctx = _LossContext(s, batch, rows, fwd, old)
    return {
        **s.preset.loss_kwargs(),
        "logp": fwd.logp, "old_logp": old.logp[rows], "advantages": advantages[rows], "mask": batch.response_mask[rows],
        **{name: RUNTIME_INPUTS[name](ctx) for name in s.preset.runtime_inputs},
    }


@dataclass(frozen=True)
class _Minibatch:
    """One minibatch's update, as the step keeps it."""

    logp: torch.Tensor  # [b, T] the update forward's, detached (a stand-in row on a process holding none)
    routes: torch.Tensor  # [b, L, layers, k] the routes it used
    clipped: torch.Tensor  # [b, T] bool
    inputs: dict | None  # the loss's keyword arguments, detached (several processes only: rank 0 re-evaluates)
    metrics: dict[str, torch.Tensor]
    loss: float  # the global minibatch loss (every rank's share summed)
    grad_norm: float
    aux_loss: float | None  # the global load-balancing loss, when on


def _update(
    model: PreTrainedModel, optimizer: torch.optim.Optimizer, batch: RolloutBatch, m: int, rows: torch.Tensor,
    old: OldPolicy, advantages: torch.Tensor, s: StepSettings, world: World, replay_source: Routes | None,
    measured: torch.Tensor | None, watching: list[Measurement], forwards: TrainForwards,
) -> _Minibatch:
    """Minibatch ``m``'s forward, loss, backward and optimizer step, the watching measurements called around it."""
    # A rank holding none of this minibatch still runs its forward and backward (FSDP's collectives), on a stand-in row
    # whose loss weighs 0.
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
        old.logp[rows] = fwd.logp.detach().to(old.logp.dtype)  # pi_old's replayed log-probs: see old_policy
    inputs = loss_inputs(s, batch, held, fwd, old, advantages)
    parts = rl.compute_loss_parts(s.preset.loss, **inputs)
    _after_update(watching, rows, fwd, inputs, s)
    loss, metrics = parts.loss, parts.metrics
    if fwd.aux_loss is not None:  # the load-balancing loss users keep on during RL (TRL's router_aux_loss_coef)
        loss = loss + s.router_aux_loss_coef * fwd.aux_loss
        metrics = {**metrics, "objective/router_aux_loss": fwd.aux_loss.detach()}
    share, global_loss, grad_norm = _optimizer_step(model, optimizer, loss, batch.response_mask[rows], s, world, m)
    aux = None if fwd.aux_loss is None else world.sum(fwd.aux_loss.item() * share)
    kept = ({k: v.detach() if torch.is_tensor(v) else v for k, v in inputs.items()}
            if world.distributed and len(rows) else None)
    return _Minibatch(fwd.logp.detach(), fwd.routes.indices, parts.clipped, kept, metrics, global_loss, grad_norm, aux)


def _after_update(watching: list[Measurement], rows: torch.Tensor, fwd: PolicyForward, inputs: dict,
                  s: StepSettings) -> None:
    """The watching measurements' ``after_update``, with the loss's clip rule for log-probs of their own."""
    if not watching:
        return
    update = UpdateView(logp=fwd.logp.detach(), clipped=lambda logp: rl.compute_clipped_mask(
        s.preset.loss, **{**inputs, "logp": logp}))  # logp [b, T]
    for measure in watching:
        measure.after_update(rows, update)


def _optimizer_step(
    model: PreTrainedModel, optimizer: torch.optim.Optimizer, loss: torch.Tensor, mask: torch.Tensor, s: StepSettings,
    world: World, m: int,
) -> tuple[float, float, float]:
    """Backward and optimizer step of minibatch ``m``'s ``loss`` over its rows' response ``mask`` ``[b, T]``: this
    rank's share of the global minibatch, the global loss and the gradient norm."""
    # This rank's share of the global minibatch loss (one process: share 1.0, exactly).
    weight = rl.shard_weight(mask, s.preset.aggregation)
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
    return share, global_loss, grad_norm


def updates(
    model: PreTrainedModel, optimizer: torch.optim.Optimizer, batch: RolloutBatch, chunks: list[torch.Tensor],
    old: OldPolicy, advantages: torch.Tensor, s: StepSettings, world: World, measured: torch.Tensor | None,
    measures: list[Measurement], forwards: TrainForwards,
) -> StepUpdates:
    """One optimizer step per minibatch, the measurements called around each (``Measurement.before_update`` /
    ``after_update``). The first minibatch of a ``from_first_update`` pi_old takes its pi_old log-probs from its own
    update forward (see :func:`old_policy`)."""
    old_free_routes = None if old.free is None else old.free.routes  # [B, L, layers, k] R2's replay, or None (R3)
    replay_source = {None: None, "old": old_free_routes, "rollout": batch.routes}[schema.REPLAY_ROUTES[s.replay]]
    forwards.old_free_routes = old_free_routes  # routing share's other routing when the updates route freely
    watching = [measure for measure in measures if measure.watches_updates()]
    minibatch = torch.empty(batch.batch_size, dtype=torch.long)  # [B]
    logp = torch.zeros_like(old.logp)  # [B, T]
    clipped = torch.zeros_like(batch.response_mask)  # [B, T]
    routes = torch.empty_like(old.routes)  # [B, L, layers, k]
    done: list[_Minibatch] = []
    model.train()
    for m, rows in enumerate(chunks):
        minibatch[rows] = m
        one = _update(model, optimizer, batch, m, rows, old, advantages, s, world, replay_source, measured, watching,
                      forwards)
        done.append(one)
        if len(rows):
            logp[rows] = one.logp
            clipped[rows] = one.clipped
            routes[rows] = one.routes
    return StepUpdates(minibatch, logp, clipped, routes, [one.loss for one in done], [one.grad_norm for one in done],
                   [one.metrics for one in done], [one.inputs for one in done] if world.distributed else [],
                   [one.aux_loss for one in done])


def _full(norm: torch.Tensor) -> float:
    """A gradient norm as a float; sharded parameters give a DTensor holding the global norm."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
