"""vLLM (``enable_return_routed_experts``): per request, the experts of every token vLLM fed through the model.

Both of vLLM's layouts (the *split* one of releases up to the 0.2x series, and vLLM 0.33's *one array* from
``routed_experts_prompt_start`` through the penultimate token, one row per decoder layer, dense layers' rows zero:
name the MoE rows with ``moe_layers``) are read by :func:`moestab.routes_in.placement.vllm_rows`, which
``--rollout-engine vllm`` uses too; they are told apart by the request's ``prompt_routed_experts``.

Either may come as objects (``vllm.RequestOutput``) or as the OpenAI-server JSON (``prompt_token_ids``,
``choices[i].token_ids``, ``choices[i].routed_experts``), routes as arrays, nested lists or prime-rl's base64
encoding. Ids are vLLM's logical ids (before any expert-parallel load-balancing remap); ``physical_to_logical`` maps
physical ones for an engine configured to return those.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from moestab.routes_in.common import ImportedRoutes, PayloadError, SequenceRows, field_of, lay_out
from moestab.routes_in.placement import RouteLayoutError, vllm_rows
from moestab.routes_in.wire import encoded_array


def _completion(request: Any, i: int, completion: int) -> tuple[Any, str]:
    outputs = field_of(request, "outputs", f"requests[{i}].outputs", None)
    name = "outputs"
    if outputs is None:
        outputs, name = field_of(request, "choices", f"requests[{i}].outputs (or choices)"), "choices"
    if not 0 <= completion < len(outputs):
        raise PayloadError(f"requests[{i}].{name} has {len(outputs)} completions; completion={completion} is not one")
    return outputs[completion], f"requests[{i}].{name}[{completion}]"


def request_rows(request: Any, i: int, *, completion: int, prompt_start: int) -> tuple[np.ndarray, int, int, int]:
    """Sequence ``i``'s route rows, their start position, its prompt and response lengths."""
    prompt = field_of(request, "prompt_token_ids", f"requests[{i}].prompt_token_ids")
    out, where = _completion(request, i, completion)
    response = field_of(out, "token_ids", f"{where}.token_ids")
    routed, start = encoded_array(field_of(out, "routed_experts", f"{where}.routed_experts"), f"{where}.routed_experts")
    prompt_routed = field_of(request, "prompt_routed_experts", "", None)
    prompt_field = f"requests[{i}].prompt_routed_experts"
    head = None if prompt_routed is None else encoded_array(prompt_routed, prompt_field)[0]
    try:
        rows, first = vllm_rows(routed, head, len(prompt), start=start or prompt_start, field=f"{where}.routed_experts",
                                prompt_field=prompt_field)
    except RouteLayoutError as exc:
        raise PayloadError(str(exc)) from exc
    return rows, first, len(prompt), len(response)


def from_vllm(
    requests: Sequence[Any],
    *,
    num_experts: int,
    moe_layers: Sequence[int] | None = None,
    completion: int = 0,
    prompt_start: int = 0,
    physical_to_logical: Any | None = None,
) -> ImportedRoutes:
    """vLLM's routes of ``requests`` (one completion each) on moestab's layout.

    Args:
        requests: ``vllm.RequestOutput`` objects or their JSON form, one per sequence.
        num_experts: routed experts per MoE layer (ids are checked against it).
        moe_layers: the rows of vLLM's layer axis that are MoE layers (default: all).
        completion: which completion of each request (``n > 1`` sampling).
        prompt_start: the ``routed_experts_prompt_start`` the requests were sent with (one-array layout).
        physical_to_logical: ``[physical]`` or ``[layers, physical]`` map, only for physical ids.
    """
    sequences = []
    for i, request in enumerate(requests):
        raw, start, p, r = request_rows(request, i, completion=completion, prompt_start=prompt_start)
        sequences.append(SequenceRows(raw, p, r, f"requests[{i}] routed experts", start))
    return lay_out(sequences, num_experts=num_experts, source="vllm", moe_layers=moe_layers,
                   physical_to_logical=physical_to_logical)
