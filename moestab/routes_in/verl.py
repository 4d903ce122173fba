"""verl: the DataProto key ``routed_experts``, ``[batch, prompt_len + response_len, layers, top_k]`` over the whole
padded sequence: prompts left-padded to the batch's prompt width, responses right-padded, and zero wherever nothing
was routed (padding, the last token, positions a multi-turn loop did not record).

Checked against verl 0.9.1 (the installed package: ``verl/experimental/agent_loop/agent_loop.py``,
``verl/utils/megatron/router_replay_utils.py``) and verl main after PR #7407 (commit ``bf48903d``, its source). R3
fills the key from the rollout engine; R2 records the actor's own routes into it. Older verl stored R2 as uint8 ids
(wrapping above 255); since PR #7407 both are int16. R2's ids cross ranks as the uint8 bytes of the int16 array
(``view(torch.uint8)``, ``[..., 2 * top_k]``: NCCL has no int16), viewed back before they reach the batch; a payload
caught in that view is read back with ``top_k``. verl's new engines return R2 jagged (a nested tensor, one ``[real
tokens, layers, top_k]`` per sample), placed here on the attention mask's real tokens.

Padding is read from ``attention_mask`` and, since top-k experts are distinct, any decision whose slots are all
expert 0 is zero fill, not a route (for ``top_k = 1`` only the masks tell them apart).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from moestab.routes_in.common import (
    ImportedRoutes,
    PayloadError,
    as_ids,
    as_mask,
    checked_ids,
    pick_layers,
    unrecorded_zero_rows,
)


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
    """uint8 ``[..., 2 * top_k]``: the little-endian bytes of int16 ids (verl's transport view, ``view(torch.uint8)``
    for NCCL, which has no int16) -> int16 ``[..., top_k]``."""
    if arr.dtype == np.uint8 and top_k is None:
        # Old verl's uint8 ids [..., k] and the transport bytes of int16 ids [..., 2k] look alike: the bytes of a
        # top-1 model's ids read as top-2 decisions [id, 0]. Only top_k tells them apart.
        raise PayloadError(f"{field} {list(arr.shape)} is uint8: either expert ids (older verl, top_k = "
                           f"{arr.shape[-1]}) or the bytes of int16 ids (verl's transport view, top_k = "
                           f"{arr.shape[-1] // 2}); pass top_k to say which")
    if arr.dtype == np.uint8 and top_k is not None and arr.shape[-1] == 2 * top_k:
        return np.ascontiguousarray(arr).view("<i2")
    if top_k is not None and arr.shape[-1] != top_k:
        raise PayloadError(f"{field} {list(arr.shape)} ({arr.dtype}) has {arr.shape[-1]} slots per layer, expected "
                           f"top_k={top_k} (or 2 * top_k uint8 bytes of int16 ids)")
    return arr


def jagged(value: Any) -> list[Any] | None:
    """The per-sample tensors of a jagged ``routed_experts`` (a nested tensor, or a list of per-sample arrays)."""
    if torch.is_tensor(value) and value.is_nested:
        return list(value.unbind())
    arrays = isinstance(value, list | tuple) and all(torch.is_tensor(v) or isinstance(v, np.ndarray) for v in value)
    return list(value) if arrays and value else None


def padded_routes(value: Any, attention: Any, top_k: int | None, field: str) -> tuple[np.ndarray, np.ndarray]:
    """verl's routes on its padded layout ``[batch, P + R, layers, top_k]`` and the attention mask ``[batch, P + R]``.

    R3's tensor (and R2's from verl's legacy workers) is padded already. R2 from the new engines comes back jagged
    (``left_right_2_no_padding``): one ``[real tokens, layers, top_k]`` per sample, int16 since verl PR #7407; its rows
    go to the mask's real tokens, zero elsewhere, as verl pads.
    """
    samples = jagged(value)
    if samples is None:
        raw = byte_view(as_ids(value, field), top_k, field)
        if raw.ndim != 4:
            raise PayloadError(f"{field} must be [batch, prompt_len + response_len, layers, top_k], got shape "
                               f"{list(raw.shape)} ({raw.dtype})")
        return raw, as_mask(attention, "batch['attention_mask']", raw.shape[:2])
    mask = as_mask(attention, "batch['attention_mask']", (len(samples), np.shape(attention)[-1]))
    rows = [byte_view(as_ids(v, f"{field}[{i}]"), top_k, f"{field}[{i}]") for i, v in enumerate(samples)]
    for i, seq in enumerate(rows):
        if seq.ndim != 3 or seq.shape[1:] != rows[0].shape[1:] or seq.shape[0] != mask[i].sum():
            raise PayloadError(f"{field}[{i}] has shape {list(seq.shape)} ({seq.dtype}); valid: [{int(mask[i].sum())}"
                               f" real tokens of batch['attention_mask'][{i}], layers, top_k] like sample 0")
    out = np.zeros((*mask.shape, *rows[0].shape[1:]), rows[0].dtype)  # [B, P + R, layers, k]
    for i, seq in enumerate(rows):
        out[i, mask[i]] = seq
    return out, mask


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

    Reads ``batch[key]`` ``[batch, prompt_len + response_len, layers, top_k]`` (or jagged, one ``[real tokens,
    layers, top_k]`` per sample: :func:`padded_routes`), ``responses`` ``[batch, response_len]`` (its width is the
    response width), ``attention_mask`` ``[batch, prompt_len + response_len]`` and ``response_mask`` ``[batch,
    response_len]`` (default: the attention mask's response part): the trained tokens.
    """
    tensors = tensors_of(batch)
    field = f"batch[{key!r}]"
    raw, attention = padded_routes(tensor(tensors, key), tensor(tensors, "attention_mask"), top_k, field)
    size, length = raw.shape[:2]
    responses = tensor(tensors, "responses")
    if len(getattr(responses, "shape", ())) != 2:
        raise PayloadError(f"batch['responses'] must be a [batch, response_len] tensor or array, got "
                           f"{type(responses).__name__}" + (f" of shape {tuple(responses.shape)}"
                                                            if hasattr(responses, "shape") else ""))
    width_r = int(responses.shape[1])
    if not 1 <= width_r < length:
        raise PayloadError(f"batch['responses'] is {width_r} wide but {field} covers {length} positions: no prompt")
    mask = tensors["response_mask"] if has(tensors, "response_mask") else attention[:, length - width_r :]
    response = as_mask(mask, "batch['response_mask']", (size, width_r))
    picked, layers = pick_layers(raw, moe_layers, field)
    ids = checked_ids(picked, field, num_experts, physical_to_logical)[:, :-1].copy()  # [B, P + R - 1, layers, k]
    inputs = attention.copy()  # [B, P + R]: real tokens but each sequence's last, which is never an input
    inputs[np.arange(size), length - 1 - np.argmax(attention[:, ::-1], axis=1)] = False
    ids[~inputs[:, :-1]] = -1  # padding and last tokens (R2 records the last token's route too)
    ids[unrecorded_zero_rows(ids)] = -1  # zero fill inside the sequence
    scoring = np.zeros((size, length - 1), bool)  # [B, P + R - 1]
    scoring[:, length - 1 - width_r :] = response  # response token t is scored at position P - 1 + t
    return ImportedRoutes.of(ids, scoring, layers=layers, num_experts=num_experts, source="verl",
                             response_width=width_r)
