"""tunix and MaxText router replay: one padded ``[batch, prompt_width + completion_width, layers, top_k]`` array,
-1 wherever the trainer must route by itself (tunix's ``UNSET_ROUTED_EXPERT``).

tunix lays each rollout's ``[prompt + completion, layers, top_k]`` routes over its trainer's padded ``[prompt |
completion]`` token stream (``tunix/rl/common.py``: ``align_routed_experts``, tunix PR #2046): prompts left-padded to
``prompt_width``, completions right-padded to ``completion_width``, every other slot -1, and hands it to the model as
``forced_routed_experts``, the argument MaxText's ``RoutedMoE`` replays (MaxText PR #4826, which treats -1 slots as
padding). tunix's sampler contract first documented the per-request array as ``[Batch, Layers, Length, Top K]``
(``tunix/experimental/rollout/sampler.py``, commit ``bab3e0a8``; later ``[Length, Layers, Top K]``): pass
``layers_first=True`` for that order. Read from their source (no JAX here).

Position ``t`` of the stream is token ``t``; completion token ``c`` is scored at position ``prompt_width - 1 + c``
(moestab's layout with ``P = prompt_width``), and ``completion_mask`` (tunix's, ``[batch, completion_width]``: 1 for
model-generated tokens, 0 for environment tokens and padding) says which ones train.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from moestab.routes_in.common import (
    ImportedRoutes,
    PayloadError,
    as_ids,
    as_mask,
    checked_ids,
    pick_layers,
    refuse_partial_sentinels,
)


def from_tunix(
    routed_experts: Any,
    *,
    num_experts: int,
    completion_mask: Any,
    layers_first: bool = False,
    moe_layers: Sequence[int] | None = None,
    physical_to_logical: Any | None = None,
    source: str = "tunix",
) -> ImportedRoutes:
    """The padded stream's routes on moestab's layout (its last column, the last completion token, is never an input).

    Args:
        routed_experts: ``[batch, prompt_width + completion_width, layers, top_k]`` integer ids, -1 where unset
            (``[batch, layers, length, top_k]`` with ``layers_first``).
        num_experts: routed experts per MoE layer.
        completion_mask: ``[batch, completion_width]``, 1 for the completion tokens that train.
        layers_first: the array is ``[batch, layers, length, top_k]``.
        moe_layers: the layer rows that are MoE layers (default: all).
        physical_to_logical: ``[physical]`` or ``[layers, physical]`` map, only for physical ids.
    """
    field = f"{source} routed_experts"
    order = "[batch, layers, length, top_k]" if layers_first else "[batch, length, layers, top_k]"
    raw = as_ids(routed_experts, field)
    if raw.ndim != 4:
        raise PayloadError(f"{field} must be {order}, got shape {list(raw.shape)} ({raw.dtype})")
    stream = raw.swapaxes(1, 2) if layers_first else raw  # [batch, length, layers, top_k]
    size, length = stream.shape[:2]
    shape = tuple(np.shape(completion_mask))
    if len(shape) != 2 or shape[0] != size or not 1 <= shape[1] < length:
        raise PayloadError(f"{source} completion_mask must be [batch, completion_width] = [{size}, C] with 1 <= C < "
                           f"{length} (the {order} array {list(raw.shape)} needs a prompt), got shape {list(shape)}")
    width_c = shape[1]
    picked, layers = pick_layers(stream[:, :-1], moe_layers, field)  # [batch, P + C - 1, layers, top_k]
    refuse_partial_sentinels(picked, field)
    ids = checked_ids(picked, field, num_experts, physical_to_logical)
    scoring = np.zeros((size, length - 1), bool)  # [batch, P + C - 1]
    scoring[:, length - 1 - width_c :] = as_mask(completion_mask, f"{source} completion_mask", shape)
    return ImportedRoutes.of(ids, scoring, layers=layers, num_experts=num_experts, source=source,
                             response_width=width_c)


def from_maxtext(routed_experts: Any, **options: Any) -> ImportedRoutes:
    """MaxText's ``forced_routed_experts`` (the array tunix hands it): :func:`from_tunix`."""
    return from_tunix(routed_experts, source="maxtext", **options)
