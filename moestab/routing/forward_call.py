"""What a top-level model forward is being called on: batch, length, padding, cache state.

Routers see a flat ``[batch * seq, hidden]`` token matrix; the recorder and replay read the call's
shape and attention mask from a pre-hook on the model to map those rows back to positions.

The KV cache is the one transformers internal this depends on: its keyword changed from ``past_key_values``
(transformers <= 5.23) to ``cache`` (5.24). Both are read; a cache object passed under any other keyword is refused
(``RecordingError`` naming the transformers version), because a decode step that is not recognised as one would be
recorded as a new batch of sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import transformers
from transformers.cache_utils import Cache

from moestab.routing.errors import RecordingError

CACHE_KEYWORDS = ("cache", "past_key_values")
"""Keywords under which transformers passes the KV cache to a model's forward (5.24+, then <= 5.23)."""


@dataclass(frozen=True)
class ForwardCall:
    batch: int
    seq: int
    attention_mask: torch.Tensor | None
    """``[batch, seq]`` bool for the tokens of this call (True = real token); None = no padding."""
    continuation: bool
    """True when the call extends a KV cache that already holds tokens (a decode step)."""
    cached: bool = False
    """True when the call was handed a KV cache (empty or not): a ``generate()`` prefill or decode step."""


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

    cache = find_cache(kwargs)
    past = _cached_length(cache) if cache is not None else 0

    mask = kwargs.get("attention_mask")
    if mask is not None and mask.dim() == 2:
        if mask.shape[1] != seq:  # during decoding the mask covers past + current tokens
            mask = mask[:, -seq:]
        mask = mask.bool()  # [batch, seq]
    elif mask is not None:
        raise ValueError(
            f"attention_mask of shape {tuple(mask.shape)} is not supported for route tracking; "
            "pass the usual [batch, seq] padding mask"
        )
    return ForwardCall(batch=batch, seq=seq, attention_mask=mask, continuation=past > 0, cached=cache is not None)


def find_cache(kwargs: dict[str, Any]) -> Any | None:
    """The KV cache of a forward call, under whichever keyword this transformers passes it; None without one.

    Raises ``RecordingError`` when a cache object arrives under a keyword moestab does not know (a transformers
    release renamed it again): its decode steps could not be told from new sequences.
    """
    for name in CACHE_KEYWORDS:
        if kwargs.get(name) is not None:
            return kwargs[name]
    for name, value in kwargs.items():
        if isinstance(value, Cache):
            raise RecordingError(
                f"transformers {transformers.__version__} passed the model's KV cache as {name}=<"
                f"{type(value).__name__}>; moestab reads it as one of {', '.join(CACHE_KEYWORDS)}, so it cannot tell "
                "decode steps from new sequences. Install a transformers version this moestab was tested with "
                "(see README: 'Tested versions')."
            )
    return None


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
