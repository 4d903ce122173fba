"""Known routes and a verl batch holding them, for the route importers' tests (tests/integrations): the running
example of tests/routes_in/test_importers.py, 2 sequences, 2 MoE layers, top-2 of 4 experts."""

from __future__ import annotations

import numpy as np
import torch

from moestab.experiments.integrity_faults import verl_payload

PROMPTS, RESPONSES, LAYERS, TOP_K, EXPERTS = (3, 2), (2, 3), 2, 2, 4


def known_rows(seed: int = 0) -> list[np.ndarray]:
    """Each sequence's routes at its own input positions ``[p + r - 1, layers, top_k]``: distinct experts per
    decision (a random permutation's first top_k)."""
    gen = np.random.default_rng(seed)
    return [np.stack([[gen.permutation(EXPERTS)[:TOP_K] for _ in range(LAYERS)] for _ in range(p + r - 1)])
            for p, r in zip(PROMPTS, RESPONSES, strict=True)]


# ---- verl -------------------------------------------------------------------------------------------------------
def verl_batch(rows, *, uint8_bytes: bool = False) -> dict[str, torch.Tensor]:
    """verl's DataProto tensors (``moestab.experiments.integrity_faults.verl_payload``: ``routed_experts`` ``[batch,
    P + R, layers, top_k]``, prompts left-padded, zero padding, the agent loop's layout) with log-probs."""
    batch = verl_payload(rows, PROMPTS, RESPONSES)
    if uint8_bytes:
        batch["routed_experts"] = batch["routed_experts"].view(torch.uint8)  # verl 0.9's transport view
    gen = torch.Generator().manual_seed(0)
    batch["rollout_log_probs"] = -torch.rand(len(rows), max(RESPONSES), generator=gen)
    batch["old_log_probs"] = -torch.rand(len(rows), max(RESPONSES), generator=gen)
    return batch
