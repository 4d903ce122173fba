"""``moestab train``'s way of running its policy for the step's measurements (:mod:`moestab.recording.measurements`).

:class:`TrainForwards` is the :class:`~moestab.recording.measurements.StepForwards` of one step: moestab's own forwards
(:mod:`moestab.train.forward`) of the step's ``RolloutBatch``, in the minibatches' chunks.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from moestab.recording.batch import RolloutBatch
from moestab.recording.measurements import Scored, rng_devices
from moestab.routing import Routes
from moestab.run_folder import schema
from moestab.train.forward import chunked_policy_forward, measured_forward, policy_forward
from moestab.train.step_settings import StepSettings


class TrainForwards:
    """The step's forwards for its measurements: ``model`` on ``batch`` in ``chunks`` at the step's temperature.
    ``old_free_routes`` ``[B, L, layers, k]``: pi_old's free routes, once known (None under R3 / TRR, where they are a
    measurement's and routing's share replays none)."""

    def __init__(self, model: PreTrainedModel, batch: RolloutBatch, chunks: list[torch.Tensor], s: StepSettings,
                 old_free_routes: Routes | None = None) -> None:
        self.model, self.batch, self.chunks, self.settings = model, batch, chunks, s
        self.old_free_routes = old_free_routes

    @torch.no_grad()
    def free(self, measured: torch.Tensor | None, *, entropy: bool = False, router_stats: bool = False,
             router_logprobs: bool = False) -> Scored:
        """Free routing over the ``measured`` rows (None: every row); also the ratio's own pi_old forward
        (:func:`moestab.train.step_update.old_policy`), so both are one function."""
        kwargs = dict(temperature=self.settings.temperature, entropy=entropy, router_stats=router_stats,
                      router_logprobs=router_logprobs)
        f = (chunked_policy_forward(self.model, self.batch, self.chunks, **kwargs) if measured is None
             else measured_forward(self.model, self.batch, self.chunks, measured, **kwargs))  # logp [B, T]
        mask = self.batch.response_mask  # [B, T]
        if measured is not None:
            mask = mask & measured.to(mask.device)[:, None]  # the budget's rows are drawn on the host
        return Scored(logp=f.logp, routes=f.routes, entropy=f.entropy, mask=mask)

    def other_routing(self, rows: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
        """No grad, no recording, the random generators restored: the update forward that follows draws what it
        would have drawn without this one (dropout, router jitter)."""
        model, s = self.model, self.settings
        update_is_free = schema.REPLAY_ROUTES[s.replay] is None
        replay = self.old_free_routes.select(rows) if update_is_free else None  # [b, L, layers, k] the other routing
        mb = self.batch.select(rows)
        logp = torch.full(mb.response_mask.shape, float("nan"), device=mb.response_mask.device,
                          dtype=next(model.parameters()).dtype)  # [b, T]
        if len(scored):
            with torch.no_grad(), torch.random.fork_rng(devices=rng_devices(model)):
                out = policy_forward(model, mb.select(scored), temperature=s.temperature,
                                     replay=None if replay is None else replay.select(scored), record=False)
            logp[scored] = out.logp.to(logp.device, logp.dtype)  # [b', T] the scored rows
        return logp
