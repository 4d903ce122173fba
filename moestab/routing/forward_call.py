"""What a top-level model forward is being called on: batch, length, padding, cache state.

Routers see a flat ``[batch * seq, hidden]`` token matrix; the recorder and replay read the call's
shape and attention mask from a pre-hook on the model to map those rows back to positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ForwardCall:
    batch: int
    seq: int
    attention_mask: torch.Tensor | None
    """``[batch, seq]`` bool for the tokens of this call (True = real token); None = no padding."""
    continuation: bool
    """True when the call extends a KV cache that already holds tokens (a decode step)."""


def read_forward_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> ForwardCall:
    """Parse a ``model(...)`` call as seen by a ``register_forward_pre_hook(with_kwargs=True)``."""
    tokens = kwargs.get("input_ids")
    if tokens is None and args:
        tokens = args[0]
    if tokens is None:
        tokens = kwargs.get("inputs_embeds")
    if tokens is None:
        raise ValueError("cannot route-track a forward without input_ids or inputs_embeds")
    batch, seq = tokens.shape[0], tokens.shape[1]

    cache = kwargs.get("past_key_values")
    past = _cached_length(cache) if cache is not None else 0

    mask = kwargs.get("attention_mask")
    if mask is not None and mask.dim() == 2:
        mask = mask[:, -seq:].bool()  # during decoding the mask covers past + current tokens
    elif mask is not None:
        raise ValueError(
            f"attention_mask of shape {tuple(mask.shape)} is not supported for route tracking; "
            "pass the usual [batch, seq] padding mask"
        )
    return ForwardCall(batch=batch, seq=seq, attention_mask=mask, continuation=past > 0)


def _cached_length(cache: Any) -> int:
    """Tokens already in a KV cache: its first layer's count, or, when that layer holds none (hybrid caches whose
    layer 0 is linear attention, e.g. MiniMax's), the largest count of any of its layers."""
    if not hasattr(cache, "get_seq_length"):
        return 0
    past = cache.get_seq_length()
    if past > 0:
        return past
    for index in range(1, len(getattr(cache, "layers", ()))):
        try:
            past = max(past, cache.get_seq_length(index))
        except (ValueError, IndexError, TypeError):  # a layer kind that keeps no token count
            continue
    return past
