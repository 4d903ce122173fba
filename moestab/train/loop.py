"""The training loop behind ``moestab train``, in its phases: the run folder checked and locked, the policy set up,
the run opened, the start evaluation, the steps, the end recorded.

The run folder's lifetime (lock, status, signals, how a stop is recorded) is :mod:`moestab.train.run_lifetime`'s; the
recipe the probes share (device, base policy, loading it, step settings) is :mod:`moestab.train.recipe`'s.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from moestab.configs import ConfigError, config_to_dict
from moestab.metrics import keys
from moestab.metrics.collapse_warning import CollapseWarning
from moestab.models import is_embedded
from moestab.models.tokenizer import tokenizer_overflow
from moestab.recording.capture_check import verdict, warn_once
from moestab.recording.collapse_watch import CollapseMonitor
from moestab.recording.step_records import write_step_metrics, write_step_tokens
from moestab.recording.trackers import TrackedRun, open_trackers, run_id
from moestab.routing import freeze_routers
from moestab.routing.base_routing import BaseRouting
from moestab.run_folder import RunFolder, schema
from moestab.run_folder.run_info import ModelInfo
from moestab.tasks import Task, task_from_spec
from moestab.train.base_fingerprint import check_resumed_base, fingerprint, uses_base
from moestab.train.checkpoint import prune_checkpoints, restore_training_state, save_checkpoint
from moestab.train.config import TrainConfig
from moestab.train.distributed import (
    World,
    full_state_dict,
    optimizer_state,
    process_group,
    rank_seed,
    shard_policy,
    world_from_env,
)
from moestab.train.engine import RolloutEngine, close_engine, engine_factory
from moestab.train.evaluate import greedy_accuracy, sharded_greedy_accuracy
from moestab.train.history import SolvedPrompts
from moestab.train.optim import build_optimizer
from moestab.train.recipe import (
    DTYPES,
    base_policy_path,
    check_policy_settings,
    check_recording,
    choose_device,
    load_policy,
    model_info,
    record_slots,
    response_budget,
    step_settings,
)
from moestab.train.rollout import BaseRoutedEngine
from moestab.train.route_bases import RouteBases, base_route_distance, build_route_bases
from moestab.train.run_lifetime import NothingToLearnError, TrainingError, TrainRun
from moestab.train.step import run_step
from moestab.train.step_settings import extra_examples, step_examples, step_seed

logger = logging.getLogger(__name__)
"""The run's notes when :func:`train` is given no ``log``."""

T = TypeVar("T")


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    status: str
    last_step: int
    start_accuracy: float | None
    final_accuracy: float | None
    stop_signal: int = 0
    """The signal that interrupted the run (``signal.SIGINT`` / ``SIGTERM``); 0 when none reached this process."""
    collapse_stop: bool = False
    """A collapse warning stopped the run (``--on-collapse-warning stop``)."""


def check_world(config: TrainConfig, world: World) -> None:
    """Refuse a process count that differs from ``config.nproc`` (``--nproc N`` launches N processes itself)."""
    if world.size != config.nproc:
        how = (f"launch it with `moestab train --nproc {config.nproc} ...` (or torchrun --nproc-per-node "
               f"{config.nproc} -m moestab train ...)" if world.size == 1 else f"use --nproc {world.size}")
        raise ConfigError(f"nproc={config.nproc} but this is 1 of {world.size} process(es); {how}")


def train(
    config: TrainConfig,
    *,
    log: Callable[[str], None] = logger.info,
    rollout_engine: Callable[..., RolloutEngine] | None = None,
) -> RunResult:
    """Run (or resume) the RL fine-tuning described by ``config``; returns where and how it ended.

    Everything that can be checked is checked before anything is written; once run.json exists, any
    stop (an exception, Ctrl-C, SIGTERM, a full disk) leaves it ``failed`` or ``interrupted`` with a
    message, never ``running``. ``rollout_engine(model, tokenizer, dtype=..., gates=...)`` builds the
    engine that samples the rollouts (default: ``config.rollout_engine``'s, in ``config.rollout_dtype``); it meets
    the contract of ``moestab.train.engine`` (a ``RolloutBatch`` with the routes it used, and their gate weights when
    ``gates``, for TRR).

    ``log`` takes the run's notes (its start, a resume, an overwrite, a lock taken over, an interrupt; default: this
    module's logger at INFO; ``moestab train`` prints them).

    Under torchrun (``config.nproc`` processes) every process calls this; the policy is sharded with FSDP2 and rank
    0 writes the run (``moestab.train.distributed``).
    """
    world = world_from_env()
    check_world(config, world)
    device = choose_device(config.device, world)
    if rollout_engine is None:
        try:
            rollout_engine = engine_factory(config.rollout_engine, device=device)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    with process_group(world, device), ExitStack() as lock:  # the run folder's lock, held by rank 0 to the end
        return _train(config, world, device, rollout_engine, log if world.is_main else _quiet, lock)


def _quiet(message: str) -> None:
    """The log of ranks other than 0: rank 0 speaks for the run."""


def _on_main(world: World, fn: Callable[[], T]) -> T:
    """``fn()`` run by rank 0 (it owns the run folder and the warm-start cache) and its result given to every
    rank. A refusal there is raised on every rank (marked ``said_by_rank_0``: only rank 0 prints it); any other
    error stops the other ranks with a :class:`TrainingError` naming it, so none goes on alone."""
    result, error, failure = None, None, None
    if world.is_main:
        try:
            result = fn()
        except (ConfigError, TrainingError) as exc:
            error = exc
        except Exception as exc:
            failure = exc
    result, error, message = world.broadcast((result, error, None if failure is None else repr(failure)))
    if failure is not None:
        raise failure
    if message is not None:
        raise TrainingError(f"rank 0 failed before training: {message}")
    if error is not None:
        error.said_by_rank_0 = True
        raise error
    return result


def _train(
    config: TrainConfig, world: World, device: torch.device, rollout_engine: Callable[..., RolloutEngine],
    log: Callable[[str], None], lock: ExitStack,
) -> RunResult:
    task = task_from_spec(config.task)
    max_new = response_budget(config, task)
    run = TrainRun(config, world, log)
    # The run folder: locked and checked (and, for --overwrite, cleared only once the run opens) before any model is
    # loaded; a refusal is raised on every rank.
    start_step, delete_first = _on_main(world, lambda: run.lock_and_check(lock))
    policy = _set_up(config, task, world, device, run.folder, start_step, log)
    steps = _Steps(config, task, world, policy, run, max_new, log)
    # From here on run.json exists: every way out records how the run ended.
    start_accuracy = _on_main(world, lambda: run.open(policy.model_info, start_step, delete_first))
    progress = _progress(config, start_step, log, enabled=world.is_main)
    with run.recording_the_end(start_step, policy.checkpoint_bytes) as closing:
        try:
            tracked = TrackedRun(run.run_dir, config_to_dict(config), start_step=start_step,
                                 run_id=run_id(run.folder.info().created, run.run_dir) if world.is_main else "")
            report = closing.enter_context(open_trackers(config.report_to if world.is_main else (), tracked,
                                                            expert_load_matrix=config.report_expert_load_matrix))
            if not config.resume:
                start_accuracy = steps.start()
            steps.loop(start_step, start_accuracy, rollout_engine, report, progress)
        finally:
            progress.close()
    run.finish()
    return RunResult(run.run_dir, run.status, run.step, start_accuracy, run.final_accuracy, run.stop_signal,
                     run.collapse_stop)


# ---- set-up: the policy, its reference, its optimizer, checked before the run is opened ----------------------------
@dataclass
class _Policy:
    """What the set-up built: the policy and everything a step or a checkpoint needs besides the settings."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    ref_model: PreTrainedModel | None
    optimizer: torch.optim.Optimizer
    history: SolvedPrompts | None
    base_path: str
    warm: dict | None
    """The warm start's record (``None`` for a given model)."""
    record_slots: list[int]
    bases: RouteBases
    """The frozen models every forward routes as (``--routing-replay base``) and the rollout's routes are measured
    against (``--measure-base-routes``)."""
    model_info: ModelInfo
    checkpoint_bytes: int
    """What a checkpoint needs on disk: the weights and AdamW's two moments."""


def _tokenizer(config: TrainConfig, base_path: str, model: PreTrainedModel) -> PreTrainedTokenizerBase:
    """The base's tokenizer, refused when its ids overflow the model's vocabulary; padding with EOS if it has none."""
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    problem = tokenizer_overflow(model, tokenizer)
    if problem:
        raise TrainingError(f"model {config.model}: {problem}")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _set_up(
    config: TrainConfig, task: Task, world: World, device: torch.device, folder: RunFolder, start_step: int,
    log: Callable[[str], None],
) -> _Policy:
    """Load the policy (from the run's checkpoint when resuming), check it against the settings, shard it across the
    processes, and build its optimizer (with the run's saved state when resuming)."""
    dtype = DTYPES[config.dtype]
    base_path, warm = _on_main(world, lambda: base_policy_path(config, task, log))
    if start_step:  # before the run opens: a base changed since the run started is refused with run.json untouched
        _on_main(world, lambda: check_resumed_base(folder.info().warm_start, base_path, config))
    model = load_policy(str(folder.checkpoint_dir(start_step)) if start_step else base_path, dtype, device)
    tokenizer = _tokenizer(config, base_path, model)
    ref_model = load_policy(base_path, dtype, device).eval().requires_grad_(False) if config.kl_coef > 0 else None
    bases = build_route_bases(config, folder, start_step, base_path, ref_model,
                              lambda path: load_policy(path, dtype, device))
    if bases.route is not None:
        BaseRouting(model, bases.route)  # both models' routers checked here, before the run opens
    if not is_embedded(config.model):  # the embedded policy's family was checked before its warm start
        check_recording(model)
    slots = record_slots(model, config.record_layers)
    info = model_info(model, slots)
    check_policy_settings(config, model)
    if config.freeze_router:  # before sharding: the sharded parameters keep requires_grad
        freeze_routers(model)
    checkpoint_bytes = 3 * sum(p.numel() * p.element_size() for p in model.parameters())  # weights + AdamW state
    if world.distributed:  # every router was checked above, on the whole model
        shard_policy(model, device)
        if ref_model is not None:
            shard_policy(ref_model, device)
    trained = [p for p in model.parameters() if p.requires_grad]  # all of them unless freeze_router
    optimizer = build_optimizer(trained, lr=config.lr, weight_decay=config.weight_decay)
    loop_state: dict = {}
    if start_step:
        loop_state = restore_training_state(folder, start_step, model, optimizer)
    history = SolvedPrompts.from_state(loop_state) if config.history_resampling else None
    return _Policy(model, tokenizer, ref_model, optimizer, history, base_path, warm, slots, bases, info,
                   checkpoint_bytes)


# ---- the steps ------------------------------------------------------------------------------------------------------
class _Steps:
    """The steps of one run and what they share: the policy, the settings, the held-out set, the run's folder."""

    def __init__(
        self, config: TrainConfig, task: Task, world: World, policy: _Policy, run: TrainRun, max_new: int,
        log: Callable[[str], None],
    ) -> None:
        self.config, self.task, self.world, self.policy, self.run, self.log = config, task, world, policy, run, log
        self.max_new = max_new
        self.main = world.is_main
        self.settings = step_settings(config, max_new)
        self.eval_set = task.eval_set(config.eval_size, seed=config.seed + 1)
        self.collapse = CollapseMonitor(config.on_collapse_warning)
        self.collapse_stop: str | None = None  # the warning that stops the run after its step (rank 0's)
        self.saved_step = -1
        self.start_step = 0  # the step this process started after: it classifies only the checkpoints it saves

    def routing(self) -> AbstractContextManager:
        """How the policy routes outside the trainer's own forwards (generation, evaluation): as the frozen base
        under ``--routing-replay base``, freely otherwise."""
        p = self.policy
        return nullcontext() if p.bases.route is None else BaseRouting(p.model, p.bases.route, verify=False)

    def evaluate(self) -> float:
        p = self.policy
        if self.world.distributed:
            return sharded_greedy_accuracy(p.model, p.tokenizer, self.task, self.eval_set, max_new_tokens=self.max_new,
                                           world=self.world)
        with self.routing():
            return greedy_accuracy(p.model, p.tokenizer, self.task, self.eval_set, max_new_tokens=self.max_new)

    def save(self, step: int) -> None:
        """The checkpoint of ``step``: gathered by every rank, written by rank 0."""
        p = self.policy
        weights = None
        if self.world.distributed:  # gathered by every rank; tied copies left out, as save_pretrained does itself
            tied = getattr(p.model, "all_tied_weights_keys", None) or {}
            weights = {k: v for k, v in full_state_dict(p.model).items() if k not in tied}
        optimizer_saved = optimizer_state(p.model, p.optimizer)
        if self.main:
            loop_state = p.history.state() if p.history is not None else {}  # carried across steps, for --resume
            save_checkpoint(self.run.folder, step, p.model, p.tokenizer, optimizer_saved, loop_state, weights=weights)
            prune_checkpoints(self.run.folder, save_every=self.config.save_every, steps=self.config.steps,
                              refresh_every=p.bases.refresh_every, since=self.start_step)
        self.saved_step = step

    def start(self) -> float:
        """A new run's start: the base policy's eval accuracy, recorded with its warm start, and the step-0
        checkpoint."""
        accuracy = self.evaluate()
        if self.main:
            warm_start = {"accuracy": accuracy, "path": self.policy.base_path, "record": self.policy.warm}
            if uses_base(self.config):  # what --resume checks the base against
                warm_start["fingerprint"] = fingerprint(self.policy.base_path)
            self.run.writer.update(warm_start=warm_start)
        self.save(0)
        self.log(f"start: eval accuracy {accuracy:.1%} on {len(self.eval_set)} held-out examples")
        return accuracy

    def loop(
        self, start_step: int, start_accuracy: float | None, rollout_engine: Callable[..., RolloutEngine],
        report: Callable[[dict, int], None], progress: _Progress,
    ) -> None:
        """Steps ``start_step + 1`` to ``config.steps``; a Ctrl-C / SIGTERM stops them after the step in flight (saved),
        every advantage 0 for ``max_zero_advantage_steps`` steps with :class:`NothingToLearnError`."""
        config, p = self.config, self.policy
        self.start_step = start_step
        engine = rollout_engine(p.model, p.tokenizer, dtype=DTYPES[config.rollout_dtype or config.dtype],
                                gates=config.routing_replay in schema.GATE_REPLAY_MODES)
        try:
            self._steps(start_step, start_accuracy,
                        engine if p.bases.route is None else BaseRoutedEngine(engine, p.bases.route), report,
                        progress)
        finally:
            close_engine(engine)

    def _steps(self, start_step: int, start_accuracy: float | None, engine: RolloutEngine,
               report: Callable[[dict, int], None], progress: _Progress) -> None:
        config, run = self.config, self.run
        share = self.world.block(config.prompts_per_step)  # this rank's prompts: whole groups
        zero_steps = 0  # consecutive steps whose every advantage was 0
        if self.main:  # a resumed run's watch: the state the steps already run left it in
            self.collapse.replay_run(run.run_dir, start_step)
        for step in range(start_step + 1, config.steps + 1):
            run.step = step
            if run.stop_requested():  # Ctrl-C / SIGTERM during the start evaluation: step 0 is saved
                run.step = step - 1
                run.interrupted(f" before step {step}")
                return
            metrics = self.step(step, engine, share, report)
            progress.update(metrics)
            stop = self.world.broadcast(self.collapse_stop if self.main else None)  # every rank stops together
            if stop and step < config.steps:  # at the last step the run simply finishes
                if self.saved_step != step:
                    self.save(step)
                run.stopped_by_warning(stop)
                return
            zero_steps = zero_steps + 1 if metrics[keys.ADVANTAGE_NONZERO] == 0 else 0
            if config.max_zero_advantage_steps and zero_steps >= config.max_zero_advantage_steps:
                raise NothingToLearnError(_nothing_to_learn(config, step, zero_steps, start_accuracy))
            if run.stop_requested():
                self.save(step)
                run.interrupted(f": saved step {step}")
                return
        run.final_accuracy = metrics.get(keys.EVAL_ACCURACY) if config.steps > start_step else self.evaluate()

    def step(self, step: int, engine: RolloutEngine, share: slice, report: Callable[[dict, int], None]) -> dict:
        """One step: sample, update, record (tokens before metrics), evaluate and save when due; its metrics."""
        config, world, main, p = self.config, self.world, self.main, self.policy
        writer, history = self.run.writer, p.history
        if p.bases.refreshes_at(step):
            p.bases.refresh(p.model)
        seed = step_seed(config.seed, step)
        torch.manual_seed(rank_seed(seed, world.rank))
        examples, skipped = self._examples(step, seed)
        draw_more = extra_examples(self.task, config.prompts_per_step, config.seed, step)
        budget, G = config.budget, config.group_size
        measured = budget.rows(step, config.prompts_per_step * G, G, seed + 2)  # [B] the whole step's rows
        measured = measured[share.start * G : share.stop * G]  # [B / nproc] this rank's (run_step: all -> None)
        metrics, tensors = run_step(
            model=p.model, optimizer=p.optimizer, engine=engine, task=self.task, settings=self.settings,
            examples=examples[share],
            generator=torch.Generator().manual_seed(seed), ref_model=p.ref_model,
            draw_more=lambda r, draw=draw_more: draw(r)[share], world=world, measured=measured,
        )
        metrics.update(skipped)
        if p.bases.distance is not None:
            metrics.update(base_route_distance(p.bases.distance, tensors, temperature=config.temperature,
                                               chunk=max(1, tensors.batch.batch_size // config.minibatches)))
        if history is not None:  # rank 0 holds the whole step: every rank keeps the same history
            solved = world.broadcast((tensors.examples, tensors.correct) if main else None)
            history.record(*solved, config.group_size)
        if main and budget.measures_step(step):
            write_step_tokens(writer, step, tensors, record_fraction=config.record_fraction, seed=seed + 1,
                              layer_slots=p.record_slots)
        if step % config.eval_every == 0 or step == config.steps:
            metrics[keys.EVAL_ACCURACY] = self.evaluate()
        if main:
            warning = self._watch(step, metrics)
            write_step_metrics(writer, step, metrics)
            report(metrics, step)
            if warning is not None:
                self._warned(warning)
            broken = verdict(metrics, step=step, agreement=config.routing_replay not in schema.BASE_ROUTED_MODES)
            if broken is not None:
                warn_once(broken, writer.read_info().warnings, writer.add_warning, self.log)
        if step % config.save_every == 0 or step == config.steps or p.bases.saves_at(step):
            self.save(step)
        if main:
            writer.update(last_step=step)  # after its checkpoint: the step is complete
        return metrics

    def _watch(self, step: int, metrics: dict) -> CollapseWarning | None:
        """The collapse watch fed the step (its ``collapse/*`` keys added to ``metrics``); the warning, if one fired."""
        added, warning = self.collapse.observe(step, metrics)
        metrics.update(added)
        note = self.collapse.missing_note()
        if note is not None:
            self.log(note)
        return warning

    def _warned(self, warning: CollapseWarning) -> None:
        """A warning logged and kept in run.json; under ``--on-collapse-warning stop`` the run stops after the step."""
        message = self.collapse.message(warning, resume=f"moestab train --resume {self.run.run_dir}")
        self.log(message)
        if message not in self.run.writer.read_info().warnings:  # a step run again after a crash warns once
            self.run.writer.add_warning(message)
        if self.collapse.policy == "stop":
            self.collapse_stop = message

    def _examples(self, step: int, seed: int) -> tuple[list, dict[str, float]]:
        """The step's prompts; with history resampling, solved ones replaced by fresh draws (and how many)."""
        config, task, history = self.config, self.task, self.policy.history
        examples = step_examples(task, config.prompts_per_step, config.seed, step)
        if history is None:
            return examples, {}

        def redraw(r: int) -> list:
            return task.sample(config.prompts_per_step, random.Random(seed * 7 + r))

        return history.replace_solved(examples, redraw)


def _nothing_to_learn(config: TrainConfig, step: int, steps: int, start_accuracy: float | None) -> str:
    start = "n/a" if start_accuracy is None else f"{start_accuracy:.1%}"
    hints = ["a reward with partial credit", "an easier task spec"]
    if is_embedded(config.model):
        hints.insert(0, f"a longer warm start (--warm-start-max-steps, now {config.warm_start_max_steps}; "
                        f"--warm-start-target, now {config.warm_start_target})")
    return (f"steps {step - steps + 1}-{step}: every group's rewards were equal, so every advantage was 0 and "
            f"nothing can be learned (start eval accuracy {start}); try {', or '.join(hints)}. "
            "--max-zero-advantage-steps 0 disables this stop")


class _Progress:
    """The run's progress: a tqdm bar (reward, routing volatility, eval) on a terminal; without one (``--no-progress``,
    or stderr not a terminal: a log file, CI) a text line through ``log`` every ``every`` steps, with the time per step
    and the time left. Nothing on the processes that are not the main one."""

    def __init__(self, total: int, initial: int, *, bar: bool, lines: bool, log: Callable[[str], None],
                 every: int) -> None:
        self.bar = None
        self.total, self.step, self.log, self.every = total, initial, (log if lines else None), every
        self.started, self.first = time.monotonic(), initial
        if bar:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="train", unit="step", file=sys.stderr)

    @staticmethod
    def shown(metrics: dict) -> dict[str, str]:
        postfix = {"reward": f"{metrics[keys.REWARD_MEAN]:.2f}"}
        volatility = metrics.get(keys.ROUTING_CHANGED.format(pair="old_new"))
        if volatility is not None:  # absent on a step the measurement budget skips
            postfix["vol"] = f"{volatility:.3f}"
        if keys.EVAL_ACCURACY in metrics:
            postfix["eval"] = f"{metrics[keys.EVAL_ACCURACY]:.2f}"
        return postfix

    def update(self, metrics: dict) -> None:
        self.step += 1
        if self.bar is not None:
            self.bar.set_postfix(self.shown(metrics))
            self.bar.update(1)
        elif self.log is not None and (self.step % self.every == 0 or self.step == self.total):
            per_step = (time.monotonic() - self.started) / max(1, self.step - self.first)
            left = per_step * (self.total - self.step)
            shown = ", ".join(f"{k} {v}" for k, v in self.shown(metrics).items())
            self.log(f"step {self.step}/{self.total}: {shown} ({per_step:.1f} s/step, ~{left / 60:.0f} min left)")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _progress(config: TrainConfig, start: int, log: Callable[[str], None], *, enabled: bool = True) -> _Progress:
    """The bar on a terminal with ``--progress``; else a line every tenth of the run (at least every step, at most
    every 50)."""
    bar = config.progress and enabled and sys.stderr.isatty()
    return _Progress(config.steps, start, bar=bar, lines=enabled and not bar, log=log,
                     every=min(50, max(1, config.steps // 10)))
