"""``RoutingRecords``: the subclass hook that makes TRL's ``GRPOTrainer`` write a moestab run folder.

It overrides only methods ``transformers.Trainer`` documents for overriding (``train``, ``training_step``,
``compute_loss``, ``log``) and adds a ``TrainerCallback`` for the end of each optimizer step; every override calls TRL's
own method unchanged. :class:`TrlRecords` holds the recording state, so the trainer class stays three delegations.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import trl
import yaml
from transformers import TrainerCallback

from moestab.integrations.trl.capture import Captured, ForwardCapture
from moestab.integrations.trl.cycle import (
    CycleRecord,
    LossStep,
    RowMatcher,
    assemble,
    measured_rows,
    old_rows,
    rollout_ids,
    trained_ids,
)
from moestab.integrations.trl.forwards import MicroStep, TrlForwards
from moestab.integrations.trl.settings import RecordSettings, check_supported, clip_rule, cycle_layout, run_config
from moestab.integrations.trl.stillness import stillness
from moestab.metrics import keys
from moestab.metrics.collapse_warning import CollapseWarning
from moestab.recording.capture_check import verdict, warn_once
from moestab.recording.collapse_watch import CollapseMonitor
from moestab.recording.environment import environment as run_environment
from moestab.recording.measure_budget import RULE
from moestab.recording.measurements import (
    Measurement,
    MeasureSetup,
    UpdateView,
    measured_metrics,
    rng_devices,
    step_measurements,
    switched_on,
    updates_watched,
)
from moestab.recording.step_metrics import step_metrics
from moestab.recording.step_records import write_step_metrics, write_step_tokens
from moestab.recording.step_tensors import StepTensors
from moestab.recording.trackers import mean_scalars, scalars
from moestab.routing import RecordingError, RoutingRecorder, find_routers
from moestab.routing.compat import check_generate_recording
from moestab.run_folder import Remedies, RunFolder, schema
from moestab.run_folder.run_info import ModelInfo
from moestab.run_folder.writer import RunWriter

LOSS_INPUTS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "old_per_token_logps")
"""The keys of TRL's micro-batch that a step's records use."""

UNSUPPORTED_FEATURES = {
    "tools": "tool calls put tool output inside completions",
    "rollout_func": "a custom rollout function generates outside the policy's generate()",
    "environment_factories": "environments generate multi-turn episodes",
}
"""``GRPOTrainer`` features whose completions moestab cannot align with the policy's generate() calls."""


RUN_SUBFOLDERS = (schema.TOKENS_DIR,)
"""The run's subfolders: per-token tables only (TRL saves its own checkpoints, and the run cannot be resumed)."""

NOTHING_TO_LEARN = "nothing to learn"
"""Kind of the warning at the first step whose every advantage is 0 (once a run)."""
logger = logging.getLogger(__name__)
"""Warnings about the run's numbers (:mod:`~moestab.integrations.trl.stillness`), also kept in run.json."""

REMEDIES = Remedies(folder="run_dir", overwrite="RecordSettings(..., overwrite=True)", resume=None)
"""How a refusal of the run folder tells a TRL user to go on (the policy is ``moestab train``'s: ``RunFolder``)."""


@dataclass
class _Measuring:
    """The open cycle's measurements (:mod:`moestab.recording.measurements`) and what they run on."""

    measures: list[Measurement]
    forwards: TrlForwards
    pool: torch.Tensor  # [N, L] the generated sequences, as the policy was fed them
    matcher: RowMatcher  # the last pass's micro-batch rows -> generation rows
    trained: list[torch.Tensor] = field(default_factory=list)  # [b] generation rows of each last-pass micro-batch
    measured: torch.Tensor | None = None  # [N] the budget's rows (None: every row), from before_updates on


class TrlRecords:
    """The recording state of one trainer: settings checked at construction, one ``CycleRecord`` at a time.

    A cycle (moestab's step) is one TRL generation batch and the optimizer steps made from it. It is recorded if
    ``settings.budget`` measures its step: each ``training_step`` of it runs inside a ``ForwardCapture``; after its
    last optimizer step pi_new is computed and the step is written.
    """

    def __init__(self, trainer: Any, settings: RecordSettings) -> None:
        args = trainer.args
        check_supported(args)
        for name, why in UNSUPPORTED_FEATURES.items():
            if getattr(trainer, name, None):
                raise ValueError(f"moestab cannot record this GRPOTrainer run: {name} is set ({why})")
        self.trainer, self.settings = trainer, settings
        self.setup = MeasureSetup(replay="off", switched_on=switched_on(settings))  # TRL replays no routes
        self.layout, self.clip = cycle_layout(args), clip_rule(args)
        # The rollout's log-probs are the sampling distribution's: TRL's generation config (generation_kwargs
        # included), which may differ from the temperature its trainer side scores at.
        self.temperature = float(trainer.generation_config.temperature or 1.0)  # None samples at 1, as in HF
        model = trainer.model
        sites = find_routers(model)  # checks every router against its adapter once; the recorders skip it
        check_generate_recording(model)  # this transformers' generate() is recorded as one forward would be
        moe_layers = [s.layer for s in sites]
        refused = next((s.adapter for s in sites if s.adapter.training_replay is not None), None)
        if settings.routing_share and refused is not None:  # its forward replays routes in TRL's training mode
            raise ValueError(f"routing_share replays pi_old's routes in training mode, which {refused.family} does "
                             f"not allow: {refused.training_replay}")
        wanted = settings.record_layers or tuple(moe_layers)
        unknown = sorted(set(wanted) - set(moe_layers))
        if unknown:
            raise ValueError(f"record_layers {unknown} are not MoE layers of this model; valid: {moe_layers}")
        self.layer_slots = [moe_layers.index(layer) for layer in sorted(set(wanted))]
        self.model_info = ModelInfo(family=model.config.model_type, moe_layers=tuple(moe_layers),
                                    num_experts=sites[0].num_experts, top_k=sites[0].top_k,
                                    recorded_layers=tuple(sorted(set(wanted))))
        # A micro-step's recorder computes router margins and entropies (pi_old's go into the records); pi_new's
        # forward needs only its routes.
        self.recorder = RoutingRecorder(model, margin=True, entropy=True, verify=False)
        self.new_recorder = RoutingRecorder(model, margin=False, entropy=False, verify=False)
        self.run_dir = Path(settings.run_dir)
        self.writer: RunWriter | None = None
        self._stack: ExitStack | None = None
        self._cycle: CycleRecord | None = None
        self._measuring: _Measuring | None = None  # the open cycle's measurements
        self._inputs: dict[str, Any] | None = None
        self._rng: tuple[torch.Tensor, list[torch.Tensor]] | None = None
        self._expect_inputs = False
        self._started = 0.0
        self._warned: set[str] = set()  # kinds of stillness already reported: each once a run
        self._unlogged: list[dict[str, float]] = []  # the tracker scalars of steps written since TRL's last log
        self.collapse = CollapseMonitor(settings.on_collapse_warning)
        self.collapse_stop: str | None = None  # the warning that stopped training (on_collapse_warning="stop")
        self._trl_logged: dict[str, float] = {}  # TRL's last logged values of the rule's baseline signals

    # ---- the run ---------------------------------------------------------------------------------
    @contextmanager
    def session(self, *, resuming: bool) -> Iterator[None]:
        """Around ``trainer.train()``: the run folder is checked first; run.json ends ``finished``, ``failed`` or
        ``interrupted`` (with the error) however training ends."""
        if resuming:
            raise ValueError("moestab's TRL records cannot resume from a checkpoint: TRL regenerates mid-cycle "
                             "after a resume; start a new run folder")
        with ExitStack() as stack:
            # One writer per folder: held from before anything there is deleted or written until run.json says how
            # training ended; another live writer's folder is refused (RunLockedError names it). The folder is then
            # checked as ``moestab train`` checks it: absent, empty, or (overwrite) a run not being written, deleted.
            folder = RunFolder(self.run_dir)
            stack.enter_context(folder.lock(note=logger.warning))  # a dead writer's lock taken over: seen by default
            if folder.check_new(overwrite=self.settings.overwrite, remedies=REMEDIES):
                folder.clear()
            self.writer = None
            self._stack = stack
            try:
                yield
            except KeyboardInterrupt as exc:
                self._stop(schema.STATUS_INTERRUPTED, exc)
                raise
            except BaseException as exc:
                self._stop(schema.STATUS_FAILED, exc)
                raise
            finally:
                # a cycle cut off by the end of training is not written
                self._cycle, self._measuring, self._stack = None, None, None
            if self.writer is not None and self.collapse_stop is not None:
                self.writer.update(status=schema.STATUS_INTERRUPTED, error=self.collapse_stop)
            elif self.writer is not None:
                self.writer.update(status=schema.STATUS_FINISHED)

    def _stop(self, status: str, exc: BaseException) -> None:
        if self.writer is not None:
            self.writer.update(status=status, error=f"{type(exc).__name__}: {exc}")

    def start(self, max_steps: int) -> None:
        """Create the run folder (``on_train_begin``, when TRL knows its number of optimizer steps)."""
        if self._stack is None:
            raise RecordingError("call trainer.train() to record: the run folder is written around it")
        args, model = self.trainer.args, self.trainer.model
        name = model.config.name_or_path or f"{model.config.model_type} (built in code)"
        config = run_config(args, model=name, steps=max_steps // self.layout.optimizer_steps, settings=self.settings)
        environment = run_environment(trl=trl.__version__, measure_rule=RULE)
        writer = RunWriter(self.run_dir)
        writer.start(config=config, model=self.model_info, environment=environment,
                     config_yaml=yaml.safe_dump(config, sort_keys=False), subfolders=RUN_SUBFOLDERS)
        self.writer = writer  # from here on, however training ends, run.json says so
        self._stack.enter_context(writer.beating())

    # ---- one micro-step --------------------------------------------------------------------------
    def capture(self, model: torch.nn.Module, global_step: int) -> ForwardCapture | None:
        """The capture of the coming ``training_step``, or ``None`` when its cycle is not recorded."""
        cycle = global_step // self.layout.optimizer_steps + 1  # 1-based, as the budget counts steps
        if self.writer is None or not self.settings.budget.measures_step(cycle):
            return None
        if model is not self.trainer.model:
            raise RecordingError("the trained module is a wrapper of trainer.model (several processes or a "
                                 "distributed wrapper): moestab records one process only")
        if self._cycle is None:
            self._started = time.perf_counter()
        self._inputs, self._expect_inputs = None, True
        return ForwardCapture(model, self.recorder, temperature=self.temperature)

    def loss_inputs(self, inputs: dict[str, Any]) -> None:
        """TRL's micro-batch of the current loss (from ``compute_loss``; ignored outside a recorded step)."""
        if not self._expect_inputs:
            return
        if inputs.get("tool_mask") is not None:
            raise RecordingError("the micro-batch has a tool_mask: completions hold tokens the policy did not sample")
        self._inputs = {key: inputs[key] for key in LOSS_INPUTS if key in inputs}
        if updates_watched(self.setup):  # the generators' state the loss forward starts from (dropout, jitter)
            self._rng = torch.get_rng_state(), [torch.cuda.get_rng_state(d) for d in rng_devices(self.trainer.model)]

    def add_micro_step(self, captured: Captured) -> None:
        """File one recorded ``training_step``: a cycle opens with the one that generated. Its measurements run
        (:meth:`_measure_micro_step`) before the micro-step's optimizer step."""
        self._expect_inputs = False
        if self._cycle is None:
            if len(captured.generations) != 1:
                raise RecordingError(f"the first micro-step of a cycle ran {len(captured.generations)} generate() "
                                     "calls, expected 1 (TRL generates once per generation batch)")
            old = [call for call in captured.scoring if not call.grad]
            self._cycle = CycleRecord(captured.generations[0], old, [], self._started)
            self._measuring = self._open_measures(self._cycle)
        elif captured.generations:
            raise RecordingError("TRL generated inside a cycle: its generation batches no longer line up with the "
                                 "optimizer steps moestab expects")
        losses = [call for call in captured.scoring if call.grad]
        if self._inputs is None:
            raise RecordingError("a recorded training step did not pass through compute_loss")
        if len(losses) != 1:
            raise RecordingError(f"a training step ran {len(losses)} forwards with grad, expected TRL's loss forward")
        self._cycle.steps.append(LossStep(self._inputs, losses[0]))
        self._measure_micro_step(MicroStep(losses[0], self._rng))
        self._inputs, self._rng = None, None

    # ---- the step's measurements (moestab.recording.measurements) in TRL's call order -------------------------
    def _open_measures(self, cycle: CycleRecord) -> _Measuring:
        gen = cycle.generation
        shape = (gen.prompt_ids.shape[0], gen.fed.shape[1] + 1)  # [N, C]: the last sampled token is never fed
        pool = rollout_ids(gen).cpu()  # [N, L]
        return _Measuring(measures=step_measurements(self.setup, shape, torch.float32, torch.device("cpu")),
                          forwards=TrlForwards(self.trainer, cycle, self.layout, self.temperature,
                                               plain=self.new_recorder, stats=self.recorder),
                          pool=pool, matcher=RowMatcher(pool))

    def _measure_micro_step(self, micro: MicroStep) -> None:
        """The measurements' hooks of one micro-step, after its loss forward and backward, before its optimizer step:
        ``before_updates`` on the first (TRL's pi_old forward then exists) or, when TRL computes no pi_old (one
        optimizer step per cycle), on the last, once pi_old's calls (the loss forwards) are all known;
        ``before_update`` / ``after_update`` on each of the last pass, the one recorded (:func:`cycle.last_pass`), on
        the budget's rows once it is drawn (every row before: TRL without its pi_old forward)."""
        cycle, layout, m = self._cycle, self.layout, self._measuring
        index = len(cycle.steps) - 1
        if layout.old_forward and index == 0:
            self._before_updates()
        if index >= layout.micro_steps - layout.micro_per_pass:
            step = cycle.steps[-1]
            prompt_len = cycle.generation.prompt_ids.shape[1]
            rows = m.matcher.match(trained_ids(step, m.pool, prompt_len))  # [b] generation rows
            m.trained.append(rows)
            watching = [measure for measure in m.measures if measure.watches_updates()]
            if watching:
                scored = torch.arange(len(rows)) if m.measured is None else torch.nonzero(m.measured[rows]).flatten()
                m.forwards.micro_step = micro
                for measure in watching:
                    measure.before_update(m.forwards, rows, scored)  # [b'] scored: indices into rows
                update = self._update_view(step)
                for measure in watching:
                    measure.after_update(rows, update)
                m.forwards.micro_step = None
        if not layout.old_forward and index == layout.micro_steps - 1:
            self._before_updates()

    def _before_updates(self) -> None:
        """The budget's draw of pi_old's calls (a seeded share of them; pi_new re-runs exactly these), then the
        measurements' ``before_updates`` on pi_old's weights."""
        cycle, m = self._cycle, self._measuring
        m.forwards.old_rows = old_rows(cycle, self.layout, m.trained)
        step = self.trainer.state.global_step // self.layout.optimizer_steps + 1  # before this cycle's first update
        picked = self.settings.new_chunks(len(m.forwards.old_rows), int(self.trainer.args.seed) + step)
        m.measured = measured_rows(cycle, self.layout, m.forwards.old_rows, picked)
        for measure in m.measures:
            measure.before_updates(m.forwards, m.measured)

    def _update_view(self, step: LossStep) -> UpdateView:
        """The micro-step's update as a measurement sees it: its log-probs ``[b, C]`` and TRL's clip rule on the
        micro-batch (pi_old's log-probs are TRL's ``old_per_token_logps``, or the update's own when TRL computes
        none)."""
        prompt_len = self._cycle.generation.prompt_ids.shape[1]
        logp = step.call.log_probs.detach()[:, prompt_len - 1 :].float().cpu()  # [b, C]
        inputs = {key: value.detach().cpu() for key, value in step.inputs.items()}
        old = inputs["old_per_token_logps"].float() if self.layout.old_forward else logp  # [b, C]
        advantages, mask = inputs["advantages"].float(), inputs["completion_mask"].bool()  # [b], [b, C]
        return UpdateView(logp=logp, clipped=lambda other: self.clip.mask(other, old, advantages, mask))

    # ---- the end of a cycle ----------------------------------------------------------------------
    def step_end(self, global_step: int) -> None:
        """After an optimizer step: a cycle whose micro-steps have all run is complete; write it."""
        cycle = self._cycle
        if cycle is None or len(cycle.steps) < self.layout.micro_steps:
            return
        m, self._cycle, self._measuring = self._measuring, None, None
        step = global_step // self.layout.optimizer_steps  # 1-based: the cycle that just ended
        for measure in m.measures:
            measure.after_step(m.forwards, m.measured)
        tokenizer = self.trainer.processing_class
        t = assemble(cycle, m.trained, m.measures, m.measured, layout=self.layout, clip=self.clip,
                     group_size=int(self.trainer.args.num_generations),
                     decode=lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True))
        measured = {keys.TIME_STEP: time.perf_counter() - cycle.started, keys.MINIBATCHES: self.layout.optimizer_steps,
                    **measured_metrics(m.measures)}
        metrics = step_metrics(t, replay="off", measured=measured)  # no updates: TRL logs its loss and grad norm
        warning = self._watch(step, metrics)
        del cycle, m  # the recorded forwards' parts (all in t now) are freed before the table is built beside t
        write_step_tokens(self.writer, step, t, record_fraction=self.settings.record_fraction,
                          seed=int(self.trainer.args.seed) + step, layer_slots=self.layer_slots)
        write_step_metrics(self.writer, step, metrics)
        self.writer.update(last_step=step)
        self._unlogged.append(scalars(metrics, expert_load_matrix=self.settings.report_expert_load_matrix))
        self._warn_if_still(step, t, metrics)
        self._warn_if_nothing_to_learn(step, metrics)
        if warning is not None:
            self._warned_collapse(warning)
        broken = verdict(metrics, step=step, policy=self.settings.route_integrity)  # refuse: raised, step written
        if broken is not None:
            warn_once(broken, self.writer.read_info().warnings, self.writer.add_warning,
                      lambda m: logger.warning("moestab: %s", m))

    def logged(self, logs: dict[str, float]) -> None:
        """TRL's own logged numbers that the collapse rule reads (:data:`TRL_SIGNALS`), kept for the next step."""
        self._trl_logged.update({key: float(logs[name]) for name, key in TRL_SIGNALS.items()
                                 if isinstance(logs.get(name), int | float)})

    def _watch(self, step: int, metrics: dict[str, Any]) -> CollapseWarning | None:
        """The collapse watch fed the step (TRL's last logged reward and grad norm with it); its keys added to
        ``metrics``."""
        added, warning = self.collapse.observe(step, {**self._trl_logged, **metrics})
        self._trl_logged = {}  # each logged value feeds one step (TRL may log less often than a step ends)
        metrics.update(added)
        note = self.collapse.missing_note()
        if note is not None:
            logger.warning("moestab: %s", note)
        return warning

    def _warned_collapse(self, warning: CollapseWarning) -> None:
        message = self.collapse.message(warning)
        logger.warning("moestab: %s", message)
        self.writer.add_warning(message)
        if self.collapse.policy == "stop":
            self.collapse_stop = message

    def unlogged(self) -> dict[str, float]:
        """The tracker scalars (``moestab/<key>``) of the steps written since the last call, for TRL's next log: one
        step's, or with several (``logging_steps`` above a step's optimizer steps) each key's mean over them, as TRL
        merges its own numbers."""
        steps, self._unlogged = self._unlogged, []
        return mean_scalars(steps)

    def _warn_if_nothing_to_learn(self, step: int, metrics: dict[str, Any]) -> None:
        """A warning (logged, and in run.json's ``warnings``), once a run, at the first step whose every advantage is
        0: every group's rewards were equal, so the policy loss had no gradient and the step's routing change came
        from everything but learning (an untrained model that answers nothing right, or a reward that never varies)."""
        if NOTHING_TO_LEARN in self._warned or metrics.get(keys.ADVANTAGE_NONZERO) != 0:
            return
        self._warned.add(NOTHING_TO_LEARN)
        message = (f"step {step}: every advantage is 0 (each group's rewards were equal), so the policy loss had no "
                   "gradient and routing/old_new/* measure no learning. A model that answers nothing right (an "
                   "untrained one: start from a warm-started base, moestab.train.warm_started_base) or a reward "
                   "that never varies gives this at every step")
        logger.warning("moestab: %s", message)
        self.writer.add_warning(message)

    def _warn_if_still(self, step: int, t: StepTensors, metrics: dict[str, Any]) -> None:
        """A warning (logged, and in run.json's ``warnings``), once a run for each kind, when the step's old->new
        change is 0 because the policy did not move or moved too little to change a route (:func:`stillness`)."""
        still = stillness(t, float(metrics[keys.ROUTING_CHANGED.format(pair="old_new")]))
        if still is None or still.kind in self._warned:
            return
        self._warned.add(still.kind)
        message = still.message(step, float(self.trainer.args.learning_rate))
        logger.warning("moestab: %s", message)
        self.writer.add_warning(message)


TRL_SIGNALS = {"reward": keys.REWARD_MEAN, "grad_norm": keys.GRAD_NORM}
"""TRL's logged names -> the keys the collapse rule reads them as (the batch's mean reward; the gradient norm before
clipping). They are TRL's latest logged values when a step ends: those of its previous optimizer step."""


class _CycleEnd(TrainerCallback):
    """Tells :class:`TrlRecords` when training starts and when each optimizer step has ended."""

    def __init__(self, records: TrlRecords) -> None:
        self.records = records

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.records.start(int(state.max_steps))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.records.step_end(int(state.global_step))
        if self.records.collapse_stop is not None:  # on_collapse_warning="stop": a checkpoint, then the end
            control.should_save = True
            control.should_training_stop = True

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        # The Trainer's callback gets the line as logged, TRL's own numbers (reward) merged in by its log().
        self.records.logged(logs or {})


class RoutingRecords:
    """Mixin for ``trl.GRPOTrainer`` that writes a moestab run folder; put it first among the bases.

    >>> class Trainer(RoutingRecords, GRPOTrainer): ...
    >>> Trainer(model=model, args=GRPOConfig(...), reward_funcs=reward, train_dataset=data,
    ...         moestab=RecordSettings("runs/trl-gspo")).train()

    ``moestab`` is a :class:`RecordSettings` or just the run folder. Every other argument is ``GRPOTrainer``'s.
    """

    def __init__(self, *args: Any, moestab: RecordSettings | str | Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = moestab if isinstance(moestab, RecordSettings) else RecordSettings(moestab)
        self.moestab_records = TrlRecords(self, settings)
        self.add_callback(_CycleEnd(self.moestab_records))

    def train(self, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        with self.moestab_records.session(resuming=bool(resume_from_checkpoint)):
            return super().train(resume_from_checkpoint, *args, **kwargs)

    def training_step(self, model: torch.nn.Module, inputs: dict[str, Any],
                      num_items_in_batch: Any = None) -> torch.Tensor:
        capture = self.moestab_records.capture(model, self.state.global_step)
        if capture is None:
            return super().training_step(model, inputs, num_items_in_batch)
        with capture:  # TRL's generation, pi_old forward and loss forward of this micro-step, hooks removed on exit
            loss = super().training_step(model, inputs, num_items_in_batch)
        self.moestab_records.add_micro_step(capture.captured())
        return loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        # A step is written in on_step_end, before the Trainer logs that optimizer step, so its numbers go out with
        # TRL's at the same global_step, to every tracker TRL's report_to names. An evaluation's log (model in eval
        # mode, TRL's own test) gets none.
        if self.model.training:
            logs = {**logs, **self.moestab_records.unlogged()}
        super().log(logs, start_time)

    def compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        self.moestab_records.loss_inputs(inputs)
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)


class MoestabGRPOTrainer(RoutingRecords, trl.GRPOTrainer):
    """``trl.GRPOTrainer`` writing a moestab run folder: ``MoestabGRPOTrainer(..., moestab="runs/x")``."""
