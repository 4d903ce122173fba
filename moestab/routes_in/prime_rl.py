"""prime-rl (checked against its source, ``src/prime_rl/inference/vllm/routed_experts.py``, ``orchestrator/
trajectories.py`` and ``trainer/batch.py``): the inference server sends vLLM's routes as ``{"data": base64, "shape":
[tokens, layers, top_k], "start": s, "dtype": "uint8"}`` (``"uint16"`` above 256 experts); the orchestrator aligns
each sample's array to its tokens (zero tail: the last token has no route) and the trainer packs samples along the
token axis into a micro-batch (``routed_experts`` with ``data`` bytes, ``shape``, ``dtype``; ``sequence_lengths``;
per-token ``loss_mask``), zero-padding its end.

Sample ``i`` occupies ``sequence_lengths[i]`` consecutive tokens; token ``j`` is trained when ``loss_mask[j]`` and is
scored at position ``j - 1`` of its sample. Decisions whose slots are all expert 0 are zero fill (top-k experts are
distinct), not routes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from moestab.routes_in.common import (
    ImportedRoutes,
    PayloadError,
    as_mask,
    checked_ids,
    field_of,
    pick_layers,
    unrecorded_zero_rows,
)
from moestab.routes_in.wire import encoded_array


def from_prime_rl(
    micro_batch: Any,
    *,
    num_experts: int,
    moe_layers: Sequence[int] | None = None,
    physical_to_logical: Any | None = None,
) -> ImportedRoutes:
    """The routes of a prime-rl micro-batch (object or dict with ``routed_experts``, ``sequence_lengths`` and
    ``loss_mask``) on a ``[samples, longest sample, layers, top_k]`` layout (each sample from position 0)."""
    field = "micro_batch.routed_experts"
    raw, _ = encoded_array(field_of(micro_batch, "routed_experts", field), field)
    if raw.ndim != 3:
        raise PayloadError(f"{field} must be [tokens, layers, top_k], got shape {list(raw.shape)}")
    lengths = [int(n) for n in field_of(micro_batch, "sequence_lengths", "micro_batch.sequence_lengths")]
    total = raw.shape[0]
    if sum(lengths) != total or min(lengths, default=0) < 1:
        raise PayloadError(f"micro_batch.sequence_lengths {lengths} (sum {sum(lengths)}) must be positive and add up "
                           f"to the {total} token rows of {field} {list(raw.shape)}")
    trained = as_mask(field_of(micro_batch, "loss_mask", "micro_batch.loss_mask"), "micro_batch.loss_mask", (total,))
    picked, layers = pick_layers(raw, moe_layers, field)
    ids = checked_ids(picked, field, num_experts, physical_to_logical).copy()  # [tokens, layers, k]
    ids[unrecorded_zero_rows(ids)] = -1
    width = max(lengths)
    out = np.full((len(lengths), width, *ids.shape[1:]), -1, np.int16)  # [samples, width, layers, k]
    scoring = np.zeros((len(lengths), width), bool)  # [samples, width]
    start = 0
    for i, n in enumerate(lengths):
        out[i, :n] = ids[start : start + n]
        scoring[i, : n - 1] = trained[start + 1 : start + n]  # token j is scored at position j - 1
        if trained[start]:
            raise PayloadError(f"micro_batch.loss_mask trains token 0 of sample {i}, which no position scores")
        start += n
    return ImportedRoutes.of(out, scoring, layers=layers, num_experts=num_experts, source="prime-rl")
