"""SGLang (``--enable-return-routed-experts``, request ``return_routed_experts=True``): per response,
``meta_info["routed_experts"]``, base64 of a flat id array, reshaped to ``[positions, num_layers * top_k]``: one row
per position from ``routed_experts_start_len`` (the request's start for incremental, multi-turn returns; 0 = the
whole sequence) through the penultimate token, and one ``top_k`` group per decoder layer (``num_hidden_layers``: dense
layers' groups are zero; name the MoE layers with ``moe_layers``). The prompt and response lengths come from
``meta_info["prompt_tokens"]`` and ``meta_info["completion_tokens"]``.

The array's dtype: int32 in SGLang 0.5.23 (checked against the installed package's ``sglang/srt/state_capturer``);
with SGLang's wire encoding (``state_capturer/routed_experts_wire.py``, PR #31219) ``meta_info["routed_experts_dtype"]``
names it, ``int32``, ``uint16`` or ``uint8`` (the server's ``SGLANG_ROUTED_EXPERTS_DTYPE``, falling back to int32
when the narrower type cannot hold every id); a payload without the field is int32. Any other name is refused.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from moestab.routes_in.common import ImportedRoutes, PayloadError, SequenceRows, field_of, lay_out
from moestab.routes_in.wire import decode_base64, wire_dtype

WIRE_DTYPES = ("int32", "uint16", "uint8")
"""What ``meta_info["routed_experts_dtype"]`` may name (SGLang's ``routed_experts_wire.py``); absent means int32."""


def response_rows(response: Any, i: int, *, num_layers: int, top_k: int) -> tuple[np.ndarray, int, int, int]:
    """Response ``i``'s route rows ``[positions, num_layers, top_k]``, their start, prompt and completion lengths."""
    meta = field_of(response, "meta_info", f"responses[{i}].meta_info")
    where = f"responses[{i}].meta_info"
    data = field_of(meta, "routed_experts", f"{where}.routed_experts")
    if data is None:
        raise PayloadError(f"{where}.routed_experts is None: the request was sent without return_routed_experts=True "
                           "or the server without --enable-return-routed-experts")
    named = field_of(meta, "routed_experts_dtype", "", None)
    dtype = wire_dtype("int32" if named is None else str(named).strip().lower(), f"{where}.routed_experts_dtype",
                       WIRE_DTYPES)
    start = int(field_of(meta, "routed_experts_start_len", "", 0) or 0)
    prompt = int(field_of(meta, "prompt_tokens", f"{where}.prompt_tokens"))
    completion = int(field_of(meta, "completion_tokens", f"{where}.completion_tokens"))
    flat = decode_base64(data, dtype, f"{where}.routed_experts")
    width = num_layers * top_k
    expected = prompt + completion - 1 - start
    if flat.size != expected * width:
        raise PayloadError(f"{where}.routed_experts holds {flat.size} {dtype.name} ids; [positions, num_layers * "
                           f"top_k] = [{expected}, {num_layers} * {top_k}] needs {expected * width} ({prompt} prompt + "
                           f"{completion} completion tokens - 1 - start {start})")
    return flat.reshape(expected, num_layers, top_k), start, prompt, completion


def from_sglang(
    responses: Sequence[Any],
    *,
    num_experts: int,
    num_layers: int,
    top_k: int,
    moe_layers: Sequence[int] | None = None,
    physical_to_logical: Any | None = None,
) -> ImportedRoutes:
    """SGLang's routes of ``responses`` (``/generate`` JSON or ``Engine.generate`` dicts) on moestab's layout.

    Args:
        responses: one response dict per sequence, each with its ``meta_info``.
        num_experts: routed experts per MoE layer.
        num_layers: the layer groups in the payload (SGLang: the model's ``num_hidden_layers``).
        top_k: experts per token and layer (``num_experts_per_tok``).
        moe_layers: the layer groups that are MoE layers (default: all).
        physical_to_logical: ``[physical]`` or ``[layers, physical]`` map, only for physical ids.
    """
    sequences = []
    for i, response in enumerate(responses):
        raw, start, p, r = response_rows(response, i, num_layers=num_layers, top_k=top_k)
        sequences.append(SequenceRows(raw, p, r, f"responses[{i}].meta_info.routed_experts", start))
    return lay_out(sequences, num_experts=num_experts, source="sglang", moe_layers=moe_layers,
                   physical_to_logical=physical_to_logical)
