"""A tiny step's record built by hand, every field filled: for the token-table layouts and the step-record tests."""

from __future__ import annotations

import torch

from moestab.recording.batch import RolloutBatch
from moestab.recording.step_tensors import StepTensors
from moestab.routing import Routes
from moestab.tasks import Example

B, P, T = 4, 2, 3  # sequences (2 prompts x 2), prompt columns, response positions
LAYERS = (1, 3, 5)  # decoder layers of the routes' layer axis
SLOTS = [0, 2]  # recorded: decoder layers 1 and 5
K = 2
ROWS = torch.tensor([0, 1, 3])  # recorded sequences (sequence 2 is not)
RESPONSE = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)  # [B, T]


def _routes(gen: torch.Generator, experts: int) -> torch.Tensor:
    """``[B, L, layers, K]`` int16 routes, distinct experts per decision."""
    n = B * (P + T - 1) * len(LAYERS)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:K] for _ in range(n)])  # [n, K]
    return ids.reshape(B, P + T - 1, len(LAYERS), K).to(torch.int16)


def _changed(gen: torch.Generator, routes: torch.Tensor, experts: int, share: float) -> torch.Tensor:
    """``routes`` with about ``share`` of the decisions drawn again (so pairs differ, but not everywhere)."""
    other = _routes(gen, experts)  # [B, L, layers, K]
    redraw = torch.rand(routes.shape[:3], generator=gen) < share  # [B, L, layers]
    return torch.where(redraw[..., None], other, routes)


def step_tensors(experts: int, seed: int) -> StepTensors:
    """A tiny step by hand: 2 prompts x 2 sequences, 3 response positions, 3 MoE layers, top-2 of ``experts``."""
    gen = torch.Generator().manual_seed(seed)
    old_free = _routes(gen, experts)
    rollout = _changed(gen, old_free, experts, 0.3)
    rollout[0, P - 1, 2] = -1  # the rollout engine did not record one decision (first token, last layer)
    new = _changed(gen, old_free, experts, 0.4)
    new[3] = -1  # pi_new did not re-run sequence 3 (TRL's record_new_fraction < 1)

    def floats(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=gen)

    batch = RolloutBatch(
        input_ids=torch.zeros(B, P + T - 1, dtype=torch.long), attention_mask=torch.ones(B, P + T - 1),
        targets=torch.zeros(B, T, dtype=torch.long), response_mask=RESPONSE, logp_rollout=-floats(B, T),
        routes=Routes(indices=rollout, layers=LAYERS, num_experts=experts), prompt_len=P, completions=["x"] * B)
    return StepTensors(
        batch=batch, examples=[Example("1+1=", "2"), Example("2+2=", "4")], rewards=floats(B), correct=None,
        advantages=floats(B) - 0.5, minibatch=torch.tensor([0, 0, 1, 1]), logp_old=-floats(B, T),
        logp_old_free=-floats(B, T), logp_update=-floats(B, T), logp_new=-floats(B, T), clipped=floats(B, T) < 0.3,
        routes_old=old_free, routes_old_free=Routes(indices=old_free, layers=LAYERS, num_experts=experts,
                                                    margin=floats(B, P + T - 1, len(LAYERS)),
                                                    confidence=floats(B, P + T - 1, len(LAYERS))),
        routes_update=_changed(gen, old_free, experts, 0.3),
        routes_new=Routes(indices=new, layers=LAYERS, num_experts=experts))
