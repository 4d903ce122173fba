"""The forwards of an RL step that exist only to measure, each declared once and run by every trainer.

A step trains: rollout -> advantages -> pi_old -> minibatch updates. Three more forwards only measure. Each is a
class below that says when it applies, what it fills and at which of the step's named points it runs; the trainer
(``moestab train``'s :mod:`moestab.train.step`, the TRL integration's :mod:`moestab.integrations.trl.trainer`) calls
every applicable one at those points and hands it a :class:`StepForwards`, the trainer's way of running its policy:

=================  ===================================  =========================  ==================================
measurement        when (the step's named point)        policy and routing         fills (``StepTensors`` fields)
=================  ===================================  =========================  ==================================
``FreeOldPolicy``  ``before_updates``                   pi_old, free               logp_old_free, routes_old_free,
                                                                                   entropy
``RoutingShare``   around each update: scored on its    each update's weights,     logp_update_counterfactual,
                   weights and random state             the other routing than     clipped_counterfactual
                   (``before_update``), clip-masked     the update's
                   after its loss (``after_update``)
``NewPolicy``      ``after_step``                       pi_new, free               logp_new, routes_new
=================  ===================================  =========================  ==================================

- **When each applies** (:meth:`Measurement.applies`, of a :class:`MeasureSetup`): ``FreeOldPolicy`` when the ratio's
  pi_old replays routes (R3 / TRR / routing-constant) and no objective reads the free routers' log-probs (otherwise
  pi_old's free forward is the ratio's own and the trainer runs it); ``RoutingShare`` with ``--routing-share``
  (TRL: ``RecordSettings(routing_share=True)``), its :attr:`Measurement.switch`; ``NewPolicy`` always.
- **The measurement budget** (``measured`` rows, :mod:`moestab.recording.measure_budget`) applies to all three: each
  scores the measured rows only, and the token-table columns it fills (:attr:`Measurement.columns`) are then sampled
  (``StepTensors.sampled``). One exception, in TRL without its own pi_old forward: the budget is drawn at the last
  micro-step, after the update hooks, so routing's share covers every row there (it costs no forward: pi_old's
  routes are the update's own).
- **Metrics of its own**: a measurement may also report metrics.jsonl keys (:attr:`Measurement.keys`, rows of
  :mod:`moestab.metrics.keys` with ``computed=False``) from :meth:`Measurement.metrics`. Adding a measurement is one
  class here (or in its own module, listed in :data:`MEASUREMENTS`) plus its key rows: both trainers then run it
  and write what it fills (``tests/train/test_measurement_extension.py``).
- **Across processes** (``moestab train --nproc``) each forward runs on the process's own rows; rank 0 merges the
  step's tensors with the rest, so a measurement that only fills tensors needs no sharing of its own. Its own
  metrics would be one process's: the step refuses a measurement with keys over several processes.
- **Trainers' call orders.** ``moestab train`` calls ``before_update`` before each minibatch's update forward;
  TRL's ``training_step`` runs the loss forward and backward in one call, so the TRL integration calls it after
  them, on the same weights (no optimizer step yet) with the random state the loss forward started from, then
  ``after_update`` at once; it calls both for the last pass over the generation batch only (the one recorded).
  ``before_updates`` runs before any optimizer step of the step in both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

from moestab.recording.step_fields import STEP_FIELDS, StepField
from moestab.routing import Routes
from moestab.run_folder import schema


@dataclass(frozen=True)
class MeasureSetup:
    """What decides which measurements a step runs."""

    replay: str
    """The routing replay of the ratio and updates (``schema.REPLAY_MODES``; TRL: ``"off"``)."""
    switched_on: frozenset[str] = frozenset()
    """The measurement switches the trainer's settings turn on (:attr:`Measurement.switch`, :func:`switched_on`)."""
    router_logprobs: bool = False
    """The objective reads the free routers' log-probs (RSPO): pi_old's free forward is then the ratio's own."""


@dataclass(frozen=True)
class Scored:
    """A no-grad forward of the policy over the step's rows, in the step's row order."""

    logp: torch.Tensor  # [B, T] log-prob of each response token (NaN on rows not measured)
    routes: Routes  # [B, L, layers, k] (-1 on rows not measured)
    entropy: torch.Tensor | None  # [B, T] token entropy, when asked
    mask: torch.Tensor  # [B, T] bool: the response tokens scored (none on rows not measured)


@dataclass(frozen=True)
class UpdateView:
    """One minibatch's update as a measurement sees it after the loss."""

    logp: torch.Tensor
    """``[b, T]`` the update forward's log-probs, detached."""
    clipped: Callable[[torch.Tensor], torch.Tensor]
    """The tokens ``[b, T]`` bool the trainer's loss would clip were the update's log-probs these ``[b, T]``."""


class StepForwards(Protocol):
    """How a trainer runs its policy for a measurement (``moestab train``: :class:`moestab.train.step_forwards.
    TrainForwards`; TRL: :class:`moestab.integrations.trl.forwards.TrlForwards`). No grad, nothing recorded into the
    trainer's own records. :meth:`free` runs as the trainer's own forwards do, in training mode: in a model with
    dropout or router jitter its draws advance the random generators, as pi_new's always have (the embedded models
    and the MoE families moestab tests draw none); :meth:`other_routing` restores them."""

    def free(self, measured: torch.Tensor | None, *, entropy: bool = False, router_stats: bool = False,
             router_logprobs: bool = False) -> Scored:
        """The policy as its weights are now, routing freely, over the step's rows (``measured`` ``[B]`` bool: those
        only; None: every row), in the step's chunks; routes recorded (with the routers' statistics, log-probs when
        asked)."""
        ...

    def other_routing(self, rows: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
        """``[b, T]`` the log-probs of minibatch ``rows`` on its update's weights and random state, with the other
        routing than its update forward's (pi_old's free routes replayed when the update routes freely, free routing
        when it replays); only rows ``scored`` (indices into ``rows``), NaN on the others."""
        ...


class Measurement:
    """A measure-only forward of the step (module docstring). The trainer calls every applicable one at its named
    points; each hook does nothing unless the measurement overrides it. What it filled is its attributes named in
    :attr:`fills`, what it reports its :meth:`metrics`."""

    fills: ClassVar[tuple[str, ...]] = ()
    """The ``StepTensors`` fields it fills (attributes of the same names)."""
    declares: ClassVar[tuple[StepField, ...]] = ()
    """The fields it fills that :data:`moestab.recording.step_fields.STEP_FIELDS` does not declare: its own, with
    their token-table columns (``StepTensors.extra`` carries them, the token table writes them)."""
    keys: ClassVar[tuple[str, ...]] = ()
    """The metrics.jsonl keys it reports (rows of :mod:`moestab.metrics.keys`, ``computed=False``)."""
    switch: ClassVar[str | None] = None
    """The trainer setting that turns it on: a field of that name in ``moestab train``'s ``TrainConfig`` and in the TRL
    integration's ``RecordSettings`` (``--routing-share``: ``routing_share``); None when no setting does. The
    trainers pass what their settings turn on as :attr:`MeasureSetup.switched_on` (:func:`switched_on`)."""

    def __init__(self, setup: MeasureSetup, shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> None:
        """``shape``: the step's ``[B, T]`` (rows x response tokens); ``dtype``: its log-prob dtype."""
        self.setup = setup

    @staticmethod
    def applies(setup: MeasureSetup) -> bool:
        raise NotImplementedError

    def before_updates(self, fwd: StepForwards, measured: torch.Tensor | None) -> None:
        """On pi_old's weights, before any update."""

    def before_update(self, fwd: StepForwards, rows: torch.Tensor, scored: torch.Tensor) -> None:
        """On minibatch ``rows``' update weights and random state; ``scored`` indexes the rows measured."""

    def after_update(self, rows: torch.Tensor, update: UpdateView) -> None:
        """After the minibatch's loss, before its optimizer step (``rows`` is empty on a process holding none of the
        minibatch: it forwarded a stand-in row, which ``update`` holds)."""

    def after_step(self, fwd: StepForwards, measured: torch.Tensor | None) -> None:
        """On pi_new's weights, after the last update."""

    @classmethod
    def columns(cls) -> frozenset[str]:
        """The token-table columns it fills (its fields' declared columns): sampled when the step has a measurement
        budget."""
        declared = {f.name: f for f in (*STEP_FIELDS, *cls.declares)}
        missing = [name for name in cls.fills if name not in declared]
        if missing:
            raise ValueError(f"{cls.__name__} fills {missing}, which no step field declares (STEP_FIELDS, declares)")
        return frozenset(column for name in cls.fills if (column := declared[name].column) is not None)

    def filled(self) -> dict[str, Any]:
        """The ``StepTensors`` fields it filled."""
        return {name: getattr(self, name) for name in self.fills}

    def metrics(self) -> dict[str, float]:
        """Its metrics.jsonl values, keys among :attr:`keys`; none on a step that measured no row (the budget's
        sampled keys are absent on an unmeasured step)."""
        return {}

    @classmethod
    def watches_updates(cls) -> bool:
        """Whether it overrides a hook around the updates (the trainer skips building what they read otherwise)."""
        return cls.before_update is not Measurement.before_update or cls.after_update is not Measurement.after_update


class FreeOldPolicy(Measurement):
    """pi_old's free routes and log-probs when the ratio's pi_old replays routes: how the trainer would have routed."""

    fills = ("logp_old_free", "routes_old_free", "entropy")

    @staticmethod
    def applies(setup: MeasureSetup) -> bool:
        return schema.REPLAY_ROUTES[setup.replay] == "rollout" and not setup.router_logprobs

    def before_updates(self, fwd, measured) -> None:
        f = fwd.free(measured, entropy=True, router_stats=True)
        self.logp_old_free, self.routes_old_free, self.entropy = f.logp, f.routes, f.entropy


class RoutingShare(Measurement):
    """Each minibatch scored once more on its update's weights with the other routing than its update forward's, for
    routing's share of the ratio (``routing_share/*``, :mod:`moestab.metrics.routing_share`), and the tokens the loss
    would then have clipped. The trainer's forward leaves its random generators as the update forward finds them, so
    the run is bit-identical with it off."""

    fills = ("logp_update_counterfactual", "clipped_counterfactual")
    switch = "routing_share"

    def __init__(self, setup: MeasureSetup, shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> None:
        super().__init__(setup, shape, dtype, device)
        self.logp_update_counterfactual = torch.zeros(shape, dtype=dtype, device=device)  # [B, T]
        self.clipped_counterfactual = torch.zeros(shape, dtype=torch.bool, device=device)  # [B, T]
        self._scored: torch.Tensor | None = None  # [b, T] the current minibatch's, NaN on rows not scored

    @staticmethod
    def applies(setup: MeasureSetup) -> bool:
        return RoutingShare.switch in setup.switched_on

    def before_update(self, fwd, rows, scored) -> None:
        self._scored = fwd.other_routing(rows, scored)  # [b, T]

    def after_update(self, rows, update) -> None:
        logp = self._scored
        unscored = logp.isnan().all(dim=-1)  # [b] rows the measurement budget left out
        filled = torch.where(unscored[:, None], update.logp, logp)  # [b, T] any finite stand-in
        clipped = update.clipped(filled) & ~unscored[:, None]
        if len(rows):
            # a NaN stand-in row is float32
            self.logp_update_counterfactual[rows] = logp.to(self.logp_update_counterfactual.dtype)
            self.clipped_counterfactual[rows] = clipped


class NewPolicy(Measurement):
    """pi_new's free routes and log-probs, after the step's last update: the other side of old->new."""

    fills = ("logp_new", "routes_new")

    @staticmethod
    def applies(setup: MeasureSetup) -> bool:
        return True

    def after_step(self, fwd, measured) -> None:
        f = fwd.free(measured)
        self.logp_new, self.routes_new = f.logp, f.routes


MEASUREMENTS: tuple[type[Measurement], ...] = (FreeOldPolicy, RoutingShare, NewPolicy)
"""Every declared measurement, in the order the trainers run them at a shared point."""


def switched_on(settings: object) -> frozenset[str]:
    """The measurement switches a trainer's ``settings`` (``TrainConfig``, TRL's ``RecordSettings``) turn on: each
    declared measurement's :attr:`Measurement.switch` that is a true attribute of ``settings``."""
    return frozenset(cls.switch for cls in MEASUREMENTS if cls.switch and getattr(settings, cls.switch, False))


def step_measurements(setup: MeasureSetup, shape: tuple[int, int], dtype: torch.dtype,
                      device: torch.device) -> list[Measurement]:
    """The measurements that apply to a step of ``setup`` whose rows x response tokens are ``shape`` ``[B, T]``, in
    the order they run."""
    return [cls(setup, shape, dtype, device) for cls in MEASUREMENTS if cls.applies(setup)]


def updates_watched(setup: MeasureSetup) -> bool:
    """Whether a measurement of a step of ``setup`` runs around the updates (known before the step starts)."""
    return any(cls.applies(setup) and cls.watches_updates() for cls in MEASUREMENTS)


def rng_devices(model: torch.nn.Module) -> list[int]:
    """The CUDA device of ``model``'s parameters, as ``torch.random.fork_rng`` takes it (none on a CPU)."""
    device = next(model.parameters()).device
    if device.type != "cuda":
        return []
    return [torch.cuda.current_device() if device.index is None else device.index]


def sampled_columns(measures: list[Measurement], measured: torch.Tensor | None) -> frozenset[str]:
    """The token-table columns the measurement budget sampled (none without a budget)."""
    return frozenset() if measured is None else frozenset().union(*(m.columns() for m in measures))


def measured_metrics(measures: list[Measurement]) -> dict[str, float]:
    """Every measurement's own metrics; ``ValueError`` for a key it does not declare in :attr:`Measurement.keys`."""
    out: dict[str, float] = {}
    for m in measures:
        values = m.metrics()
        stray = sorted(set(values) - set(m.keys))
        if stray:
            raise ValueError(f"{type(m).__name__} reported {stray}, not among its declared keys {list(m.keys)}")
        out.update(values)
    return out
