"""slime (``--use-rollout-routing-replay``; read from its source, THUDM/slime commit ``624b824a``:
``slime/utils/types.py``, ``slime/ray/rollout.py``, ``slime/observability/rollout_data_utils.py``).

Each ``Sample`` keeps ``tokens`` (prompt then response), ``response_length``, ``loss_mask`` (one 0/1 per response
token, None for all trained) and ``rollout_routed_experts``: SGLang's int32 routes reshaped to ``[len(tokens) - 1,
num_layers, moe_router_topk]``, one row per token from the first prompt token through the penultimate one (slime
PR #2185 stitches incremental ``routed_experts_start_len`` returns into that whole array), with one row per decoder
layer (dense layers' rows zero: name the MoE rows with ``moe_layers``). The rollout hands the trainer the same as
``train_data`` lists: ``tokens``, ``response_lengths``, ``loss_masks``, ``rollout_routed_experts``. Both are read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from moestab.routes_in.common import (
    ImportedRoutes,
    PayloadError,
    SequenceRows,
    as_ids,
    as_mask,
    field_of,
    lay_out,
)


def sample_rows(tokens: Any, response: int, loss_mask: Any, routes: Any, where: str) -> SequenceRows:
    """One sample's rows; ``where`` names it (``samples[i]`` or ``train_data[...][i]``) in errors."""
    total = len(tokens)
    if not 1 <= response < total:
        raise PayloadError(f"{where}: response_length {response} must leave a prompt in its {total} tokens")
    field = f"{where}.rollout_routed_experts"
    trained = None if loss_mask is None else as_mask(loss_mask, f"{where}.loss_mask", (response,))
    return SequenceRows(as_ids(routes, field), total - response, response, field, trained=trained)


def from_slime(
    samples: Sequence[Any] | Mapping[str, Any],
    *,
    num_experts: int,
    moe_layers: Sequence[int] | None = None,
    physical_to_logical: Any | None = None,
) -> ImportedRoutes:
    """slime's routes on moestab's layout: a list of ``Sample`` objects (or dicts with their fields), or the
    ``train_data`` dict of lists the rollout sends the trainer."""
    if isinstance(samples, Mapping):
        columns = [field_of(samples, name, f"train_data[{name!r}]")
                   for name in ("tokens", "response_lengths", "rollout_routed_experts")]
        masks = field_of(samples, "loss_masks", "", None)
        if len({len(c) for c in columns} | ({len(masks)} if masks is not None else set())) != 1:
            raise PayloadError("train_data's tokens, response_lengths, rollout_routed_experts (and loss_masks) must "
                               f"list one entry per sample, got {[len(c) for c in columns]} and "
                               f"{None if masks is None else len(masks)}")
        sequences = [sample_rows(tokens, int(r), None if masks is None else masks[i], routes, f"train_data[{i}]")
                     for i, (tokens, r, routes) in enumerate(zip(*columns, strict=True))]
    else:
        sequences = [sample_rows(field_of(s, "tokens", f"samples[{i}].tokens"),
                                 int(field_of(s, "response_length", f"samples[{i}].response_length")),
                                 field_of(s, "loss_mask", "", None),
                                 field_of(s, "rollout_routed_experts", f"samples[{i}].rollout_routed_experts"),
                                 f"samples[{i}]")
                     for i, s in enumerate(samples)]
    return lay_out(sequences, num_experts=num_experts, source="slime", moe_layers=moe_layers,
                   physical_to_logical=physical_to_logical)
