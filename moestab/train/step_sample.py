"""A step's rollout and rewards: the engine samples ``group_size`` responses a prompt, the task scores them (plus
DAPO's overlong shaping), and with DAPO's dynamic sampling groups without signal are dropped and more prompts drawn.
Over several processes each samples its share and the decisions are the whole step's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from moestab.metrics import keys
from moestab.recording.batch import RolloutBatch, cat_batches
from moestab.rl.shaping import overlong_penalty
from moestab.tasks import Example, Task
from moestab.train.distributed import SINGLE, World
from moestab.train.engine import RolloutEngine
from moestab.train.step_settings import StepSettings


def _rewards(task: Task, examples: list[Example], batch: RolloutBatch, s: StepSettings, dtype: torch.dtype):
    """Per sequence ``[B]``: task reward, overlong penalty (zeros when shaping is off) and correctness."""
    per_seq = [ex for ex in examples for _ in range(s.group_size)]
    rewards = torch.tensor([task.reward(ex, c) for ex, c in zip(per_seq, batch.completions, strict=True)],
                           dtype=dtype)  # [B]
    correct = torch.tensor([task.is_correct(ex, c) for ex, c in zip(per_seq, batch.completions, strict=True)])
    penalty = torch.zeros_like(rewards)  # [B]
    if s.overlong_cache:
        penalty = overlong_penalty(batch.response_mask.sum(-1), s.max_new_tokens, s.overlong_cache).to(rewards.dtype)
    return rewards, penalty, correct


@dataclass(frozen=True)
class Sampled:
    batch: RolloutBatch
    examples: list[Example]
    rewards: torch.Tensor  # [B] task reward + shaping: what the advantages use
    correct: torch.Tensor  # [B]
    metrics: dict[str, float]  # shaping and dynamic-sampling counts


_Part = tuple[RolloutBatch, list[Example], torch.Tensor, torch.Tensor, torch.Tensor]
"""Groups of one rollout round: their batch rows, prompts, task rewards ``[b]``, penalties ``[b]``, correctness
``[b]``."""


@dataclass
class _Rounds:
    """The rollout rounds of one process: groups with signal and dropped ones, each tagged with its round."""

    kept: list[tuple[int, _Part]] = field(default_factory=list)
    spare: list[tuple[int, _Part]] = field(default_factory=list)
    drawn: int = 0  # prompts sampled
    dropped: int = 0  # groups without signal
    extra: int = 0  # rounds beyond the first


def _draw(engine: RolloutEngine, task: Task, examples: list[Example], s: StepSettings,
          draw_more: Callable[[int], list[Example]] | None, world: World, dtype: torch.dtype) -> _Rounds:
    """Roll out ``examples``; with dynamic sampling, more rounds until the groups with signal of every process fill
    the step or the budget of extra rounds is spent."""
    G, out, round_examples = s.group_size, _Rounds(), examples
    while True:
        prompts = [ex.prompt for ex in round_examples for _ in range(G)]
        batch = engine.generate(prompts, max_new_tokens=s.max_new_tokens, temperature=s.temperature)
        task_rewards, penalty, correct = _rewards(task, round_examples, batch, s, dtype)
        out.drawn += len(round_examples)
        if not s.dynamic_sampling:
            out.kept.append((out.extra, (batch, round_examples, task_rewards, penalty, correct)))
            return out
        groups = (task_rewards + penalty).view(-1, G)  # [groups, G]
        signal = groups.max(dim=1).values != groups.min(dim=1).values  # [groups]
        out.dropped += int((~signal).sum())
        for flag, bucket in ((True, out.kept), (False, out.spare)):
            ids = torch.nonzero(signal == flag).flatten().tolist()
            if ids:
                rows = torch.tensor([g * G + j for g in ids for j in range(G)])
                bucket.append((out.extra, (batch.select(rows), [round_examples[g] for g in ids], task_rewards[rows],
                                           penalty[rows], correct[rows])))
        have = world.sum(sum(len(part[1]) for _, part in out.kept))  # every process's groups with signal
        if have >= len(examples) * world.size or draw_more is None or out.extra >= s.dynamic_sampling_rounds:
            return out
        out.extra += 1
        round_examples = draw_more(out.extra)


def _groups(parts: list[_Part], first: int, needed: int, G: int) -> list[_Part]:
    """Groups ``first`` .. ``first + needed`` of ``parts`` taken in order."""
    skip, take, out = first, needed, []
    for batch, exs, task_rewards, penalty, correct in parts:
        start = min(skip, len(exs))
        n = min(take, len(exs) - start)
        skip -= start
        if n > 0:
            rows = torch.arange(start * G, (start + n) * G)
            out.append((batch.select(rows), exs[start : start + n], task_rewards[rows], penalty[rows], correct[rows]))
            take -= n
    return out


@keys.computes(keys.REWARD_TASK_MEAN, keys.REWARD_OVERLONG_PENALTY, keys.REWARD_OVERLONG_FRAC, keys.SAMPLING_DRAWN,
               keys.SAMPLING_DROPPED, keys.SAMPLING_EXTRA, keys.SAMPLING_FILLED)
def sample(
    engine: RolloutEngine, task: Task, examples: list[Example], s: StepSettings,
    draw_more: Callable[[int], list[Example]] | None, world: World = SINGLE, dtype: torch.dtype = torch.float32,
) -> Sampled:
    """The rollout and its rewards; with dynamic sampling (DAPO), groups whose rewards are all equal (no
    signal: every advantage 0) are dropped and more prompts are drawn, up to ``s.dynamic_sampling_rounds``
    extra rollouts. If the budget runs out, dropped groups fill the batch, so its size stays fixed.

    Over several processes each samples its share of every round (``examples``, ``draw_more``), and the
    decisions are the whole step's: rounds go on until the groups with signal of *all* processes fill the
    batch, the groups are taken in one process's order, and each process keeps its block of them."""
    needed = len(examples)
    rounds = _draw(engine, task, examples, s, draw_more, world, dtype)
    if world.distributed and s.dynamic_sampling:
        parts, first = _whole_step_parts(world, rounds.kept, rounds.spare), world.rank * needed
    else:
        parts, first = [part for _, part in (*rounds.kept, *rounds.spare)], 0  # groups with signal first
    out = _groups(parts, first, needed, s.group_size)
    batch = cat_batches([p[0] for p in out], engine.tokenizer.pad_token_id)
    examples = [ex for p in out for ex in p[1]]
    task_rewards, penalty, correct = (torch.cat([p[i] for p in out]) for i in (2, 3, 4))
    metrics: dict[str, float] = {}
    if s.overlong_cache:
        metrics = {keys.REWARD_TASK_MEAN: task_rewards.mean().item(),
                   keys.REWARD_OVERLONG_PENALTY: penalty.mean().item(),
                   keys.REWARD_OVERLONG_FRAC: (penalty < 0).float().mean().item()}
    if s.dynamic_sampling:  # the whole step's counts, on every process
        with_signal = world.sum(sum(len(part[1]) for _, part in rounds.kept))
        filled = max(0, needed * world.size - int(with_signal))
        metrics.update({keys.SAMPLING_DRAWN: int(world.sum(rounds.drawn)),
                        keys.SAMPLING_DROPPED: int(world.sum(rounds.dropped)), keys.SAMPLING_EXTRA: rounds.extra,
                        keys.SAMPLING_FILLED: filled})
    return Sampled(batch, examples, task_rewards + penalty, correct, metrics)


def _whole_step_parts(world: World, kept: list[tuple[int, _Part]], spare: list[tuple[int, _Part]]) -> list[_Part]:
    """Every process's rounds in one process's order: groups with signal by round, then by process (a round's
    prompts are split in contiguous blocks), then the dropped ones likewise; on the CPU, for every process."""
    def cpu(part: _Part) -> _Part:
        batch, exs, *tensors = part
        return (batch.to("cpu"), exs, *(t.cpu() for t in tensors))

    everyone = world.all_gather(([(r, cpu(p)) for r, p in kept], [(r, cpu(p)) for r, p in spare]))
    ordered = []
    for bucket in (0, 1):
        tagged = [(r, rank, part) for rank, buckets in enumerate(everyone) for r, part in buckets[bucket]]
        ordered += [part for _, _, part in sorted(tagged, key=lambda t: (t[0], t[1]))]
    return ordered
