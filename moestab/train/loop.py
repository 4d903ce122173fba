"""The training loop behind ``moestab train``: set-up, steps, evaluation, checkpoints, run records."""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TypeVar

import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from moestab.configs import ConfigError, config_to_dict
from moestab.models import build_embedded_policy, is_embedded, parse_model_spec
from moestab.recording.token_table import record_rows, token_table
from moestab.records import schema
from moestab.records.lock import RunLockedError, run_lock
from moestab.records.run_info import ModelInfo, read_run_info
from moestab.records.writer import RunWriter, remove_temporaries
from moestab.routing import IncompatibleTransformersError, find_routers
from moestab.routing.compat import check_generate_recording
from moestab.tasks import Task, task_from_spec
from moestab.train.checkpoint import complete_checkpoints, read_training_state, save_checkpoint
from moestab.train.config import TrainConfig
from moestab.train.distributed import (
    World,
    full_state_dict,
    load_optimizer,
    optimizer_state,
    process_group,
    rank_seed,
    shard_policy,
    world_from_env,
)
from moestab.train.engine import RolloutEngine, engine_factory
from moestab.train.evaluate import greedy_accuracy, sharded_greedy_accuracy
from moestab.train.history import SolvedPrompts
from moestab.train.interrupt import GracefulInterrupt
from moestab.train.optim import build_optimizer
from moestab.train.run_folder import (
    TrainingError,
    check_writable,
    clear_run,
    prepare_new,
    prepare_resume,
    write_failure,
)
from moestab.train.step import (
    NonFiniteLossError,
    StepSettings,
    extra_examples,
    run_step,
    step_examples,
    step_seed,
)
from moestab.train.trackers import TrackedRun, open_trackers, run_id
from moestab.train.warm_start import WarmStartSpec, warm_start

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
T = TypeVar("T")


def config_defaults() -> dict:
    """Every TrainConfig field's default (a run recorded before a field existed had it at its default)."""
    return {f.name: f.default for f in fields(TrainConfig)}


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    status: str
    last_step: int
    start_accuracy: float | None
    final_accuracy: float | None
    stop_signal: int = 0
    """The signal that interrupted the run (``signal.SIGINT`` / ``SIGTERM``); 0 when none reached this process."""


def _device(name: str, world: World) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda was asked for but torch sees no CUDA device; valid here: cpu, auto")
    if name == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", world.local_rank)  # one GPU per process


def _cache_dir(config: TrainConfig) -> Path:
    return Path(config.cache_dir or os.environ.get("MOESTAB_CACHE") or Path.home() / ".cache" / "moestab")


def base_policy_path(config: TrainConfig, task: Task, log: Callable[[str], None]) -> tuple[str, dict | None]:
    """The policy RL starts from: ``config.model`` as given, or the embedded policy warm-started on ``task`` (built
    now or found in the cache), with the warm start's record (``None`` for a given model)."""
    if not is_embedded(config.model):
        return config.model, None
    model_spec = parse_model_spec(config.model, seed=config.seed)
    untrained, _ = build_embedded_policy(model_spec)
    find_routers(untrained)  # this transformers' routing math, then its generate(), before a warm start of minutes
    _check_recording(untrained)
    spec = WarmStartSpec(
        model=model_spec,
        task_spec=task.spec,
        target=config.warm_start_target,
        max_steps=config.warm_start_max_steps,
        seed=config.seed,
        eval_size=config.eval_size,
    )
    path, record = warm_start(spec, task, _cache_dir(config), log=log)
    return str(path), record


def _load_policy(path: str, dtype: torch.dtype, device: torch.device) -> PreTrainedModel:
    """A supported MoE policy from a local folder (or a hub id), with errors that name what is wrong."""
    folder = Path(path).expanduser()
    if not folder.exists() and (path.startswith((".", "/", "~")) or path.count("/") != 1):
        raise TrainingError(f"model: the folder {path!r} does not exist (give a Hugging Face checkpoint folder, "
                            "or 'embedded')")
    try:
        eager = {"experts_implementation": "eager"} if dtype == torch.float64 else {}  # grouped kernels: <= fp32
        model = AutoModelForCausalLM.from_pretrained(str(folder) if folder.exists() else path, dtype=dtype, **eager)
    except Exception as exc:  # transformers / safetensors raise many types for a damaged folder
        weights = sorted(p.name for p in folder.glob("*.safetensors")) if folder.is_dir() else []
        files = f" (weights: {', '.join(weights)})" if weights else ""
        raise TrainingError(f"cannot load model {path!r}{files}: {type(exc).__name__}: {exc}") from exc
    find_routers(model)  # a dense model fails here with the list of supported families
    return model.to(device)


def _check_recording(model: PreTrainedModel) -> None:
    """Refuse, before anything is written, a transformers whose generate() this moestab cannot record."""
    try:
        check_generate_recording(model)
    except IncompatibleTransformersError as exc:
        raise TrainingError(str(exc)) from exc


def _model_info(model: PreTrainedModel, record_slots: list[int]) -> ModelInfo:
    sites = find_routers(model, verify=False)
    return ModelInfo(
        family=model.config.model_type,
        moe_layers=tuple(s.layer for s in sites),
        num_experts=sites[0].num_experts,
        top_k=sites[0].top_k,
        recorded_layers=tuple(sites[i].layer for i in record_slots),
    )


def _environment(world: World) -> dict:
    """What a run's numbers depend on besides its config (run.json ``environment``)."""
    import transformers

    return {"torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__, "world_size": world.size}


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


def prepare_run_folder(config: TrainConfig, log: Callable[[str], None]) -> tuple[int, bool]:
    """Check the run folder before anything is loaded: ``(step to start from, whether --overwrite must delete the
    run there first)``; resuming removes temporaries an interrupted write left behind."""
    run_dir = Path(config.run_dir)
    if config.resume:
        _, step, notes = prepare_resume(run_dir, config_to_dict(config), defaults=config_defaults())
        for note in notes:
            log(f"resume: {note}")
        return step, False
    check_writable(run_dir)
    return 0, prepare_new(run_dir, overwrite=config.overwrite)


def check_world(config: TrainConfig, world: World) -> None:
    """Refuse a process count that differs from ``config.nproc`` (``--nproc N`` launches N processes itself)."""
    if world.size != config.nproc:
        how = (f"launch it with `moestab train --nproc {config.nproc} ...` (or torchrun --nproc-per-node "
               f"{config.nproc} -m moestab train ...)" if world.size == 1 else f"use --nproc {world.size}")
        raise ConfigError(f"nproc={config.nproc} but this is 1 of {world.size} process(es); {how}")


def train(
    config: TrainConfig,
    *,
    log: Callable[[str], None] = print,
    rollout_engine: Callable[..., RolloutEngine] | None = None,
) -> RunResult:
    """Run (or resume) the RL fine-tuning described by ``config``; returns where and how it ended.

    Everything that can be checked is checked before anything is written; once run.json exists, any
    stop (an exception, Ctrl-C, SIGTERM, a full disk) leaves it ``failed`` or ``interrupted`` with a
    message, never ``running``. ``rollout_engine(model, tokenizer, dtype=..., gates=...)`` builds the
    engine that samples the rollouts (default: ``config.rollout_engine``'s, in ``config.rollout_dtype``); it meets
    the contract of ``moestab.train.engine`` (a ``RolloutBatch`` with the routes it used, and their gate weights when
    ``gates``, for TRR).

    Under torchrun (``config.nproc`` processes) every process calls this; the policy is sharded with FSDP2 and rank
    0 writes the run (``moestab.train.distributed``).
    """
    world = world_from_env()
    check_world(config, world)
    device = _device(config.device, world)
    if rollout_engine is None:
        try:
            rollout_engine = engine_factory(config.rollout_engine, device=device)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    with process_group(world, device), ExitStack() as lock:  # the run folder's lock, held by rank 0 to the end
        return _train(config, world, device, rollout_engine, log if world.is_main else _quiet, lock)


@contextmanager
def _run_folder_lock(config: TrainConfig, log: Callable[[str], None]) -> Iterator[None]:
    """The run folder's lock (:mod:`moestab.records.lock`); a folder another live process writes is refused, naming
    it, as is a folder where no lock can be taken."""
    run_dir = Path(config.run_dir)
    # A read-only folder is refused as such (prepare_run_folder's check), before the lock creates anything there.
    if not config.resume:
        check_writable(run_dir)
    elif run_dir.is_dir():  # else prepare_resume says it is no run
        check_writable(run_dir, remedy="copy the run to a writable folder and resume the copy")
    with ExitStack() as held:
        try:
            held.enter_context(run_lock(run_dir, note=lambda message: log(f"lock: {message}")))
        except RunLockedError as exc:
            raise TrainingError(str(exc)) from exc
        except OSError as exc:
            raise TrainingError(f"cannot lock the run folder {run_dir}: {exc.strerror or exc} ({exc.filename}); "
                                "choose another run folder") from exc
        yield


def _quiet(message: str) -> None:
    """The log of ranks other than 0: rank 0 speaks for the run."""


def _train(
    config: TrainConfig, world: World, device: torch.device, rollout_engine: Callable[..., RolloutEngine],
    log: Callable[[str], None], lock: ExitStack,
) -> RunResult:
    dtype = DTYPES[config.dtype]
    main = world.is_main
    task = task_from_spec(config.task)
    run_dir = Path(config.run_dir)
    writer = RunWriter(run_dir)
    max_new = response_budget(config, task)

    # ---- the run folder: checked (and, for --overwrite, cleared) before any model is loaded ---------
    def lock_and_check() -> tuple[int, bool]:
        # Rank 0 writes the run folder: it takes the folder's lock (held in ``lock`` until the run ends, however it
        # ends) before anything there is read, written or deleted (--overwrite); a refusal is raised on every rank.
        lock.enter_context(_run_folder_lock(config, log))
        return prepare_run_folder(config, log)

    start_step, delete_first = _on_main(world, lock_and_check)
    base_path, warm = _on_main(world, lambda: base_policy_path(config, task, log))
    model = _load_policy(str(run_dir / schema.checkpoint_dir(start_step)) if start_step else base_path, dtype, device)
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    ref_model = _load_policy(base_path, dtype, device).eval().requires_grad_(False) if config.kl_coef > 0 else None
    if not is_embedded(config.model):  # the embedded policy's family was checked before its warm start
        _check_recording(model)
    record_slots = _record_slots(model, config.record_layers)
    model_info = _model_info(model, record_slots)
    if config.router_aux_loss_coef > 0 and not hasattr(model.config, "router_aux_loss_coef"):
        raise ConfigError(f"router_aux_loss_coef: {model.config.model_type} has no load-balancing loss (it balances "
                          "its experts otherwise, e.g. DeepSeek-V3's selection bias); leave it at 0")
    if config.routing_replay != "off":
        for site in find_routers(model, verify=False):
            if site.adapter.training_replay is not None:
                raise ConfigError(f"routing_replay: {config.routing_replay!r} cannot be exact for "
                                  f"{site.adapter.family}: {site.adapter.training_replay}; use --routing-replay off")
    checkpoint_bytes = 3 * sum(p.numel() * p.element_size() for p in model.parameters())  # weights + AdamW state
    if world.distributed:  # every router was checked above, on the whole model
        shard_policy(model, device)
        if ref_model is not None:
            shard_policy(ref_model, device)
    optimizer = build_optimizer(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    loop_state: dict = {}
    if start_step:
        optimizer_saved, loop_state = read_training_state(run_dir, start_step)
        load_optimizer(model, optimizer, optimizer_saved)
    history = SolvedPrompts.from_state(loop_state) if config.history_resampling else None
    settings = step_settings(config, max_new)
    eval_set = task.eval_set(config.eval_size, seed=config.seed + 1)

    def evaluate() -> float:
        if world.distributed:
            return sharded_greedy_accuracy(model, tokenizer, task, eval_set, max_new_tokens=max_new, world=world)
        return greedy_accuracy(model, tokenizer, task, eval_set, max_new_tokens=max_new)

    def save(step: int) -> None:
        weights = None
        if world.distributed:  # gathered by every rank; tied copies left out, as save_pretrained does itself
            tied = getattr(model, "all_tied_weights_keys", None) or {}
            weights = {k: v for k, v in full_state_dict(model).items() if k not in tied}
        optimizer_saved = optimizer_state(model, optimizer)
        if main:
            save_checkpoint(run_dir, step, model, tokenizer, optimizer_saved, _loop_state(history), weights=weights)

    # ---- from here on run.json exists: every way out records how the run ended -------------------
    def open_run() -> float | None:
        if config.resume:
            torn = writer.truncate_metrics(start_step)
            if torn:
                lines = ", ".join(map(str, torn))
                log(f"resume: dropped {len(torn)} torn line(s) of {schema.METRICS_JSONL} (line {lines})")
            return writer.update(status=schema.STATUS_RUNNING, last_step=start_step, error=None,
                                 environment=_environment(world)).warm_start_accuracy
        if delete_first:  # --overwrite: only now that every setting has been checked
            clear_run(run_dir)
            log(f"overwrite: deleted the previous run in {run_dir}")
        resolved = config_to_dict(replace(config, out=str(run_dir), resume=None, overwrite=False))
        writer.start(config=resolved, model=model_info, environment=_environment(world),
                     config_yaml=yaml.safe_dump(resolved, sort_keys=False))
        return None

    start_accuracy = _on_main(world, open_run)
    progress = _progress(config, start_step, enabled=main)
    step, status, final_accuracy, stop_signal = start_step, schema.STATUS_FINISHED, None, 0
    zero_steps = 0  # consecutive steps whose every advantage was 0
    with GracefulInterrupt() as interrupt, (writer.beating() if main else nullcontext()), ExitStack() as trackers:
        try:
            tracked = TrackedRun(run_dir, config_to_dict(config), start_step=start_step,
                                 run_id=run_id(read_run_info(run_dir).created, run_dir) if main else "")
            report = trackers.enter_context(open_trackers(config.report_to if main else (), tracked))
            if not config.resume:
                start_accuracy = evaluate()
                if main:
                    writer.update(warm_start={"accuracy": start_accuracy, "path": base_path, "record": warm})
                save(0)
                log(f"start: eval accuracy {start_accuracy:.1%} on {len(eval_set)} held-out examples")
            engine = rollout_engine(model, tokenizer, dtype=DTYPES[config.rollout_dtype or config.dtype],
                                    gates=config.routing_replay in schema.GATE_REPLAY_MODES)
            share = world.block(config.prompts_per_step)  # this rank's prompts: whole groups
            for step in range(start_step + 1, config.steps + 1):
                if world.any(interrupt.requested):  # Ctrl-C / SIGTERM during the start evaluation: step 0 is saved
                    step, status, stop_signal = step - 1, schema.STATUS_INTERRUPTED, interrupt.signum
                    log(f"\ninterrupted ({interrupt.signal_name or 'on another rank'}) before step {step + 1}; "
                        f"continue with `moestab train --resume {run_dir}`")
                    break
                seed = step_seed(config.seed, step)
                torch.manual_seed(rank_seed(seed, world.rank))
                examples = step_examples(task, config.prompts_per_step, config.seed, step)
                skipped: dict[str, float] = {}
                if history is not None:
                    def redraw(r: int, seed: int = seed) -> list:
                        return task.sample(config.prompts_per_step, random.Random(seed * 7 + r))

                    examples, skipped = history.replace_solved(examples, redraw)
                draw_more = extra_examples(task, config.prompts_per_step, config.seed, step)
                metrics, tensors = run_step(
                    model=model, optimizer=optimizer, engine=engine, task=task, settings=settings,
                    examples=examples[share],
                    generator=torch.Generator().manual_seed(seed), ref_model=ref_model,
                    draw_more=lambda r, draw=draw_more: draw(r)[share], world=world,
                )
                metrics.update(skipped)
                if history is not None:  # rank 0 holds the whole step: every rank keeps the same history
                    solved = world.broadcast((tensors.examples, tensors.correct) if main else None)
                    history.record(*solved, config.group_size)
                if main:
                    rows = record_rows(tensors.batch.batch_size, config.record_fraction, seed + 1)
                    writer.write_tokens(step, token_table(step, tensors, rows=rows, layer_slots=record_slots))
                if step % config.eval_every == 0 or step == config.steps:
                    metrics["eval/accuracy"] = evaluate()
                if main:
                    writer.append_metrics({"step": step, **metrics})
                    report(metrics, step)
                if step % config.save_every == 0 or step == config.steps:
                    save(step)
                if main:
                    writer.update(last_step=step)
                progress.update(metrics)
                zero_steps = zero_steps + 1 if metrics["advantage/nonzero_frac"] == 0 else 0
                if config.max_zero_advantage_steps and zero_steps >= config.max_zero_advantage_steps:
                    raise NothingToLearnError(_nothing_to_learn(config, step, zero_steps, start_accuracy))
                if world.any(interrupt.requested):
                    save(step)
                    status, stop_signal = schema.STATUS_INTERRUPTED, interrupt.signum
                    log(f"\ninterrupted ({interrupt.signal_name or 'on another rank'}): saved step {step}; "
                        f"continue with `moestab train --resume {run_dir}`")
                    break
            else:
                final_accuracy = metrics.get("eval/accuracy") if config.steps > start_step else evaluate()
        except NothingToLearnError as exc:
            if main:
                writer.update(status=schema.STATUS_FAILED, error=str(exc), last_step=step)
            raise TrainingError(str(exc)) from exc
        except NonFiniteLossError as exc:
            last_good = complete_checkpoints(run_dir)[-1]
            message = f"step {step}: {exc}; stopped, the last good checkpoint is step {last_good} (not overwritten)"
            if main:
                writer.update(status=schema.STATUS_FAILED, error=message, last_step=step - 1)
            raise TrainingError(message) from exc
        except BaseException as exc:  # a crash, a full disk, a second Ctrl-C: never leave "running"
            if not main:
                raise
            _record_stop(writer, run_dir, exc, step, checkpoint_bytes)
        finally:
            progress.close()
    if main:
        writer.update(status=status, last_step=step, final_accuracy=final_accuracy)
    return RunResult(run_dir, status, step, start_accuracy, final_accuracy, stop_signal)


class NothingToLearnError(RuntimeError):
    """Every advantage was 0 for several steps in a row: the rewards give RL nothing to learn from."""


def _nothing_to_learn(config: TrainConfig, step: int, steps: int, start_accuracy: float | None) -> str:
    start = "n/a" if start_accuracy is None else f"{start_accuracy:.1%}"
    hints = ["a reward with partial credit", "an easier task spec"]
    if is_embedded(config.model):
        hints.insert(0, f"a longer warm start (--warm-start-max-steps, now {config.warm_start_max_steps}; "
                        f"--warm-start-target, now {config.warm_start_target})")
    return (f"steps {step - steps + 1}-{step}: every group's rewards were equal, so every advantage was 0 and "
            f"nothing can be learned (start eval accuracy {start}); try {', or '.join(hints)}. "
            "--max-zero-advantage-steps 0 disables this stop")


def step_settings(config: TrainConfig, max_new_tokens: int) -> StepSettings:
    """What each step of ``config`` runs with: the preset with its overrides, DAPO's shaping and sampling resolved
    (``max_new_tokens``: :func:`response_budget`). The probes' steps use it too, so they step as training does."""
    preset = config.resolved_preset()
    return StepSettings(
        preset=preset, replay=config.routing_replay,
        minibatches=config.minibatches, group_size=config.group_size, temperature=config.temperature,
        max_new_tokens=max_new_tokens, max_grad_norm=config.max_grad_norm,
        router_aux_loss_coef=config.router_aux_loss_coef,
        overlong_cache=config.overlong_cache_tokens(max_new_tokens),
        dynamic_sampling=config.dynamic_sampling if config.dynamic_sampling is not None else preset.dynamic_sampling,
        dynamic_sampling_rounds=config.dynamic_sampling_rounds,
    )


def response_budget(config: TrainConfig, task: Task) -> int:
    """``max_new_tokens``, refused when it cannot hold the task's longest answer (the task would be unsolvable)."""
    needed = task.max_answer_chars + 1  # answer + EOS; the embedded tokenizer has one token per character
    if config.max_new_tokens is None:
        return needed
    if is_embedded(config.model) and config.max_new_tokens < needed:
        raise ConfigError(f"max_new_tokens={config.max_new_tokens} cannot hold the task's longest answer plus the "
                          f"end-of-sequence token ({needed} tokens), so no response could be right; use >= {needed} "
                          "or leave it unset")
    return config.max_new_tokens


def _record_slots(model: PreTrainedModel, record_layers: tuple[int, ...] | None) -> list[int]:
    """Positions on the routes' layer axis of the MoE layers the per-token tables keep."""
    moe_layers = [s.layer for s in find_routers(model)]
    wanted = record_layers or tuple(moe_layers)
    unknown = sorted(set(wanted) - set(moe_layers))
    if unknown:
        raise ConfigError(f"record_layers {unknown} are not MoE layers of this model; valid: {moe_layers}")
    return [moe_layers.index(layer) for layer in sorted(set(wanted))]


def _record_stop(writer: RunWriter, run_dir: Path, exc: BaseException, step: int, checkpoint_bytes: int) -> None:
    """Mark the run ``interrupted`` (Ctrl-C) or ``failed`` with a message, clean temporaries, and re-raise."""
    hard_stop = isinstance(exc, KeyboardInterrupt)
    disk = write_failure(exc, run_dir, checkpoint_bytes) if isinstance(exc, OSError) else None
    what = disk or f"{type(exc).__name__}: {exc}"
    how = (f"continue with `moestab train --resume {run_dir}`" if complete_checkpoints(run_dir)
           else "it stopped before its first checkpoint; start over with --overwrite")
    message = f"step {step}: {what}; {how}"
    remove_temporaries(run_dir)
    try:
        writer.update(status=schema.STATUS_INTERRUPTED if hard_stop else schema.STATUS_FAILED,
                      error=message, last_step=max(step - 1, 0))
    except OSError as write_exc:  # e.g. the disk is full even for run.json: say both
        raise TrainingError(f"{message} (and run.json could not be updated: {write_exc})") from exc
    if isinstance(exc, Exception):  # the message says what happened and what to do; the cause is chained
        raise TrainingError(message) from exc
    raise exc  # a second Ctrl-C / SIGTERM, or the interpreter exiting


def _loop_state(history: SolvedPrompts | None) -> dict:
    """What the loop carries across steps, saved with each checkpoint for --resume."""
    return history.state() if history is not None else {}


class _Progress:
    """tqdm bar showing reward and routing volatility (no-op when disabled)."""

    def __init__(self, total: int, initial: int, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="train", unit="step", file=sys.stderr)

    def update(self, metrics: dict) -> None:
        if self.bar is None:
            return
        postfix = {"reward": f"{metrics['reward/mean']:.2f}",
                   "vol": f"{metrics['routing/old_new/changed']:.3f}"}
        if "eval/accuracy" in metrics:
            postfix["eval"] = f"{metrics['eval/accuracy']:.2f}"
        self.bar.set_postfix(postfix)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _progress(config: TrainConfig, start: int, *, enabled: bool = True) -> _Progress:
    return _Progress(config.steps, start, config.progress and enabled)
