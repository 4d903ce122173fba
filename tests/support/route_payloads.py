"""Known routes and a verl batch holding them, for the route importers' tests (tests/integrations): the running
example of tests/routes_in/test_importers.py, 2 sequences, 2 MoE layers, top-2 of 4 experts."""

from __future__ import annotations

import numpy as np
import torch

PROMPTS, RESPONSES, LAYERS, TOP_K, EXPERTS = (3, 2), (2, 3), 2, 2, 4


def known_rows(seed: int = 0) -> list[np.ndarray]:
    """Each sequence's routes at its own input positions ``[p + r - 1, layers, top_k]``: distinct experts per
    decision (a random permutation's first top_k)."""
    gen = np.random.default_rng(seed)
    return [np.stack([[gen.permutation(EXPERTS)[:TOP_K] for _ in range(LAYERS)] for _ in range(p + r - 1)])
            for p, r in zip(PROMPTS, RESPONSES, strict=True)]


# ---- verl -------------------------------------------------------------------------------------------------------
def verl_batch(rows, *, uint8_bytes: bool = False) -> dict[str, torch.Tensor]:
    """verl's DataProto tensors: ``routed_experts`` ``[batch, P + R, layers, top_k]`` with prompts left-padded and
    zero padding (the agent loop's layout), ``responses``, ``attention_mask``, ``response_mask``, log-probs."""
    P, R = max(PROMPTS), max(RESPONSES)
    routed = torch.zeros(len(rows), P + R, LAYERS, TOP_K, dtype=torch.int16)
    attention = torch.zeros(len(rows), P + R, dtype=torch.long)
    response_mask = torch.zeros(len(rows), R, dtype=torch.long)
    for i, (seq, p, r) in enumerate(zip(rows, PROMPTS, RESPONSES, strict=True)):
        routed[i, P - p : P - p + seq.shape[0]] = torch.from_numpy(seq.astype(np.int16))
        attention[i, P - p : P + r] = 1
        response_mask[i, :r] = 1
    if uint8_bytes:
        routed = routed.view(torch.uint8)  # verl 0.9's transport view: [..., 2 * top_k]
    gen = torch.Generator().manual_seed(0)
    return {"routed_experts": routed, "responses": torch.zeros(len(rows), R, dtype=torch.long),
            "attention_mask": attention, "response_mask": response_mask,
            "rollout_log_probs": -torch.rand(len(rows), R, generator=gen),
            "old_log_probs": -torch.rand(len(rows), R, generator=gen)}

