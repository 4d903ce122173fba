"""Wall time of moestab's RL step against TRL's GRPOTrainer, and of what routing costs inside a step.

Measured, all on CPU float32 with the same saved weights (the embedded tiny Qwen3-MoE from
``build_embedded_policy()``, written once with ``save_policy`` and loaded by every contender):

1. **moestab vs TRL.** The unit is one rollout cycle = one rollout batch of ``prompts x group``
   sequences sampled with plain HF ``generate`` (temperature 1, top-k off, same max completion
   length), then ``minibatches`` optimizer steps on it. moestab: one ``moestab.train.step.run_step``
   (algo ``grpo``, routing replay off, route recording as always; the optimizer and settings built
   as ``moestab train`` builds them). TRL 1.16: ``GRPOTrainer`` with ``steps_per_generation =
   minibatches``, ``per_device_train_batch_size = batch / minibatches``, ``num_iterations=1``,
   ``gradient_accumulation_steps=1``, ``loss_type="grpo"`` (sequence-mean of token-mean, as moestab's
   grpo preset), ``importance_sampling_level="token"``, ``epsilon=0.2``, ``epsilon_high=0.27`` (the
   preset's clip), ``scale_rewards="group"``, ``beta=0`` (no reference model), ``router_aux_loss_coef=0``
   (moestab adds no load-balancing loss), ``gradient_checkpointing=False``, ``bf16=False``, same lr /
   max grad norm, constant lr, no vLLM, no logging / saving / eval. Its reward wraps ``task.reward``.
   Both use fused AdamW (TRL's default; moestab's ``build_optimizer``). With ``steps_per_generation=4``
   and one gradient-accumulation
   step TRL also computes pi_old log-probs in a no-grad forward, as moestab does.

   How the two are timed, interleaved: TRL runs ``max_steps = minibatches * (rounds + 1)`` global
   steps in one ``trainer.train()``; a ``TrainerCallback`` reads the clocks (``time.perf_counter()``
   and ``time.process_time()``) at ``on_train_begin`` and at every ``on_step_end``. A TRL cycle
   ends at each global step that is a multiple of ``minibatches`` (generation happens at the first
   step of the next cycle, inside ``_prepare_inputs``). At that point the callback runs the moestab
   contenders (replay off, old, rollout, rollout-gates; their order rotated each round) on the *same prompts* TRL
   just used (TRL's dataset is ``step_examples`` of steps 1..rounds+1, in order, unshuffled), timing
   each ``run_step`` call, and only then restarts TRL's clock. So every round times one TRL cycle
   and one step of each moestab mode, back to back, and moestab's time never counts toward TRL's.
   Round 0 is warm-up for all. The work done is checked and printed: generated sequences,
   completion tokens and optimizer steps per cycle, and that both saw the same prompts. The freshly
   initialised policy rarely answers right, so rewards and advantages are mostly zero; neither
   trainer skips any work for that.

2. **Inside a moestab step**: ``run_step`` with routing replay ``old`` (R2) and ``rollout`` (R3) against
   ``off``, and ``off`` with ``routing_share`` (``moestab train --routing-share``: one more no-grad forward per
   minibatch) against ``off`` without it (the rounds above; ``--routing-share-only`` times just these two,
   alternating, without TRL or the micro-benchmarks, and checks that both end on the same weights);
   ``policy_forward(record=True)`` against ``record=False`` on one minibatch of a real rollout batch, without
   grad (as pi_old / pi_new run) and with grad plus backward (as the updates run); rollout ``model.generate``
   inside a ``RoutingRecorder`` (as ``HFRolloutEngine`` uses it, routes read out) against the same call without
   it, same seed; an update forward + backward replaying pi_old's routes (R2's update) against a free one; and
   the AdamW step with torch's default (per-tensor) implementation against ``fused=True``, the one both
   trainers use. These are interleaved round by round with the contender order rotated. ``--profile`` adds a
   cProfile of one more step.

Every ratio is median(contender) / median(baseline) over the rounds; single timings are never
reported. With ``--measure-every N`` (N > 1) a train row's sample is a block of N consecutive timed steps (one of
them measured), so its ratio is that of the run's average cost per step; ``--rounds`` must be a multiple of N.
Each is given for wall time and for process CPU time (``time.process_time``): on a shared
machine other jobs inflate wall time but hardly this process's CPU time, so when the two ratios
disagree trust the CPU one (with ``--threads 1`` every op runs on the calling thread, so CPU time
is the work done). The p25-p75 of the per-round ratios (contender and baseline timed back to back
in the same round) shows how much a ratio moved during the run. Rerun when in doubt.

Usage: .venv/bin/python bench/bench_train.py [--threads 1] [--rounds 10] [--quick] [--profile] [--task SPEC]
       [--routing-share-only] [--measure-fraction F] [--measure-every N]
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import platform
import pstats
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PrinterCallback, TrainerCallback

from moestab import rl
from moestab.metrics.routes import intersection_sizes
from moestab.models import EmbeddedModelSpec, build_embedded_policy, save_policy
from moestab.recording.batch import RolloutBatch
from moestab.recording.measure_budget import MeasureBudget
from moestab.recording.step_metrics import step_metrics
from moestab.recording.step_tensors import StepTensors
from moestab.routing import RoutingRecorder, find_routers
from moestab.run_folder.schema import GATE_REPLAY_MODES
from moestab.tasks import Example, Task, task_from_spec
from moestab.train.forward import chunked_policy_forward, policy_forward
from moestab.train.optim import build_optimizer
from moestab.train.rollout import HFRolloutEngine
from moestab.train.step import run_step
from moestab.train.step_settings import StepSettings, step_examples, step_seed

REPLAY_MODES = ("off", "old", "rollout", "rollout-gates")
SHARE = "off, routing share"
"""The contender ``off`` with ``routing_share`` on (``moestab train --routing-share``)."""
CONTENDERS = (*REPLAY_MODES, SHARE)


@dataclass(frozen=True)
class Setup:
    """What every contender shares."""

    policy_path: str
    task: Task
    prompts: int
    group: int
    minibatches: int
    max_new_tokens: int
    lr: float = 2e-4
    """moestab train's default learning rate (TrainConfig.lr), given to TRL too."""
    max_grad_norm: float = 1.0
    temperature: float = 1.0
    seed: int = 0
    algo: str = "grpo"
    budget: MeasureBudget = field(default_factory=MeasureBudget)
    """The measurement budget every moestab contender runs with (``moestab train --measure-fraction / -every``)."""

    @property
    def batch(self) -> int:
        return self.prompts * self.group


def load_policy(path: str) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def clock() -> tuple[float, float]:
    """(wall, process CPU) seconds now. CPU time counts only this process's work, so it is far less
    disturbed than wall time by other jobs on a shared machine (it still feels cache / SMT contention)."""
    return time.perf_counter(), time.process_time()


@dataclass
class Samples:
    """Wall and CPU seconds of each timed repetition of one contender."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def add(self, start: tuple[float, float], end: tuple[float, float]) -> None:
        self.wall.append(end[0] - start[0])
        self.cpu.append(end[1] - start[1])

    def periods(self, every: int) -> Samples:
        """Sums over consecutive blocks of ``every`` repetitions (an incomplete last block dropped): with a budget
        measuring every ``every``-th step, each block of timed steps 2.., ``every`` long, holds one measured step, so
        a block's time is what ``every`` steps cost on average over a run."""
        blocks = len(self.wall) // every
        return Samples([sum(self.wall[i * every:(i + 1) * every]) for i in range(blocks)],
                       [sum(self.cpu[i * every:(i + 1) * every]) for i in range(blocks)])


# ---- moestab -------------------------------------------------------------------------------
@dataclass
class MoestabRunner:
    """One moestab contender: its own model copy and optimizer, built as ``moestab train`` builds them."""

    setup: Setup
    replay: str
    routing_share: bool = False
    samples: Samples = field(default_factory=Samples)
    phases: list[dict[str, float]] = field(default_factory=list)
    sequences: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    optimizer_steps: list[int] = field(default_factory=list)  # per timed step
    last: StepTensors | None = None
    _steps_taken: int = 0

    def __post_init__(self) -> None:
        s = self.setup
        self.model = load_policy(s.policy_path)
        tokenizer = AutoTokenizer.from_pretrained(s.policy_path)
        # As moestab.train.loop.train builds it.
        self.optimizer = build_optimizer(self.model.parameters(), lr=s.lr, weight_decay=0.0)
        self.optimizer.register_step_post_hook(self._count_optimizer_step)
        self.engine = HFRolloutEngine(self.model, tokenizer, gates=self.replay in GATE_REPLAY_MODES)
        preset = rl.get_preset(s.algo)
        self.settings = StepSettings(
            preset=preset, replay=self.replay, minibatches=s.minibatches, group_size=s.group, temperature=s.temperature,
            max_new_tokens=s.max_new_tokens, max_grad_norm=s.max_grad_norm,
            measure_switches=frozenset({"routing_share"}) if self.routing_share else frozenset(),
        )

    def _count_optimizer_step(self, *_: object) -> None:
        self._steps_taken += 1

    def step(self, step: int, *, timed: bool) -> None:
        """Run step ``step`` as ``moestab train`` does (same seeding), timing the ``run_step`` call."""
        s = self.setup
        seed = step_seed(s.seed, step)
        examples = step_examples(s.task, s.prompts, s.seed, step)
        torch.manual_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        before = self._steps_taken
        measured = None if s.budget.full else s.budget.rows(step, s.batch, s.group, seed + 2)  # as moestab train
        start = clock()
        metrics, tensors = run_step(
            model=self.model, optimizer=self.optimizer, engine=self.engine, task=s.task, settings=self.settings,
            examples=examples, generator=generator, measured=measured,
        )
        end = clock()
        self.last = tensors
        if not timed:
            return
        self.samples.add(start, end)
        self.sequences.append(tensors.batch.batch_size)
        self.tokens.append(int(tensors.batch.response_mask.sum()))
        self.optimizer_steps.append(self._steps_taken - before)
        rollout, update, inner = metrics["time/rollout_s"], metrics["time/update_s"], metrics["time/step_s"]
        # time/step_s is taken before the step's metrics (routing volatility etc.) are computed.
        self.phases.append({
            "rollout (generate + route recording)": rollout,
            "rewards, pi_old and pi_new forwards": inner - rollout - update,
            f"{s.minibatches} updates (fwd + bwd + clip + AdamW)": update,
            "step metrics (routing volatility, mismatch, load)": end[0] - start[0] - inner,
        })


# ---- TRL -----------------------------------------------------------------------------------
def trl_config(setup: Setup, out_dir: str, rounds: int, optim: str):
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=out_dir, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        per_device_train_batch_size=setup.batch // setup.minibatches, gradient_accumulation_steps=1,
        steps_per_generation=setup.minibatches, num_iterations=1, num_generations=setup.group,
        max_completion_length=setup.max_new_tokens, temperature=setup.temperature, top_k=0, top_p=1.0,
        beta=0.0, loss_type="grpo", importance_sampling_level="token", epsilon=0.2, epsilon_high=0.27,
        scale_rewards="group", router_aux_loss_coef=0.0, learning_rate=setup.lr, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_grad_norm=setup.max_grad_norm, optim=optim,
        max_steps=setup.minibatches * (rounds + 1), shuffle_dataset=False, dataloader_num_workers=0,
        logging_strategy="no", save_strategy="no", eval_strategy="no", report_to="none", disable_tqdm=True,
        log_completions=False, seed=setup.seed,
    )


class CycleClock(TrainerCallback):
    """Times TRL rollout cycles (``minibatches`` global steps each) and runs ``between`` after each one.

    ``between(cycle)`` runs outside TRL's clock: the next cycle's time starts when it returns.
    """

    def __init__(self, minibatches: int, between: Callable[[int], None]) -> None:
        self.minibatches = minibatches
        self.between = between
        self.cycles = Samples()  # every cycle, warm-up included
        self.generation_steps: list[float] = []  # first global step of a cycle: generate + pi_old + 1 update
        self.update_steps: list[float] = []  # the other global steps: 1 update each
        self.optimizer_steps: list[int] = []  # per cycle
        self._steps_taken = 0
        self._cycle_start = self._step_start = (0.0, 0.0)

    def on_train_begin(self, args, state, control, **kwargs):
        self._cycle_start = self._step_start = clock()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self._steps_taken += 1

    def on_step_end(self, args, state, control, **kwargs):
        now = clock()
        first_of_cycle = (state.global_step - 1) % self.minibatches == 0
        (self.generation_steps if first_of_cycle else self.update_steps).append(now[0] - self._step_start[0])
        self._step_start = now
        if state.global_step % self.minibatches == 0:
            self.cycles.add(self._cycle_start, now)
            self.optimizer_steps.append(self._steps_taken)
            self._steps_taken = 0
            self.between(state.global_step // self.minibatches - 1)
            self._cycle_start = self._step_start = clock()


class RewardLog:
    """TRL's reward function: ``task.reward`` per completion, counting the work it is shown."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.__name__ = "task_reward"  # TRL names the reward column after it
        self.prompts: list[list[str]] = []  # per call (= per rollout batch)
        self.sequences: list[int] = []
        self.tokens: list[int] = []

    def __call__(self, prompts, completions, completion_ids, answer, **_: object) -> list[float]:
        self.prompts.append(list(prompts))
        self.sequences.append(len(completions))
        self.tokens.append(sum(len(ids) for ids in completion_ids))
        return [self.task.reward(Example(p, a), c) for p, c, a in zip(prompts, completions, answer, strict=True)]


# ---- part 1 + 2a: interleaved rounds of TRL cycles and moestab steps ------------------------
@dataclass
class TrainRounds:
    trl_cycles: Samples
    trl_generation_steps: list[float]
    trl_update_steps: list[float]
    trl_optimizer_steps: list[int]
    trl_rewards: RewardLog
    moestab: dict[str, MoestabRunner]


def run_train_rounds(setup: Setup, rounds: int, trl_optim: str, work_dir: str) -> TrainRounds:
    from datasets import Dataset
    from trl import GRPOTrainer

    runners = moestab_runners(setup, CONTENDERS)

    def moestab_round(cycle: int) -> None:
        run_round(runners, cycle)

    # TRL reads prompts in dataset order: cycle c sees the prompts of moestab's step c + 1.
    examples = [ex for step in range(1, rounds + 2)
                for ex in step_examples(setup.task, setup.prompts, setup.seed, step)]
    dataset = Dataset.from_dict({"prompt": [ex.prompt for ex in examples], "answer": [ex.answer for ex in examples]})
    rewards = RewardLog(setup.task)
    cycle_clock = CycleClock(setup.minibatches, moestab_round)
    trainer = GRPOTrainer(
        model=load_policy(setup.policy_path), reward_funcs=rewards, args=trl_config(setup, work_dir, rounds, trl_optim),
        train_dataset=dataset, processing_class=AutoTokenizer.from_pretrained(setup.policy_path),
        callbacks=[cycle_clock],
    )
    trainer.remove_callback(PrinterCallback)  # it prints the end-of-training summary
    trainer.train()
    expected = [[ex.prompt for ex in step_examples(setup.task, setup.prompts, setup.seed, step)
                 for _ in range(setup.group)] for step in range(1, rounds + 2)]
    if rewards.prompts != expected:
        raise RuntimeError("TRL did not see the prompts moestab used, in the same order; the comparison is void")
    warmup_updates = setup.minibatches - 1  # update-only global steps of the warm-up cycle
    cycles = cycle_clock.cycles
    return TrainRounds(
        trl_cycles=Samples(cycles.wall[1:], cycles.cpu[1:]), trl_generation_steps=cycle_clock.generation_steps[1:],
        trl_update_steps=cycle_clock.update_steps[warmup_updates:],
        trl_optimizer_steps=cycle_clock.optimizer_steps[1:], trl_rewards=rewards, moestab=runners,
    )


def moestab_runners(setup: Setup, names: tuple[str, ...]) -> dict[str, MoestabRunner]:
    return {name: MoestabRunner(setup, "off", routing_share=True) if name == SHARE else MoestabRunner(setup, name)
            for name in names}


def run_round(runners: dict[str, MoestabRunner], cycle: int) -> None:
    """Step ``cycle + 1`` of every runner, the order rotated each round; round 0 is warm-up."""
    names = list(runners)
    turn = cycle % len(names)
    for name in names[turn:] + names[:turn]:
        runners[name].step(cycle + 1, timed=cycle > 0)


def run_share_rounds(setup: Setup, rounds: int) -> dict[str, MoestabRunner]:
    """``--routing-share-only``: replay ``off`` with and without ``routing_share``, alternating, 1 + ``rounds``
    steps each; ``RuntimeError`` unless both end on bit-identical weights (the extra forward changes no update)."""
    runners = moestab_runners(setup, ("off", SHARE))
    for cycle in range(rounds + 1):
        run_round(runners, cycle)
    pairs = zip(runners["off"].model.parameters(), runners[SHARE].model.parameters(), strict=True)
    if not all(torch.equal(a, b) for a, b in pairs):
        raise RuntimeError("routing_share changed the weights: the comparison is void")
    return runners


# ---- part 2b: recording and optimizer micro-benchmarks --------------------------------------
def interleave(contenders: dict[str, Callable[[], None]], rounds: int, warmup: int = 1) -> dict[str, Samples]:
    """Times of each contender over ``rounds`` rounds (after ``warmup``), order rotated each round."""
    names = list(contenders)
    samples = {n: Samples() for n in names}
    for r in range(warmup + rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            start = clock()
            contenders[name]()
            end = clock()
            if r >= warmup:
                samples[name].add(start, end)
    return samples


def micro_contenders(setup: Setup) -> dict[str, Callable[[], None]]:
    model = load_policy(setup.policy_path)
    tokenizer = AutoTokenizer.from_pretrained(setup.policy_path)
    engine = HFRolloutEngine(model, tokenizer)
    prompts = [ex.prompt for ex in step_examples(setup.task, setup.prompts, setup.seed, 1) for _ in range(setup.group)]
    torch.manual_seed(0)
    batch = engine.generate(prompts, max_new_tokens=setup.max_new_tokens, temperature=setup.temperature)
    rows = torch.randperm(batch.batch_size, generator=torch.Generator().manual_seed(0)).chunk(setup.minibatches)[0]
    mb: RolloutBatch = batch.select(rows.sort().values)
    with torch.no_grad():
        old_routes = policy_forward(model.eval(), mb, temperature=setup.temperature).routes  # what R2 replays
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)

    def forward_no_grad(record: bool) -> Callable[[], None]:
        def run() -> None:
            model.eval()
            with torch.no_grad():
                policy_forward(model, mb, temperature=setup.temperature, record=record, entropy=True)
        return run

    def forward_backward(record: bool, replay: bool = False) -> Callable[[], None]:
        def run() -> None:
            model.train()
            model.zero_grad(set_to_none=True)
            fwd = policy_forward(model, mb, temperature=setup.temperature, record=record,
                                 replay=old_routes if replay else None)
            (fwd.logp * mb.response_mask).sum().backward()
        return run

    def generate(record: bool) -> Callable[[], None]:
        def run() -> None:
            model.eval()
            torch.manual_seed(1)  # same samples with and without the recorder
            recorder = RoutingRecorder(model, margin=False, entropy=False) if record else nullcontext()
            with torch.no_grad(), recorder:
                model.generate(
                    input_ids=enc.input_ids, attention_mask=enc.attention_mask, do_sample=True,
                    temperature=setup.temperature, top_k=0, top_p=1.0, max_new_tokens=setup.max_new_tokens,
                    eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                    output_logits=True, return_dict_in_generate=True,
                )
            if record:
                recorder.routes  # noqa: B018 -- stitching the decode steps is part of recording
        return run

    # Optimizer step on real gradients (from one update-style forward + backward).
    forward_backward(True)()
    params = [p for p in model.parameters() if p.requires_grad]
    grad_copy = [p.grad.detach().clone() for p in params]
    optimizers = {
        "adamw_default": torch.optim.AdamW(params, lr=setup.lr, weight_decay=0.0),
        "adamw_fused": torch.optim.AdamW(params, lr=setup.lr, weight_decay=0.0, fused=True),
    }

    def optimizer_step(name: str) -> Callable[[], None]:
        def run() -> None:
            for p, g in zip(params, grad_copy, strict=True):
                p.grad = g
            with torch.no_grad():
                optimizers[name].step()
        return run

    return {
        "fwd_rec": forward_no_grad(True), "fwd_plain": forward_no_grad(False),
        "fwdbwd_rec": forward_backward(True), "fwdbwd_plain": forward_backward(False),
        "fwdbwd_replay": forward_backward(True, replay=True),
        "gen_rec": generate(True), "gen_plain": generate(False),
        **{name: optimizer_step(name) for name in optimizers},
    }


# ---- profile of one moestab step ------------------------------------------------------------
PROFILE_ROWS = (
    ("moestab/train/step.py", "run_step", "run_step (whole step)"),
    ("moestab/train/rollout.py", "generate", "HFRolloutEngine.generate (rollout)"),
    ("moestab/train/forward.py", "chunked_policy_forward", "chunked_policy_forward (pi_old + pi_new, no grad)"),
    ("moestab/train/forward.py", "policy_forward", "policy_forward (all trainer forwards)"),
    ("torch/_tensor.py", "backward", "backward"),
    ("torch/optim/adam.py", "adam", "AdamW step (fused, as build_optimizer makes it)"),
    ("torch/nn/utils/clip_grad.py", "clip_grad_norm_", "clip_grad_norm_"),
    ("moestab/recording/step_metrics.py", "step_metrics", "step_metrics (all step metrics)"),
    ("moestab/metrics/routes.py", "intersection_sizes", "  of which intersection_sizes (route kernel)"),
    ("moestab/routing/discovery.py", "find_routers", "find_routers (each RoutingRecorder / RoutingReplay)"),
    ("moestab/routing/recorder.py", "hook", "RoutingRecorder router hooks"),
    ("moestab/routing/recorder.py", "_end", "RoutingRecorder per-forward stacking"),
)


def profile_step(runner: MoestabRunner, step: int) -> list[tuple[str, int, float]]:
    """cProfile of one more step: calls and cumulative seconds of the ``PROFILE_ROWS`` functions."""
    profiler = cProfile.Profile()
    profiler.enable()
    runner.step(step, timed=False)
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # {(file, line, func): (cc, ncalls, tottime, cumtime, callers)}
    rows = []
    for suffix, func, label in PROFILE_ROWS:
        hits = [v for (file, _, name), v in stats.items() if file.endswith(suffix) and name == func]
        rows.append((label, sum(v[1] for v in hits), sum(v[3] for v in hits)))
    return rows


def evidence_contenders(runner: MoestabRunner) -> dict[str, Callable[[], None]]:
    """Unprofiled timings behind the suggestions in docs/benchmarks.md, on the runner's last step."""
    t = runner.last
    batch, model = t.batch, runner.model

    def response_routes(indices: torch.Tensor):
        return indices[:, batch.prompt_len - 1 :][batch.response_mask].numpy()  # [tokens, layers, k]

    old, new = response_routes(t.routes_old_free.indices), response_routes(t.routes_new.indices)
    chunks = [rows.sort().values for rows in torch.randperm(batch.batch_size).chunk(runner.settings.minibatches)]

    def pi_new(chunked: bool) -> Callable[[], None]:
        def run() -> None:
            with torch.no_grad():
                if chunked:
                    chunked_policy_forward(model, batch, chunks, temperature=runner.settings.temperature)
                else:
                    policy_forward(model, batch, temperature=runner.settings.temperature)
        return run

    return {
        "`step_metrics(replay='off')` (all step metrics)": lambda: step_metrics(t, replay="off"),
        "`intersection_sizes(old, new)` (its numeric kernel)": lambda: intersection_sizes(old, new, threads=1),
        "`find_routers(model)` (run by every RoutingRecorder / RoutingReplay)": lambda: find_routers(model),
        f"pi_new as run_step runs it: `chunked_policy_forward`, {len(chunks)} chunks": pi_new(True),
        f"pi_new as one `policy_forward` over all {batch.batch_size} rows": pi_new(False),
    }


# ---- report ---------------------------------------------------------------------------------
def med(values: list[float]) -> float:
    return statistics.median(values)


def ratio_row(label: str, contender: Samples, baseline: Samples) -> str:
    """Medians, ratio of wall medians, ratio of CPU medians, and the spread of per-round (paired) wall ratios."""
    paired = sorted(c / b for c, b in zip(contender.wall, baseline.wall, strict=True))
    q1, _, q3 = statistics.quantiles(paired, n=4) if len(paired) > 1 else (paired[0],) * 3
    return (f"| {label} | {med(contender.wall) * 1e3:.1f} | {med(baseline.wall) * 1e3:.1f} | "
            f"**{med(contender.wall) / med(baseline.wall):.2f}x** | {med(contender.cpu) / med(baseline.cpu):.2f}x | "
            f"{q1:.2f}-{q3:.2f} |")


def report_share(runners: dict[str, MoestabRunner], setup: Setup, rounds: int) -> None:
    """``--routing-share-only``'s report: the ratio row and both contenders' phases."""
    off, share = runners["off"], runners[SHARE]
    print(f"torch {torch.__version__}; {platform.machine()}, {torch.get_num_threads()} torch thread(s); task "
          f"{setup.task.spec}; embedded policy (qwen3_moe 4L, 8E, top-2, h128); rollout {setup.prompts} prompts x "
          f"{setup.group} = {setup.batch} seqs, max {setup.max_new_tokens} new tokens, {setup.minibatches} updates "
          f"per rollout; {rounds} timed rounds (+1 warm-up), order alternated; weights bit-identical after "
          f"{rounds + 1} steps each (checked)\n")
    print("| measurement | contender ms | baseline ms | ratio (wall) | ratio (CPU time) "
          "| per-round wall ratio p25-p75 |")
    print("|---|---|---|---|---|---|")
    print(ratio_row("`run_step` replay `off` with `routing_share` vs without", share.samples, off.samples))
    print("\nWhere the time goes (wall medians over the timed rounds, ms):\n")
    print("| phase | off | off, routing share |")
    print("|---|---|---|")
    for name in off.phases[0]:
        print(f"| {name} | {med([p[name] for p in off.phases]) * 1e3:.1f} | "
              f"{med([p[name] for p in share.phases]) * 1e3:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds of train steps, after 1 warm-up")
    parser.add_argument("--micro-rounds", type=int, default=20, help="timed rounds of the micro-benchmarks")
    parser.add_argument("--quick", action="store_true", help="short run: 3 rounds, 5 micro rounds")
    parser.add_argument("--task", default="arithmetic",
                        help="task spec (default arithmetic: ~4-token responses; sort:length=32 = configs/long.yaml's "
                             "33-token responses)")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt")
    parser.add_argument("--minibatches", type=int, default=4, help="optimizer steps per rollout batch")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="max completion length (default: moestab train's, the task's longest answer + 1)")
    parser.add_argument("--trl-optim", default="adamw_torch_fused",
                        help="TRL's optim (default: fused AdamW, like moestab; 'adamw_torch' = per-tensor)")
    parser.add_argument("--profile", action="store_true", help="also cProfile one moestab step (replay off)")
    parser.add_argument("--measure-fraction", type=float, default=1.0,
                        help="measurement budget of every moestab contender: share of groups (moestab train's flag)")
    parser.add_argument("--measure-every", type=int, default=1, help="measurement budget: every N-th step")
    parser.add_argument("--routing-share-only", action="store_true",
                        help="time only replay off with vs without routing_share (no TRL, no micro-benchmarks)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.micro_rounds = 3, 5
    if args.prompts * args.group % args.minibatches:
        parser.error("prompts * group must be divisible by minibatches (TRL's per-device batch size)")
    if args.rounds % args.measure_every:
        parser.error("rounds must be a multiple of --measure-every (each block of measure-every steps is one sample)")
    if args.group < 2 or min(args.threads, args.rounds, args.micro_rounds, args.prompts, args.minibatches) < 1:
        parser.error("group must be >= 2 and threads, rounds, micro-rounds, prompts, minibatches >= 1")

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")  # TRL / transformers advice irrelevant to a CPU timing run
    logging.getLogger("transformers").setLevel(logging.ERROR)
    import datasets
    import transformers
    import trl
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    task = task_from_spec(args.task)
    with tempfile.TemporaryDirectory() as tmp:
        model, tokenizer = build_embedded_policy(EmbeddedModelSpec())
        policy_path = str(save_policy(model, tokenizer, Path(tmp) / "policy"))
        setup = Setup(policy_path=policy_path, task=task, prompts=args.prompts, group=args.group,
                      minibatches=args.minibatches, max_new_tokens=args.max_new_tokens or task.max_answer_chars + 1,
                      budget=MeasureBudget(fraction=args.measure_fraction, every=args.measure_every))
        if args.routing_share_only:
            report_share(run_share_rounds(setup, args.rounds), setup, args.rounds)
            return
        train = run_train_rounds(setup, args.rounds, args.trl_optim, str(Path(tmp) / "trl"))
        micro = interleave(micro_contenders(setup), args.micro_rounds)
        threads_seen = torch.get_num_threads()
        profile = evidence = None
        if args.profile:
            profile = profile_step(train.moestab["off"], args.rounds + 2)
            evidence = interleave(evidence_contenders(train.moestab["off"]), args.micro_rounds)

    off = train.moestab["off"]
    mb_rows = setup.batch // setup.minibatches
    every = setup.budget.every
    unit = "one rollout cycle" if every == 1 else f"{every} rollout cycles, one of them measured,"
    step_times = {name: runner.samples.periods(every) for name, runner in train.moestab.items()}
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}; "
          f"{platform.machine()}, {threads_seen} torch thread(s); task {task.spec}; embedded policy "
          f"(qwen3_moe 4L, 8E, top-2, h128); rollout {setup.prompts} prompts x {setup.group} = {setup.batch} seqs, "
          f"max {setup.max_new_tokens} new tokens, {setup.minibatches} updates per rollout; "
          f"{args.rounds} timed rounds (+1 warm-up), {args.micro_rounds} micro rounds; TRL optim {args.trl_optim}; "
          f"measurement budget fraction {setup.budget.fraction:g}, every {setup.budget.every}\n")

    r = train.trl_rewards
    print("Work per rollout cycle (timed rounds):\n")
    print("| | moestab (replay off) | TRL GRPOTrainer |")
    print("|---|---|---|")
    print(f"| generated sequences | {sorted(set(off.sequences))} | {sorted(set(r.sequences[1:]))} |")
    print(f"| completion tokens, mean | {statistics.mean(off.tokens):.0f} | {statistics.mean(r.tokens[1:]):.0f} |")
    print(f"| optimizer steps | {sorted(set(off.optimizer_steps))} | {sorted(set(train.trl_optimizer_steps))} |")
    print(f"| prompts | step_examples of steps 1..{args.rounds + 1} | the same, in the same order (checked) |\n")

    print("| measurement | contender ms | baseline ms | ratio (wall) | ratio (CPU time) "
          "| per-round wall ratio p25-p75 |")
    print("|---|---|---|---|---|---|")
    rows = [
        (f"moestab `run_step` (grpo, replay off) vs TRL `GRPOTrainer`, {unit} "
         f"({setup.batch} seqs + {setup.minibatches} updates each)", step_times["off"],
         train.trl_cycles.periods(every)),
        ("`run_step` replay `old` (R2) vs `off`", step_times["old"], step_times["off"]),
        ("`run_step` replay `rollout` (R3) vs `off`", step_times["rollout"], step_times["off"]),
        ("`run_step` replay `rollout-gates` (TRR) vs `off`", step_times["rollout-gates"], step_times["off"]),
        ("`run_step` replay `off` with `routing_share` vs without", step_times[SHARE], step_times["off"]),
        (f"`policy_forward` no grad, `record=True` vs `False` ({mb_rows} seqs)", micro["fwd_rec"], micro["fwd_plain"]),
        (f"`policy_forward` + backward, `record=True` vs `False` ({mb_rows} seqs)",
         micro["fwdbwd_rec"], micro["fwdbwd_plain"]),
        (f"`policy_forward` + backward, replaying pi_old's routes vs free ({mb_rows} seqs, both recorded)",
         micro["fwdbwd_replay"], micro["fwdbwd_rec"]),
        (f"rollout `model.generate` ({setup.batch} seqs) with vs without `RoutingRecorder`",
         micro["gen_rec"], micro["gen_plain"]),
        ("AdamW step: torch's default per-tensor `AdamW()` vs `fused=True` (what both trainers use)",
         micro["adamw_default"], micro["adamw_fused"]),
    ]
    for label, contender, baseline in rows:
        print(ratio_row(label, contender, baseline))

    per = "" if every == 1 else f", per step: the median over blocks of {every} steps of their mean"
    print(f"\nWhere the time goes (wall medians over the timed rounds{per}, ms):\n")
    print("| moestab step (replay off) | ms | TRL cycle | ms |")
    print("|---|---|---|---|")
    phases = {name: med([statistics.mean(p[name] for p in off.phases[i * every:(i + 1) * every])
                         for i in range(len(off.phases) // every)]) for name in off.phases[0]}
    trl_phases = {
        "first global step: generate + rewards + pi_old + 1 update": med(train.trl_generation_steps),
        f"each of the other {setup.minibatches - 1} global steps (1 update)": med(train.trl_update_steps),
    }
    left, right = list(phases.items()), list(trl_phases.items())
    for i in range(max(len(left), len(right))):
        a = f"{left[i][0]} | {left[i][1] * 1e3:.1f}" if i < len(left) else " | "
        b = f"{right[i][0]} | {right[i][1] * 1e3:.1f}" if i < len(right) else " | "
        print(f"| {a} | {b} |")

    if profile:
        print("\ncProfile of one more moestab step (replay off; the profiler inflates Python-heavy parts):\n")
        print("| function | calls | cumulative ms |")
        print("|---|---|---|")
        for label, calls, cumulative in profile:
            print(f"| {label} | {calls} | {cumulative * 1e3:.1f} |")
        print("\nUnprofiled, on that step's batch (wall medians, interleaved):\n")
        print("| measurement | ms | CPU ms |")
        print("|---|---|---|")
        for label, samples in evidence.items():
            print(f"| {label} | {med(samples.wall) * 1e3:.2f} | {med(samples.cpu) * 1e3:.2f} |")


if __name__ == "__main__":
    main()
