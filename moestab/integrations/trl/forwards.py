"""The TRL integration's way of running the policy for the step's measurements (:mod:`moestab.recording.measurements`).

:class:`TrlForwards` is the :class:`~moestab.recording.measurements.StepForwards` of one generation cycle: it re-runs
TRL's own scoring calls (their kwargs, under TRL's autocast, through TRL's fused LM head), so a measurement scores
exactly as TRL's trainer side does, and lays the result out in generation order (:mod:`.cycle`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from moestab.integrations.trl.capture import ForwardCapture, ScoringCall
from moestab.integrations.trl.cycle import (
    CycleRecord,
    pi_old_calls,
    pi_old_routes,
    scatter_rows,
    scored_policy,
)
from moestab.integrations.trl.settings import CycleLayout
from moestab.recording.measurements import Scored, rng_devices
from moestab.routing import RecordingError, RoutingRecorder, RoutingReplay


@dataclass(frozen=True)
class MicroStep:
    """The loss forward of the micro-step being measured, and the random state it started from."""

    call: ScoringCall
    rng: tuple[torch.Tensor, list[torch.Tensor]] | None  # CPU state, each CUDA device's; None: no measurement
    # runs around the updates, so none was kept


class TrlForwards:
    """The measurements' forwards of one cycle. ``plain`` and ``stats`` record ``trainer.model``'s routes, the latter
    with the routers' statistics. :attr:`micro_step` is set by the trainer before each micro-step's
    ``before_update``."""

    def __init__(self, trainer: Any, cycle: CycleRecord, layout: CycleLayout, temperature: float, *,
                 plain: RoutingRecorder, stats: RoutingRecorder) -> None:
        self.trainer, self.cycle, self.layout, self.temperature = trainer, cycle, layout, temperature
        self.plain, self.stats = plain, stats
        self.micro_step: MicroStep | None = None
        self.old_rows: list[torch.Tensor] | None = None
        """Generation rows of each pi_old call (:func:`pi_old_calls`), once known."""

    def free(self, measured: torch.Tensor | None, *, entropy: bool = False, router_stats: bool = False,
             router_logprobs: bool = False) -> Scored:
        """pi_old's scoring calls again on the current weights, routing freely: those holding ``measured`` rows
        (each call's rows measured all or none: the budget draws calls), in order."""
        if router_logprobs:
            raise RecordingError("TRL's forwards record no router log-probs")
        calls, rows = pi_old_calls(self.cycle, self.layout), self.old_rows
        if rows is None:
            raise RecordingError("a measurement ran the policy over the batch before pi_old's rows were known")
        picked = [i for i, r in enumerate(rows) if measured is None or bool(measured[r].any())]
        if measured is not None and any(not bool(measured[rows[i]].all()) for i in picked):
            raise RecordingError("the measured rows split a pi_old call: TRL's budget measures whole calls")
        model = self.trainer.model
        with torch.no_grad(), self.trainer.accelerator.autocast(), ForwardCapture(
            model, self.stats if router_stats else self.plain, temperature=self.temperature
        ) as capture:
            for i in picked:
                model(**calls[i].kwargs)
        n, prompt_len = self.cycle.generation.prompt_ids.shape
        picked_rows = [rows[i] for i in picked]
        p = scored_policy(capture.captured().scoring, picked_rows, n, prompt_len, partial=len(picked) < len(calls))
        # TRL feeds attention_mask = prompt_mask + completion_mask: the completion's part is the response mask
        masks = [calls[i].kwargs["attention_mask"][:, prompt_len:].bool() for i in picked]  # [b, C] each
        return Scored(logp=p.logp, routes=p.routes, entropy=p.entropy if entropy else None,
                      mask=scatter_rows(masks, picked_rows, n, False))

    def other_routing(self, rows: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
        """TRL's loss forward of the current micro-step again, on the same weights (its backward has run, its
        optimizer step has not), with pi_old's routes replayed; on the CPU. Without TRL's pi_old forward, pi_old is
        the loss forward itself: replaying its routes is that forward, so its own log-probs.

        No grad, outside the capture (no hook records it), under TRL's autocast, with the random generators set to
        the state the loss forward started from and restored afterwards: TRL's weights, gradients and random draws
        are those of a run without it."""
        step = self.micro_step
        if step is None or step.rng is None:
            raise RecordingError("a measurement asked for the update's forward outside a recorded micro-step")
        prompt_len = self.cycle.generation.prompt_ids.shape[1]
        if self.layout.old_forward:
            model = self.trainer.model
            routes = pi_old_routes(self.cycle, self.layout, rows, step.call.input_ids.shape[1])  # [b, L, layers, k]
            cpu_state, cuda_states = step.rng
            devices = rng_devices(model)
            with torch.no_grad(), torch.random.fork_rng(devices=devices), self.trainer.accelerator.autocast(), \
                    RoutingReplay(model, routes, verify=False):
                torch.set_rng_state(cpu_state)
                for device, state in zip(devices, cuda_states, strict=True):
                    torch.cuda.set_rng_state(state, device)
                log_probs = getattr(model(**step.call.kwargs), "log_probs", None)
            if log_probs is None:
                raise RecordingError("TRL's fused_lm_head forward returned no log_probs")
        else:
            log_probs = step.call.log_probs
        logp = log_probs.detach()[:, prompt_len - 1 :].float().cpu()  # [b, C]
        out = torch.full_like(logp, float("nan"))  # [b, C]
        out[scored] = logp[scored]
        return out
