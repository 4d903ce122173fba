"""The measurement budget: how much of a run the forwards that exist only to measure may cost.

Three forwards of an RL step serve moestab alone, never the loss: pi_new after the updates (old->new volatility),
the free pi_old forward under R3 / TRR (whose ratio uses the rollout engine's routes), and the counterfactual
forward of routing's share. At production scale each costs a large share of a step. A :class:`MeasureBudget` runs
them on a seeded sample of whole groups (``fraction``) and/or on every ``every``-th step only; the metrics they feed
are then estimates, logged with their sampling error (:mod:`moestab.metrics.sampling`).

Whole groups, not single sequences: a group's sequences share a prompt, so sampling them together keeps the
estimate's error a between-prompt error that :func:`moestab.metrics.sampling.ratio_se` can compute from the sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from moestab.metrics.sampling import sample_groups

if TYPE_CHECKING:
    import torch

RULE = ("groups = sorted(torch.randperm(n_groups, generator=torch.Generator().manual_seed(seed))"
        "[:max(1, ceil(fraction * n_groups))]) on steps s with (s - 1) % every == 0")
"""The sampling rule, as recorded in run.json (``measure_rule``)."""


DEFAULT_EVERY = 4
"""``moestab train``'s default ``measure_every`` (with ``measure_fraction`` 1): every sequence of steps 1, 5, 9, ...

Chosen from measurements (docs/benchmarks.md, "Measurement budget"; ``scripts/choose_budget.py`` and
``bench/bench_train.py --measure-every N``). A fraction below 1 fails the rule that the sampling error of old->new
router flips stay below a tenth of their step-to-step spread (at 0.5 it is 1.15 times the spread), so the default
samples steps, not groups: a measured step is measured in full (sampling error 0). N is the smallest power of two
whose benchmark meets issue 28's targets on the default job (step <= 1.0x TRL's GRPOTrainer, R3 and TRR <= 1.05x
replay off): every 2nd step left R3 at 1.06x. The run mean of a metric then rests on one step in 4.
"""


@dataclass(frozen=True)
class MeasureBudget:
    """Share of each step's groups, and of the steps, that the measure-only forwards run on."""

    fraction: float = 1.0
    """Share of each measured step's groups (whole groups, at least one) scored by the measure-only forwards;
    1.0 measures every sequence."""
    every: int = 1
    """Measure on steps 1, 1 + every, 1 + 2 * every, ...; the other steps run no measure-only forward."""

    def __post_init__(self) -> None:
        if not (isinstance(self.fraction, int | float) and 0.0 < self.fraction <= 1.0):
            raise ValueError(f"measure fraction must be in (0, 1], got {self.fraction!r}")
        if not (isinstance(self.every, int) and self.every >= 1):
            raise ValueError(f"measure every must be an integer >= 1, got {self.every!r}")

    @property
    def full(self) -> bool:
        """Every sequence of every step is measured (the metrics are exact, not estimates)."""
        return self.fraction >= 1.0 and self.every == 1

    def measures_step(self, step: int) -> bool:
        """Whether the 1-based ``step`` runs the measure-only forwards."""
        return (step - 1) % self.every == 0

    def groups(self, n_groups: int, seed: int) -> torch.Tensor:
        """``[m]`` sorted indices of the groups measured out of ``n_groups`` (all of them at ``fraction`` 1)."""
        return sample_groups(n_groups, self.fraction, seed)

    def rows(self, step: int, batch_size: int, group_size: int, seed: int) -> torch.Tensor:
        """``[batch_size]`` bool: the sequences of ``step`` that the measure-only forwards score. Rows are grouped as
        the trainer lays them out (group ``g`` = rows ``g * group_size`` .. ``(g + 1) * group_size - 1``)."""
        if batch_size % group_size:
            raise ValueError(f"batch of {batch_size} sequences is not whole groups of {group_size}")
        import torch  # here, not at the top: TrainConfig holds a budget, and `moestab train --help` loads no torch

        measured = torch.zeros(batch_size // group_size, dtype=torch.bool)  # [groups]
        if self.measures_step(step):
            measured[self.groups(batch_size // group_size, seed)] = True
        return measured.repeat_interleave(group_size)  # [B]

    def record(self) -> dict[str, object]:
        """run.json's description of this budget."""
        return {"measure_fraction": self.fraction, "measure_every": self.every, "measure_rule": RULE}
