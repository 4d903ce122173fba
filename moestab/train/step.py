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

import time
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from moestab import rl
from moestab.metrics import keys
from moestab.recording.capture_check import refuse_broken_capture
from moestab.recording.measurements import (
    Measurement,
    MeasureSetup,
    measured_metrics,
    sampled_columns,
    step_measurements,
)
from moestab.recording.step_metrics import Updates, step_metrics
from moestab.recording.step_tensors import StepTensors, cat_loss_inputs, cat_step_tensors
from moestab.tasks import Example, Task
from moestab.train.distributed import SINGLE, World, local_chunks
from moestab.train.engine import RolloutEngine
from moestab.train.step_forwards import TrainForwards
from moestab.train.step_sample import Sampled, sample
from moestab.train.step_settings import StepSettings, measure_setup, minibatch_rows, reward_dtype
from moestab.train.step_update import OldPolicy, StepUpdates, old_policy, updates


@keys.computes(keys.TIME_STEP, keys.TIME_ROLLOUT, keys.TIME_UPDATE, keys.MINIBATCHES)
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
    chunks = local_chunks(minibatch_rows(global_size, s.minibatches, generator), world, global_size)  # checked first
    engine.sync_weights()  # once per step on every rank (a collective when the policy is sharded)
    sampled = sample(engine, task, examples, s, draw_more, world, reward_dtype(next(model.parameters()).dtype))
    batch = sampled.batch
    advantages = rl.compute_advantages(s.preset.advantage, sampled.rewards, s.group_size)  # [B] on the host
    advantages = advantages.to(batch.response_mask.device)  # [B] beside the logits the loss weighs
    t_rollout = time.perf_counter() - t0
    measured = _measured_rows(measured, batch.batch_size, world)
    setup = measure_setup(s)  # which measurements run, decided once a step
    forwards = TrainForwards(model, batch, chunks, s)
    old = old_policy(model, batch, chunks, s, setup, ref_model, forwards)
    measures = _measurements(setup, old, batch.response_mask, world)
    for measure in measures:
        measure.before_updates(forwards, measured)
    if s.route_integrity == "refuse":  # before any update replays the captured routes
        _refuse_broken_capture(sampled, old, measures, s)
    t1 = time.perf_counter()
    up = updates(model, optimizer, batch, chunks, old, advantages, s, world, measured, measures, forwards)
    t_update = time.perf_counter() - t1
    for measure in measures:
        measure.after_step(forwards, measured)
    # The step's record on the host, once: its metrics and token tables are host-side (numpy, Arrow) work.
    tensors = _step_tensors(sampled, advantages, old, up, measures, measured).to("cpu")
    per_minibatch, sampling = up.loss_metrics, sampled.metrics
    if world.distributed:
        local = tensors
        tensors, per_minibatch, sampling = _merge_ranks(world, tensors, up, sampled.metrics, s, engine)
        if tensors is None:  # not rank 0: rank 0 computes the step's metrics, every rank gets them
            return world.broadcast(None), local
    times = {keys.TIME_STEP: time.perf_counter() - t0, keys.TIME_ROLLOUT: t_rollout, keys.TIME_UPDATE: t_update}
    metrics = step_metrics(tensors, replay=s.replay, updates=Updates(up.losses, up.grad_norms, per_minibatch),
                           measured={**times, **sampling, keys.MINIBATCHES: len(chunks), **measured_metrics(measures)})
    return world.broadcast(metrics), tensors


def _measured_rows(measured: torch.Tensor | None, batch_size: int, world: World) -> torch.Tensor | None:
    """The rows the measurements score ``[B]`` bool, checked; None when that is every row (the plain forwards)."""
    if measured is not None and measured.shape != (batch_size,):
        raise ValueError(f"measured must be [{batch_size}] bool, got {tuple(measured.shape)}")
    if measured is not None and bool(measured.all()):
        return None  # every row: the plain forwards, exactly as without a budget
    if measured is not None and world.distributed and bool(measured.any()):
        # A sharded forward is a collective: every process must run the same forwards. An unmeasured step (no row
        # on any process) skips them everywhere; a sample of groups would not.
        raise ValueError("a measurement budget sampling groups (measure_fraction < 1) runs in one process only "
                         "(nproc 1); measure_every works with any nproc")
    return measured


def _measurements(setup: MeasureSetup, old: OldPolicy, mask: torch.Tensor, world: World) -> list[Measurement]:
    """The step's measurements for a response mask ``mask`` ``[B, T]``; those reporting metrics of their own are
    refused over several processes (one process would compute them over its rows only)."""
    measures = step_measurements(setup, tuple(mask.shape), old.logp.dtype, mask.device)
    if world.distributed and any(m.keys for m in measures):
        raise ValueError(f"{[type(m).__name__ for m in measures if m.keys]} report metrics of their own, which one "
                         "process would compute over its rows only: run them with nproc 1")
    return measures


def _refuse_broken_capture(sampled: Sampled, old: OldPolicy, measures: list[Measurement], s: StepSettings) -> None:
    """Stop before the updates when the rollout's captured routes fail the route-integrity checks
    (``--route-integrity refuse``), judged against pi_old's free routes (the ratio's, or ``FreeOldPolicy``'s)."""
    filled = [m.filled()["routes_old_free"] for m in measures if "routes_old_free" in m.fills]
    refuse_broken_capture(sampled.batch, old.free.routes if old.free is not None else next(iter(filled), None),
                          s.replay)


def _step_tensors(sampled: Sampled, advantages: torch.Tensor, old: OldPolicy, up: StepUpdates,
                  measures: list[Measurement], measured: torch.Tensor | None) -> StepTensors:
    """The step's record: what it sampled, pi_old, the updates and what the measurements filled."""
    free_old = {} if old.free is None else {"logp_old_free": old.free.logp, "routes_old_free": old.free.routes,
                                            "entropy": old.free.entropy}  # else FreeOldPolicy fills them
    return StepTensors.of(dict(
        batch=sampled.batch, examples=sampled.examples, rewards=sampled.rewards, correct=sampled.correct,
        advantages=advantages, minibatch=up.minibatch, logp_old=old.logp, logp_update=up.logp, clipped=up.clipped,
        routes_old=old.routes, routes_update=up.routes, **free_old,
        **{k: v for measure in measures for k, v in measure.filled().items()},
        measured=measured, sampled=sampled_columns(measures, measured),
    ))


def _merge_ranks(
    world: World, tensors: StepTensors, up: StepUpdates, sampling: dict[str, float], s: StepSettings,
    engine: RolloutEngine,
) -> tuple[StepTensors | None, list[dict[str, torch.Tensor]], dict[str, float]]:
    """Every rank's tensors merged on rank 0 into the whole step's, with each minibatch's loss diagnostics
    re-evaluated over all its rows (the ranks' own are over their rows only); ``None`` elsewhere."""
    def cpu(inputs: dict | None) -> dict | None:  # a CUDA tensor would unpickle onto its sender's GPU
        return None if inputs is None else {k: v.cpu() if torch.is_tensor(v) else v for k, v in inputs.items()}

    parts = world.gather((tensors, [cpu(inputs) for inputs in up.loss_inputs], sampling))
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


