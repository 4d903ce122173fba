"""One RL step from given weights, run as ``moestab train`` runs its first step: what the step probes share.

The step is ``moestab train``'s step :data:`FIRST_STEP` with ``--seed`` ``seed``: the same prompts
(``step_examples``), torch seed for the rollout's sampling, minibatch split and dynamic-sampling draws, and the
step settings ``moestab.train.recipe.step_settings`` resolves from a ``TrainConfig`` (preset, clip range, DAPO's
shaping; routing replay off; temperature, grad clipping and weight decay at ``moestab train``'s defaults). Only the
learning rate bypasses the config: the optimizer (``build_optimizer``, as training builds it, fresh) gets it directly,
so lr = 0, the control under which nothing may change, is allowed although ``moestab train`` refuses it.

Every number a step probe reports is read from the metrics ``run_step`` returns, i.e. the values metrics.jsonl would
hold (:data:`STEP_COLUMNS`, keys of docs/metrics.md); nothing is recomputed here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from moestab.analysis.summary import SUMMARY_KEYS
from moestab.configs import ConfigError
from moestab.metrics import keys
from moestab.probes.checkpoints import Checkpoint
from moestab.probes.errors import ProbeError
from moestab.probes.suites import TASK_PREFIX, ProbeSuite
from moestab.recording.step_tensors import StepTensors
from moestab.run_folder.reader import read_run_info
from moestab.tasks import DEFAULT_TASK, Example, Task, refuse_code_named_by, task_from_spec
from moestab.text import shown
from moestab.train.config import TrainConfig
from moestab.train.optim import build_optimizer
from moestab.train.recipe import DTYPES, response_budget, step_settings
from moestab.train.rollout import HFRolloutEngine
from moestab.train.step import run_step
from moestab.train.step_settings import StepSettings, extra_examples, step_examples, step_seed

FIRST_STEP = 1
"""The step of ``moestab train`` a probe step reproduces (its prompts and seeds)."""

STEP_COLUMNS: dict[str, str] = {
    # The names `moestab analyze` gives the same keys (SUMMARY_KEYS), so a probe row reads like a run's summary.
    **{name: SUMMARY_KEYS[name] for name in ("old_new_changed", "old_new_router_flip", "old_new_token_flip",
                                             "rollout_old_router_flip", "rollout_old_token_flip")},
    "ratio_token_log_var": keys.RATIO_TOKEN_LOG_VAR,
    "ratio_seq_log_var": keys.RATIO_SEQ_LOG_VAR,
    **{name: SUMMARY_KEYS[name] for name in ("clip_token_frac", "clip_token_frac_later")},
    "reward_mean": keys.REWARD_MEAN,
    "advantage_nonzero_frac": keys.ADVANTAGE_NONZERO,
    "grad_norm": keys.GRAD_NORM,
}
"""Column of a step probe's table -> the metrics.jsonl key it holds (docs/metrics.md)."""


@dataclass(frozen=True)
class StepRecipe:
    """What every step of a probe shares; the weights, the learning rate and the minibatch count vary."""

    task: Task
    algo: str = "grpo"
    """Objective preset (``moestab.rl.PRESETS``)."""
    prompts: int = TrainConfig.prompts_per_step
    """Prompts of the step."""
    group_size: int = TrainConfig.group_size
    """Samples per prompt."""
    seed: int = 0
    """``moestab train --seed``: the step's prompts, sampling and minibatch split."""
    max_new_tokens: int | None = None
    """Response cap; default: the task's longest answer plus the end-of-sequence token (as ``moestab train``)."""
    rollout_dtype: str | None = None
    """Precision the rollout engine samples in (``moestab train --rollout-dtype``, e.g. ``"bfloat16"`` for a
    production-like rollout->trainer gap); default: the policy's own."""

    def step_settings(self, minibatches: int) -> StepSettings:
        """The step's settings with ``minibatches`` updates, resolved as ``moestab train`` resolves them."""
        try:
            config = TrainConfig(algo=self.algo, task=self.task.spec, prompts_per_step=self.prompts,
                                 group_size=self.group_size, minibatches=minibatches, routing_replay="off",
                                 max_new_tokens=self.max_new_tokens, rollout_dtype=self.rollout_dtype,
                                 seed=self.seed, progress=False)
            return step_settings(config, response_budget(config, self.task))
        except ConfigError as exc:  # e.g. a minibatch count that does not divide the batch, with the valid ones
            raise ProbeError(str(exc)) from None

    def examples(self) -> list[Example]:
        return step_examples(self.task, self.prompts, self.seed, FIRST_STEP)

    def suite(self) -> ProbeSuite:
        """The step's prompts as the suite the probe result records (what the step ran on)."""
        return ProbeSuite(f"{TASK_PREFIX}{self.task.spec}",
                          f"prompts of moestab train's step {FIRST_STEP} with seed {self.seed} "
                          f"({self.prompts} prompts x {self.group_size} samples)",
                          tuple(ex.prompt for ex in self.examples()))


def probe_task(spec: str | None, checkpoints: Sequence[Checkpoint]) -> Task:
    """Task ``spec``; by default the run's task when the checkpoints are a run's, else :data:`DEFAULT_TASK`."""
    try:
        if spec is None:
            runs = list(dict.fromkeys(c.run for c in checkpoints if c.run is not None))
            spec = read_run_info(runs[0]).task if runs else DEFAULT_TASK
            if runs:
                refuse_code_named_by(spec, f"{runs[0]}/run.json")  # unless --task says it
        return task_from_spec(spec)
    except ValueError as exc:
        raise ProbeError(f"task {shown(spec)}: {exc}") from None


def prepare_tokenizer(tokenizer: PreTrainedTokenizerBase, recipe: StepRecipe, label: str) -> None:
    """Refuse a tokenizer that cannot run the step: no end-of-sequence token, or ``<unk>`` in the step's prompts or
    answers. A missing pad token is set to EOS, as ``moestab train`` does."""
    if tokenizer.eos_token_id is None:
        raise ProbeError(f"{label}: its tokenizer has no end-of-sequence token, which ends a rollout's responses")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    unk = tokenizer.unk_token_id
    if unk is None:  # byte-level vocabularies encode any text
        return
    for ex in recipe.examples():
        for text in (ex.prompt, ex.answer):
            if unk in tokenizer.encode(text, add_special_tokens=False):
                raise ProbeError(f"{label}: its tokenizer cannot encode task {recipe.task.spec}: {text!r} maps to "
                                 f"{tokenizer.unk_token!r}; give a --task in its vocabulary")


def one_step(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, recipe: StepRecipe, *, lr: float, minibatches: int,
) -> dict[str, object]:
    """The metrics (metrics.jsonl keys) of one step of ``model``, which it updates in place, at ``lr`` with
    ``minibatches`` updates on the rollout batch."""
    return one_step_with_tensors(model, tokenizer, recipe, lr=lr, minibatches=minibatches)[0]


def one_step_with_tensors(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, recipe: StepRecipe, *, lr: float, minibatches: int,
    optimizer: torch.optim.Optimizer | None = None,
) -> tuple[dict[str, object], StepTensors]:
    """:func:`one_step`, with the step's tensors (its rollout batch, routes and log-probs) beside its metrics.
    ``optimizer``: the one to step (e.g. a run's, its state restored), instead of a fresh one at ``lr``."""
    settings = recipe.step_settings(minibatches)
    seed = step_seed(recipe.seed, FIRST_STEP)
    torch.manual_seed(seed)  # the rollout samples from the global generator, as the loop seeds each step
    return run_step(
        model=model,
        optimizer=optimizer or build_optimizer(model.parameters(), lr=lr, weight_decay=TrainConfig.weight_decay),
        engine=HFRolloutEngine(model, tokenizer, dtype=DTYPES[recipe.rollout_dtype] if recipe.rollout_dtype else None),
        task=recipe.task, settings=settings, examples=recipe.examples(),
        generator=torch.Generator().manual_seed(seed),
        draw_more=extra_examples(recipe.task, recipe.prompts, recipe.seed, FIRST_STEP),
    )


def step_row(metrics: dict[str, object], columns: Sequence[str] = tuple(STEP_COLUMNS)) -> dict[str, object]:
    """``columns`` of :data:`STEP_COLUMNS`, read from a step's metrics."""
    return {column: metrics[STEP_COLUMNS[column]] for column in columns}


def require_signal(metrics: dict[str, object], where: str) -> None:
    """Refuse a step without learning signal: with every advantage 0 the policy loss has no gradient, so no update
    moves anything and every volatility would read 0 whatever the setting."""
    if metrics[keys.ADVANTAGE_NONZERO] == 0:
        raise ProbeError(f"{where}: every group's rewards were equal (mean reward {metrics[keys.REWARD_MEAN]:.3g}), so "
                         "every advantage was 0 and the update changed nothing; use a policy that is sometimes right "
                         "(a trained checkpoint, depth: --warm-start), more --prompts or --group-size, or a task whose "
                         "reward varies (e.g. 'arithmetic:reward=FILE.py:FUNCTION')")
