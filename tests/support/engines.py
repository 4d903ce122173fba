"""Rollout engines that route differently from the trainer, as a production inference engine can."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from moestab.routing import find_routers
from moestab.train.rollout import HFRolloutEngine


@contextmanager
def swapped_kth_expert(model, fraction: float, seed: int):
    """In a random ``fraction`` of (token, layer) decisions, route to the (k+1)-th best expert instead of
    the k-th, with the family's own gates: the model really computes with these routes (so the rollout
    log-probs reflect them), and a ``RoutingRecorder`` entered later records them."""
    generator = torch.Generator().manual_seed(seed)
    handles = []
    for site in find_routers(model):

        def hook(module, args, output, site=site):
            logits, gates, chosen = output[0], output[1], output[2]  # [N, E], [N, k], [N, k]
            k = chosen.shape[-1]
            scores = site.adapter.selection_scores(module, logits)  # [N, E]
            best = scores.topk(k + 1, dim=-1).indices  # [N, k + 1]
            swapped = torch.cat([best[:, : k - 1], best[:, k:]], dim=-1)  # drop the k-th, take the (k+1)-th
            pick = torch.rand(chosen.shape[0], generator=generator) < fraction  # [N]
            new = torch.where(pick[:, None], swapped, chosen)
            return logits, torch.where(pick[:, None], site.adapter.gates(module, logits, new), gates), new

        handles.append(site.module.register_forward_hook(hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class DisagreeingRoutesEngine(HFRolloutEngine):
    """HF generate whose routers pick the (k+1)-th expert instead of the k-th in ``fraction`` of decisions."""

    fraction = 0.1

    def generate(self, prompts, **kwargs):
        with swapped_kth_expert(self.model, self.fraction, seed=len(prompts)):
            return super().generate(prompts, **kwargs)
