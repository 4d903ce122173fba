"""SRPO's history resampling: prompts whose whole group was right the last time they were drawn are skipped.

SRPO (Kwai, arXiv 2504.14286): after an epoch, drop the prompts whose every rollout was correct, since their
groups carry no signal (every advantage 0). moestab samples prompts per step rather than by epoch, so a prompt
is skipped when its last group was all correct, and forgiven when a later group of it was not. The set of
solved prompts is part of the training state saved with each checkpoint, so ``--resume`` reproduces it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from moestab.metrics import keys
from moestab.tasks import Example

MAX_REDRAWS = 8
"""Rounds of replacement draws before a step keeps some solved prompts (counted in ``sampling/history_kept_solved``)."""


@dataclass
class SolvedPrompts:
    """Prompts whose last group was all correct."""

    prompts: set[str] = field(default_factory=set)

    def record(self, examples: list[Example], correct: torch.Tensor, group_size: int) -> None:
        """Update with a step's groups: ``correct`` ``[len(examples) * group_size]`` bool, groups contiguous."""
        all_right = correct.view(len(examples), group_size).all(dim=1).tolist()  # [groups]
        for ex, solved in zip(examples, all_right, strict=True):
            (self.prompts.add if solved else self.prompts.discard)(ex.prompt)

    @keys.computes(keys.HISTORY_SKIPPED, keys.HISTORY_KEPT_SOLVED)
    def replace_solved(
        self, examples: list[Example], draw: Callable[[int], list[Example]]
    ) -> tuple[list[Example], dict[str, float]]:
        """``examples`` with solved prompts replaced by unsolved ones from ``draw(round)`` (deterministic per
        round); returns them and the counts ``sampling/history_skipped`` and ``sampling/history_kept_solved``."""
        kept = [ex for ex in examples if ex.prompt not in self.prompts]
        skipped = len(examples) - len(kept)
        seen = {ex.prompt for ex in kept}
        for attempt in range(MAX_REDRAWS):
            if len(kept) == len(examples):
                break
            for ex in draw(attempt):
                if ex.prompt not in self.prompts and ex.prompt not in seen and len(kept) < len(examples):
                    kept.append(ex)
                    seen.add(ex.prompt)
        short = len(examples) - len(kept)
        kept += [ex for ex in examples if ex.prompt in self.prompts][:short]  # the draws ran dry: keep some
        return kept, {keys.HISTORY_SKIPPED: float(skipped), keys.HISTORY_KEPT_SOLVED: float(short)}

    def state(self) -> dict:
        return {"srpo_solved": sorted(self.prompts)}

    @classmethod
    def from_state(cls, state: dict) -> SolvedPrompts:
        return cls(set(state.get("srpo_solved", [])))
