"""The forwards of an RL step that exist only to measure, each declared once.

A step (:mod:`moestab.train.step`) trains: rollout -> advantages -> pi_old -> minibatch updates. Three more forwards
only measure. Each is a class below that says what it needs, what it fills and when the step calls it:

=================  ===================================  =========================  ==================================
measurement        when (the step's named point)        policy and routing         fills (``StepTensors`` fields)
=================  ===================================  =========================  ==================================
``FreeOldPolicy``  ``before_updates``                   pi_old, free               logp_old_free, routes_old_free,
                                                                                   entropy
``RoutingShare``   ``around_update``: scored before     each update's weights,     logp_update_counterfactual,
                   its forward (random state restored), the other routing than     clipped_counterfactual
                   clip-masked after                    the update's
``NewPolicy``      ``after_step``                       pi_new, free               logp_new, routes_new
=================  ===================================  =========================  ==================================

- **When each applies** (:meth:`applies`): ``FreeOldPolicy`` when the ratio's pi_old replays routes (R3 / TRR /
  routing-constant) and no objective reads the free routers' log-probs; otherwise pi_old's free forward is the
  ratio's own and the step runs it (:func:`free_old_forward`, the one function both call). ``RoutingShare`` with
  ``--routing-share``. ``NewPolicy`` always.
- **The measurement budget** (``measured`` rows, :mod:`moestab.recording.measure_budget`) applies to all three: each
scores
  the measured rows only, and the token-table columns it fills (:attr:`columns`) are then sampled
  (``StepTensors.sampled``).
- **Across processes** each forward runs on the process's own rows (a sharded forward is a collective, so every
  process runs it, with the same measured rows); rank 0 merges the step's tensors with the rest
  (``step._merge_ranks``), so a measurement needs no sharing of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from transformers import PreTrainedModel

from moestab import rl
from moestab.recording.batch import RolloutBatch
from moestab.routing import Routes
from moestab.run_folder import schema
from moestab.train.forward import PolicyForward, chunked_policy_forward, measured_forward, policy_forward

if TYPE_CHECKING:
    from moestab.train.step import StepSettings


def needs_router_logprobs(preset: rl.AlgorithmPreset) -> bool:
    """Whether the objective reads the routers' log-probs (RSPO's router shift)."""
    return any(name.startswith("router_logp") for name in preset.runtime_inputs)


def free_old_forward(model: PreTrainedModel, batch: RolloutBatch, chunks: list[torch.Tensor], s: StepSettings,
                     measured: torch.Tensor | None) -> PolicyForward:
    """pi_old with free routing, its routes recorded with the routers' statistics and the token entropy: on the
    ``measured`` rows only when given (None: every row)."""
    kwargs = dict(temperature=s.temperature, router_logprobs=needs_router_logprobs(s.preset), entropy=True,
                  router_stats=True)
    if measured is not None:
        return measured_forward(model, batch, chunks, measured, **kwargs)
    return chunked_policy_forward(model, batch, chunks, **kwargs)


class Measurement:
    """A measure-only forward of the step (module docstring). The step calls every applicable one at its named
    points; each hook does nothing unless the measurement overrides it. What it filled is its attributes named in
    :attr:`fills`."""

    fills: ClassVar[tuple[str, ...]] = ()
    """The ``StepTensors`` fields it fills (attributes of the same names)."""
    columns: ClassVar[frozenset[str]] = frozenset()
    """The token-table columns it fills: sampled when the step has a measurement budget."""

    def __init__(self, s: StepSettings, batch: RolloutBatch, dtype: torch.dtype) -> None:
        """``dtype``: the step's log-prob dtype."""
        self.settings = s

    @staticmethod
    def applies(s: StepSettings) -> bool:
        raise NotImplementedError

    def before_updates(self, model: PreTrainedModel, batch: RolloutBatch, chunks: list[torch.Tensor],
                       measured: torch.Tensor | None) -> None:
        """On pi_old's weights, before any update."""

    def before_update(self, model: PreTrainedModel, batch: RolloutBatch, rows: torch.Tensor, scored: torch.Tensor,
                      old_routes: Routes | None) -> None:
        """On minibatch ``rows``' update weights, before its update forward; ``scored`` indexes the rows measured;
        ``old_routes`` are pi_old's free routes ``[B, L, layers, k]`` (None under R3 / TRR: a measurement's)."""

    def after_update(self, rows: torch.Tensor, inputs: dict[str, Any]) -> None:
        """After the minibatch's loss (``inputs``: its keyword arguments), before its optimizer step (``rows`` is
        empty on a process holding none of the minibatch: it forwarded a stand-in row)."""

    def after_step(self, model: PreTrainedModel, batch: RolloutBatch, chunks: list[torch.Tensor],
                   measured: torch.Tensor | None) -> None:
        """On pi_new's weights, after the last update."""

    def filled(self) -> dict[str, Any]:
        """The ``StepTensors`` fields it filled."""
        return {name: getattr(self, name) for name in self.fills}


class FreeOldPolicy(Measurement):
    """pi_old's free routes and log-probs when the ratio's pi_old replays routes: how the trainer would have routed."""

    fills = ("logp_old_free", "routes_old_free", "entropy")
    columns = frozenset({schema.COL_ROUTES_OLD_FREE, schema.COL_LOGP_OLD_FREE})

    @staticmethod
    def applies(s: StepSettings) -> bool:
        return schema.REPLAY_ROUTES[s.replay] == "rollout" and not needs_router_logprobs(s.preset)

    def before_updates(self, model, batch, chunks, measured) -> None:
        f = free_old_forward(model, batch, chunks, self.settings, measured)
        self.logp_old_free, self.routes_old_free, self.entropy = f.logp, f.routes, f.entropy


class RoutingShare(Measurement):
    """Each minibatch scored once more on its update's weights with the other routing than its update forward's
    (pi_old's free routes replayed when the update routes freely, free routing when it replays), for routing's share
    of the ratio (``routing_share/*``, :mod:`moestab.metrics.routing_share`), and the tokens the loss would then have
    clipped. No grad, no recording, and the random number generators restored: the update forward that follows draws
    what it would have drawn without this one (dropout, router jitter), so the run is bit-identical with it off."""

    fills = ("logp_update_counterfactual", "clipped_counterfactual")

    def __init__(self, s: StepSettings, batch: RolloutBatch, dtype: torch.dtype) -> None:
        super().__init__(s, batch, dtype)
        mask = batch.response_mask  # [B, T]
        self.logp_update_counterfactual = torch.zeros(mask.shape, dtype=dtype, device=mask.device)  # [B, T]
        self.clipped_counterfactual = torch.zeros_like(mask)  # [B, T]
        self._scored: torch.Tensor | None = None  # [b, T] the current minibatch's, NaN on rows not scored

    @staticmethod
    def applies(s: StepSettings) -> bool:
        return s.routing_share

    def before_update(self, model, batch, rows, scored, old_routes) -> None:
        s = self.settings
        replay = old_routes.select(rows) if schema.REPLAY_ROUTES[s.replay] is None else None  # the other routing
        mb = batch.select(rows)
        logp = torch.full(mb.response_mask.shape, float("nan"), device=mb.response_mask.device,
                          dtype=next(model.parameters()).dtype)  # [b, T]
        if len(scored):
            on_cuda = next(model.parameters()).device.type == "cuda"
            with torch.no_grad(), torch.random.fork_rng(devices=[torch.cuda.current_device()] if on_cuda else []):
                out = policy_forward(model, mb.select(scored), temperature=s.temperature,
                                     replay=None if replay is None else replay.select(scored), record=False).logp
            logp[scored] = out.to(logp.device, logp.dtype)
        self._scored = logp

    def after_update(self, rows, inputs) -> None:
        logp = self._scored
        unscored = logp.isnan().all(dim=-1)  # [b] rows the measurement budget left out
        filled = torch.where(unscored[:, None], inputs["logp"].detach(), logp)  # [b, T] any finite stand-in
        clipped = rl.compute_clipped_mask(self.settings.preset.loss, **{**inputs, "logp": filled}) & ~unscored[:, None]
        if len(rows):
            # a NaN stand-in row is float32
            self.logp_update_counterfactual[rows] = logp.to(self.logp_update_counterfactual.dtype)
            self.clipped_counterfactual[rows] = clipped


class NewPolicy(Measurement):
    """pi_new's free routes and log-probs, after the step's last update: the other side of old->new."""

    fills = ("logp_new", "routes_new")
    columns = frozenset({schema.COL_ROUTES_NEW, schema.COL_LOGP_NEW})

    @staticmethod
    def applies(s: StepSettings) -> bool:
        return True

    @torch.no_grad()
    def after_step(self, model, batch, chunks, measured) -> None:
        t = self.settings.temperature
        f = (chunked_policy_forward(model, batch, chunks, temperature=t) if measured is None
             else measured_forward(model, batch, chunks, measured, temperature=t))
        self.logp_new, self.routes_new = f.logp, f.routes


MEASUREMENTS: tuple[type[Measurement], ...] = (FreeOldPolicy, RoutingShare, NewPolicy)
"""Every declared measurement, in the order the step runs them at a shared point."""


def step_measurements(s: StepSettings, batch: RolloutBatch, dtype: torch.dtype) -> list[Measurement]:
    """The measurements that apply to a step with settings ``s``, in the order they run."""
    return [cls(s, batch, dtype) for cls in MEASUREMENTS if cls.applies(s)]
