"""verl (0.9; checked against the installed package: ``verl/experimental/agent_loop/agent_loop.py`` and
``verl/utils/megatron/router_replay_utils.py``): the DataProto key ``routed_experts``, ``[batch, prompt_len +
response_len, layers, top_k]`` over the whole padded sequence: prompts left-padded to the batch's prompt width,
responses right-padded, and zero wherever nothing was routed (padding, the last token, positions a multi-turn loop did
not record). R3 fills it from the rollout engine (int16); R2 records the actor's own routes into the same key, which
older verl stored as uint8 expert ids (wrapping above 255) and verl 0.9 moves as the uint8 bytes of int16 ids
(``[..., 2 * top_k]``: pass ``top_k`` to read them back).

Padding is read from ``attention_mask`` and, since top-k experts are distinct, any decision whose slots are all
expert 0 is zero fill, not a route (for ``top_k = 1`` only the masks tell them apart).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from moestab.integrations.routes_in.common import (
    ImportedRoutes,
    PayloadError,
    as_ids,
    as_mask,
    checked_ids,
    pick_layers,
    unrecorded_zero_rows,
)
from moestab.routing.routes import Routes


def tensors_of(batch: Any) -> Mapping[str, Any]:
    """The tensors of a verl ``DataProto`` (its ``.batch`` TensorDict) or of a plain mapping."""
    inner = getattr(batch, "batch", None)
    if inner is not None:
        return inner
    if isinstance(batch, Mapping):
        return batch
    raise PayloadError(f"batch must be a verl DataProto or a mapping of tensors, got {type(batch).__name__}")


def has(tensors: Mapping[str, Any], key: str) -> bool:
    """Whether ``tensors`` holds ``key`` (a TensorDict refuses ``in``; its ``keys()`` answers)."""
    return key in set(tensors.keys())


def tensor(tensors: Mapping[str, Any], key: str) -> Any:
    if not has(tensors, key):
        raise PayloadError(f"the batch has no {key!r} (keys: {sorted(tensors.keys())})")
    return tensors[key]


def byte_view(arr: np.ndarray, top_k: int | None, field: str) -> np.ndarray:
    """uint8 ``[..., 2 * top_k]``: the bytes of int16 ids (verl's transport view) -> int16 ``[..., top_k]``."""
    if arr.dtype == np.uint8 and top_k is not None and arr.shape[-1] == 2 * top_k:
        return np.ascontiguousarray(arr).view(np.int16)
    if top_k is not None and arr.shape[-1] != top_k:
        raise PayloadError(f"{field} has {arr.shape[-1]} slots per layer, expected top_k={top_k} (or 2 * top_k bytes "
                           "of int16 ids)")
    return arr


def from_verl(
    batch: Any,
    *,
    num_experts: int,
    key: str = "routed_experts",
    top_k: int | None = None,
    moe_layers: Sequence[int] | None = None,
    physical_to_logical: Any | None = None,
) -> ImportedRoutes:
    """The routes under ``key`` of a verl batch on moestab's layout.

    Reads ``batch[key]`` ``[batch, prompt_len + response_len, layers, top_k]``, ``responses`` ``[batch,
    response_len]`` (its width is the response width), ``attention_mask`` ``[batch, prompt_len + response_len]`` and
    ``response_mask`` ``[batch, response_len]`` (default: the attention mask's response part): the trained tokens.
    """
    tensors = tensors_of(batch)
    field = f"batch[{key!r}]"
    raw = byte_view(as_ids(tensor(tensors, key), field), top_k, field)
    if raw.ndim != 4:
        raise PayloadError(f"{field} must be [batch, prompt_len + response_len, layers, top_k], got {list(raw.shape)}")
    size, length = raw.shape[:2]
    width_r = int(tensor(tensors, "responses").shape[1])
    attention = as_mask(tensor(tensors, "attention_mask"), "batch['attention_mask']", (size, length))
    if not 1 <= width_r < length:
        raise PayloadError(f"batch['responses'] is {width_r} wide but {field} covers {length} positions: no prompt")
    mask = tensors["response_mask"] if has(tensors, "response_mask") else attention[:, length - width_r :]
    response = as_mask(mask, "batch['response_mask']", (size, width_r))
    picked, layers = pick_layers(raw, moe_layers, field)
    ids = checked_ids(picked, field, num_experts, physical_to_logical)[:, :-1].copy()  # [B, P + R - 1, layers, k]
    ids[~attention[:, :-1]] = -1  # padding positions
    ids[unrecorded_zero_rows(ids)] = -1  # zero fill inside the sequence
    scoring = np.zeros((size, length - 1), bool)  # [B, P + R - 1]
    scoring[:, length - 1 - width_r :] = response  # response token t is scored at position P - 1 + t
    routes = Routes(indices=torch.from_numpy(ids), layers=layers, num_experts=num_experts)
    return ImportedRoutes(routes=routes, scoring=torch.from_numpy(scoring), source="verl", response_width=width_r)
