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
from pathlib import Path
from typing import Any

import torch
import trl
import yaml
from transformers import TrainerCallback

from moestab.integrations.trl.capture import Captured, ForwardCapture, ScoringCall
from moestab.integrations.trl.cycle import CycleRecord, LossStep, assemble, pi_old_calls, pi_old_routes
from moestab.integrations.trl.settings import RecordSettings, check_supported, clip_rule, cycle_layout, run_config
from moestab.integrations.trl.stillness import stillness
from moestab.metrics import keys
from moestab.recording.environment import environment as run_environment
from moestab.recording.measure_budget import RULE
from moestab.recording.step_metrics import step_metrics
from moestab.recording.step_records import write_step_metrics, write_step_tokens
from moestab.recording.step_tensors import StepTensors
from moestab.recording.trackers import mean_scalars, scalars
from moestab.routing import RecordingError, RoutingRecorder, RoutingReplay, find_routers
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

logger = logging.getLogger(__name__)
"""Warnings about the run's numbers (:mod:`~moestab.integrations.trl.stillness`), also kept in run.json."""

REMEDIES = Remedies(folder="run_dir", overwrite="RecordSettings(..., overwrite=True)", resume=None)
"""How a refusal of the run folder tells a TRL user to go on (the policy is ``moestab train``'s: ``RunFolder``)."""


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
        self._inputs: dict[str, Any] | None = None
        self._rng: tuple[torch.Tensor, list[torch.Tensor]] | None = None
        self._expect_inputs = False
        self._started = 0.0
        self._warned: set[str] = set()  # kinds of stillness already reported: each once a run
        self._unlogged: list[dict[str, float]] = []  # the tracker scalars of steps written since TRL's last log

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
                self._cycle, self._stack = None, None  # a cycle cut off by the end of training is not written
            if self.writer is not None:
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
        if self.settings.routing_share:  # the generators' state the loss forward starts from (dropout, jitter)
            self._rng = torch.get_rng_state(), [torch.cuda.get_rng_state(d) for d in _cuda_devices(self.trainer.model)]

    def add_micro_step(self, captured: Captured) -> None:
        """File one recorded ``training_step``: a cycle opens with the one that generated."""
        self._expect_inputs = False
        if self._cycle is None:
            if len(captured.generations) != 1:
                raise RecordingError(f"the first micro-step of a cycle ran {len(captured.generations)} generate() "
                                     "calls, expected 1 (TRL generates once per generation batch)")
            old = [call for call in captured.scoring if not call.grad]
            self._cycle = CycleRecord(captured.generations[0], old, [], self._started)
        elif captured.generations:
            raise RecordingError("TRL generated inside a cycle: its generation batches no longer line up with the "
                                 "optimizer steps moestab expects")
        losses = [call for call in captured.scoring if call.grad]
        if self._inputs is None:
            raise RecordingError("a recorded training step did not pass through compute_loss")
        if len(losses) != 1:
            raise RecordingError(f"a training step ran {len(losses)} forwards with grad, expected TRL's loss forward")
        self._cycle.steps.append(LossStep(self._inputs, losses[0], self._counterfactual(losses[0])))
        self._inputs, self._rng = None, None

    def _counterfactual(self, call: ScoringCall) -> torch.Tensor | None:
        """``[b, L - 1]`` TRL's loss forward ``call`` again, on the same weights (the micro-step's backward has run,
        its optimizer step has not), with pi_old's routes replayed: the replayed side of routing's share of the
        ratio. Only in the last pass (the one recorded) and when TRL computed pi_old (otherwise pi_old's routes are
        the loss forward's own: :func:`~moestab.integrations.trl.cycle.assemble` takes the update's log-probs).

        No grad, outside the capture (no hook records it), under TRL's autocast, with the random generators set to
        the state the loss forward started from and restored afterwards: TRL's weights, gradients and random
        draws are those of a run without it.
        """
        layout, cycle = self.layout, self._cycle
        if not self.settings.routing_share or not layout.old_forward:
            return None
        if len(cycle.steps) < layout.micro_steps - layout.micro_per_pass:  # this micro-step's index in the cycle
            return None  # an earlier pass over the batch, not recorded (cycle.last_pass)
        if self._rng is None:
            raise RecordingError("a recorded training step did not pass through compute_loss")
        model = self.trainer.model
        routes = pi_old_routes(cycle, layout, call.input_ids)  # [b, L, layers, k]
        cpu_state, cuda_states = self._rng
        devices = _cuda_devices(model)
        with torch.no_grad(), torch.random.fork_rng(devices=devices), self.trainer.accelerator.autocast(), \
                RoutingReplay(model, routes, verify=False):
            torch.set_rng_state(cpu_state)
            for device, state in zip(devices, cuda_states, strict=True):
                torch.cuda.set_rng_state(state, device)
            log_probs = getattr(model(**call.kwargs), "log_probs", None)
        if log_probs is None:
            raise RecordingError("TRL's fused_lm_head forward returned no log_probs")
        return log_probs.detach()  # [b, L - 1]

    # ---- the end of a cycle ----------------------------------------------------------------------
    def step_end(self, global_step: int) -> None:
        """After an optimizer step: a cycle whose micro-steps have all run is complete; write it."""
        cycle = self._cycle
        if cycle is None or len(cycle.steps) < self.layout.micro_steps:
            return
        self._cycle = None
        step = global_step // self.layout.optimizer_steps  # 1-based: the cycle that just ended
        old_calls = pi_old_calls(cycle, self.layout)
        picked = self.settings.new_chunks(len(old_calls), int(self.trainer.args.seed) + step)
        new_calls = self._pi_new([old_calls[i] for i in picked])
        tokenizer = self.trainer.processing_class
        t = assemble(cycle, new_calls, picked, layout=self.layout, clip=self.clip,
                     group_size=int(self.trainer.args.num_generations),
                     decode=lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True),
                     routing_share=self.settings.routing_share)
        measured = {keys.TIME_STEP: time.perf_counter() - cycle.started, keys.MINIBATCHES: self.layout.optimizer_steps}
        metrics = step_metrics(t, replay="off", measured=measured)  # no updates: TRL logs its loss and grad norm
        write_step_tokens(self.writer, step, t, record_fraction=self.settings.record_fraction,
                          seed=int(self.trainer.args.seed) + step, layer_slots=self.layer_slots)
        write_step_metrics(self.writer, step, metrics)
        self.writer.update(last_step=step)
        self._unlogged.append(scalars(metrics, expert_load_matrix=self.settings.report_expert_load_matrix))
        self._warn_if_still(step, t, metrics)

    def unlogged(self) -> dict[str, float]:
        """The tracker scalars (``moestab/<key>``) of the steps written since the last call, for TRL's next log: one
        step's, or with several (``logging_steps`` above a step's optimizer steps) each key's mean over them, as TRL
        merges its own numbers."""
        steps, self._unlogged = self._unlogged, []
        return mean_scalars(steps)

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

    def _pi_new(self, calls: list[ScoringCall]) -> list[ScoringCall]:
        """pi_new: pi_old's forwards again after the cycle's updates, same inputs and chunks, no grad."""
        model = self.trainer.model
        with torch.no_grad(), self.trainer.accelerator.autocast(), ForwardCapture(
            model, self.new_recorder, temperature=self.temperature
        ) as capture:
            for call in calls:
                model(**call.kwargs)
        return capture.captured().scoring


def _cuda_devices(model: torch.nn.Module) -> list[int]:
    """The CUDA device of ``model``'s parameters, as ``torch.random.fork_rng`` takes it (none on a CPU)."""
    device = next(model.parameters()).device
    if device.type != "cuda":
        return []
    return [torch.cuda.current_device() if device.index is None else device.index]


class _CycleEnd(TrainerCallback):
    """Tells :class:`TrlRecords` when training starts and when each optimizer step has ended."""

    def __init__(self, records: TrlRecords) -> None:
        self.records = records

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.records.start(int(state.max_steps))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.records.step_end(int(state.global_step))


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
