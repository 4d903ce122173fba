"""Why a TRL step's old->new volatility reads exactly 0, when the reason is the policy, not its routing.

``routing/old_new/changed`` is 0 both when routing is stable and when the updates did nothing: TRL's default
``learning_rate`` (1e-6) on a small model moves no route, ``learning_rate=0`` or a warmup's first step moves no
weight, and bf16 weights round away an update below their precision. The number alone cannot tell these apart, so the
trainer says which it is, once a run (:class:`~moestab.integrations.trl.trainer.TrlRecords`): pi_new's log-probs
equal to pi_old's bit for bit mean no weight that scores the batch changed; log-probs that moved with no route
changed mean updates too small to change a top-k choice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moestab.recording.step_tensors import StepTensors

UNCHANGED = "unchanged"
"""Kind of :class:`Stillness`: pi_new scores every measured token exactly as pi_old did."""
NO_ROUTE_CHANGED = "no route changed"
"""Kind of :class:`Stillness`: the log-probs moved, no route did."""


@dataclass(frozen=True)
class Stillness:
    """Why a step's old->new change is 0: its ``kind`` and the largest ``|logp_new - logp_old|`` it saw."""

    kind: str
    max_logp_change: float

    def message(self, step: int, learning_rate: float) -> str:
        """The warning, naming the likely cause."""
        if self.kind == UNCHANGED:
            return (f"step {step}: the policy did not change: pi_new's log-probs equal pi_old's bit for bit and no "
                    "route moved, so routing/old_new/* are 0 because nothing was updated, not because routing is "
                    f"stable. Likely no optimizer step changed the weights: learning_rate={learning_rate:g} is 0 or "
                    "too small for the weights' precision (bf16 rounds away an update below 0.2-0.4% of a weight), a "
                    "warmup starts at 0, or the parameters are frozen")
        return (f"step {step}: no route changed between pi_old and pi_new although the log-probs moved (by at most "
                f"{self.max_logp_change:.2g}): the step's updates were too small to change any top-k choice "
                f"(learning_rate={learning_rate:g}; TRL's default is 1e-6), so routing/old_new/* are 0 for that "
                "reason")


def stillness(t: StepTensors, changed: float) -> Stillness | None:
    """Why old->new ``changed`` (the step's ``routing/old_new/changed``) is 0; ``None`` when it is not 0 or no token
    was measured. Compares the log-probs of pi_new and pi_old (free routing, as pi_new routes) on the response tokens
    of the sequences pi_new scored."""
    if changed != 0.0:
        return None
    mask = _measured_tokens(t)  # [B, T]
    if not bool(mask.any()):
        return None
    largest = float((t.logp_new - t.logp_old_free)[mask].abs().max())
    return Stillness(UNCHANGED if largest == 0.0 else NO_ROUTE_CHANGED, largest)


def _measured_tokens(t: StepTensors) -> torch.Tensor:
    """``[B, T]`` bool: the response tokens of the sequences pi_new scored."""
    mask = t.batch.response_mask  # [B, T]
    return mask if t.measured is None else mask & t.measured[:, None].to(mask.device)
