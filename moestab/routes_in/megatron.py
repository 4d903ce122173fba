"""Megatron-Core (>= 0.16) ``RouterReplay`` and NeMo Automodel's ``RouterReplay``: one instance per MoE layer (per
gate), each holding ``[num_tokens, top_k]`` top-k indices; ``RouterReplay.get_recorded_data()`` (Megatron-Core) or
``RouterReplay.collect()`` (NeMo Automodel) returns them as a list in layer order, and ``set_replay_data`` /
``set_replay_indices`` take the same list back. Tested against the real ``megatron.core`` class where it installs
(megatron-core 0.16.1 on CPU); NeMo Automodel's from its documented layout.

The token axis is the router's input flattened: Megatron-Core's hidden states are ``[seq, batch, hidden]``, so its
tokens run sequence-major (``sequence_first=True``: token ``s * batch + b``); a packed (THD) batch is one sequence of
all tokens (``batch_size=1``); NeMo Automodel's Hugging Face-style ``[batch, seq]`` models run batch-major. A row
holding -1 (NeMo Automodel's "keep the live routing" sentinel) is not routed. There is no prompt/response split in
these lists: ``scoring`` (``[batch, seq]``, the positions whose logits score trained tokens) says which positions
count, and ``attention_mask`` marks padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from moestab.routes_in.common import ImportedRoutes, PayloadError, as_ids, as_mask, checked_ids
from moestab.routing.routes import Routes


def stack_layers(per_layer: Sequence[Any], field: str) -> np.ndarray:
    """``L`` tensors ``[num_tokens, top_k]`` -> ``[num_tokens, L, top_k]``; :class:`PayloadError` for a missing layer
    or layers that disagree."""
    if len(per_layer) == 0:
        raise PayloadError(f"{field} is empty: no RouterReplay instance (was the model built with routing replay on?)")
    arrays = []
    for i, value in enumerate(per_layer):
        if value is None:
            raise PayloadError(f"{field}[{i}] is None: layer {i} recorded nothing (no forward under RECORD)")
        arr = as_ids(value, f"{field}[{i}]")
        if arr.ndim != 2 or (arrays and arr.shape != arrays[0].shape):
            expected = "[num_tokens, top_k]" if not arrays else str(list(arrays[0].shape))
            raise PayloadError(f"{field}[{i}] has shape {list(arr.shape)}, expected {expected} like layer 0")
        arrays.append(arr)
    return np.stack(arrays, axis=1)  # [num_tokens, layers, top_k]


def from_megatron(
    per_layer: Sequence[Any],
    *,
    num_experts: int,
    batch_size: int = 1,
    sequence_first: bool = True,
    layers: Sequence[int] | None = None,
    attention_mask: Any | None = None,
    scoring: Any | None = None,
    physical_to_logical: Any | None = None,
    source: str = "megatron",
) -> ImportedRoutes:
    """Per-layer top-k lists on moestab's layout ``[batch, seq, layers, top_k]``.

    Args:
        per_layer: one ``[num_tokens, top_k]`` integer tensor per MoE layer, in layer order.
        num_experts: routed experts per layer.
        batch_size: sequences in the forward (``num_tokens = batch_size * seq``; 1 for a packed batch).
        sequence_first: tokens run sequence-major (Megatron-Core's ``[s, b, h]``) rather than batch-major.
        layers: the decoder-layer index of each list entry (default ``0 .. L - 1``).
        attention_mask: ``[batch, seq]`` 1 for real tokens; padding positions become -1.
        scoring: ``[batch, seq]`` positions whose logits score a trained token (default: every unpadded position).
        physical_to_logical: ``[physical]`` or ``[layers, physical]`` map, only for physical ids.
    """
    field = f"{source} per-layer routes"
    stacked = stack_layers(per_layer, field)  # [num_tokens, layers, k]
    tokens = stacked.shape[0]
    if batch_size < 1 or tokens % batch_size:
        raise PayloadError(f"{field}: {tokens} tokens do not split into batch_size={batch_size} sequences")
    seq = tokens // batch_size
    ids = checked_ids(stacked, field, num_experts, physical_to_logical)
    shaped = ids.reshape(seq, batch_size, *ids.shape[1:]).swapaxes(0, 1) if sequence_first else \
        ids.reshape(batch_size, seq, *ids.shape[1:])  # [batch, seq, layers, k]
    shaped = np.ascontiguousarray(shaped)
    valid = np.ones((batch_size, seq), bool) if attention_mask is None else \
        as_mask(attention_mask, f"{source} attention_mask", (batch_size, seq))
    shaped[~valid] = -1
    scored = valid if scoring is None else as_mask(scoring, f"{source} scoring", (batch_size, seq)) & valid
    names = tuple(range(stacked.shape[1])) if layers is None else tuple(int(x) for x in layers)
    if len(names) != stacked.shape[1]:
        raise PayloadError(f"{field}: layers lists {len(names)} indices for {stacked.shape[1]} per-layer tensors")
    return ImportedRoutes.of(shaped, scored, layers=names, num_experts=num_experts, source=source)


def from_nemo_automodel(per_layer: Sequence[Any], **options: Any) -> ImportedRoutes:
    """NeMo Automodel's ``RouterReplay.collect()`` list: :func:`from_megatron` with batch-major tokens."""
    options.setdefault("sequence_first", False)
    return from_megatron(per_layer, source="nemo-automodel", **options)


def to_megatron(routes: Routes, *, sequence_first: bool = True) -> list[torch.Tensor]:
    """moestab routes ``[batch, seq, layers, top_k]`` as Megatron-Core's ``set_replay_data`` list: one int64
    ``[batch * seq, top_k]`` tensor per layer, sequence-major by default (the inverse of :func:`from_megatron`)."""
    idx = routes.indices.long()  # [batch, seq, layers, k]
    flat = idx.transpose(0, 1) if sequence_first else idx  # [seq, batch, layers, k] or as is
    flat = flat.reshape(-1, idx.shape[2], idx.shape[3])  # [tokens, layers, k]
    return [flat[:, layer].contiguous() for layer in range(idx.shape[2])]
