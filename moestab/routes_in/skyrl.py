"""SkyRL (``generator.inference_engine.enable_return_routed_experts``; read from its source, NovaSky-AI/SkyRL commit
``a9564572``: ``skyrl/backends/skyrl_train/inference_servers/generate_wire.py``, ``utils/routed_experts.py``,
``skyrl/train/generators/base.py`` and ``skyrl/train/dataset/preprocess.py``).

The ``/skyrl/v1/generate`` endpoint returns each choice's vLLM routes as a compact payload (SkyRL PR #1909)
``{"data": base64, "shape": [tokens, layers, top_k], "dtype": "uint8" | "int16" | "int32"}``: C-order bytes in the
narrowest of those dtypes that holds the largest id (``compact_routed_expert_indices``), never a negative id. The
generator's output (``GeneratorOutput``) lists, per trajectory, ``prompt_token_ids``, ``response_ids``,
``loss_masks`` (per response token) and ``rollout_expert_indices``, the decoded ``[tokens, layers, top_k]`` array
from the trajectory's first prompt token (SkyRL trims it to at most prompt + response rows). Both forms are read
here; a compact payload SkyRL's own decoder would refuse (another dtype, a dtype wider than needed, negative ids, a
byte count that is not the shape's) is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from moestab.routes_in.common import ImportedRoutes, PayloadError, SequenceRows, as_mask, field_of, lay_out
from moestab.routes_in.wire import encoded_array, is_packed

WIRE_DTYPES = ("uint8", "int16", "int32")


def canonical_dtype(largest: int) -> str:
    """SkyRL's compact dtype for ids up to ``largest``."""
    return "uint8" if largest < 2**8 else "int16" if largest < 2**15 else "int32"


def trajectory_rows(value: Any, field: str) -> np.ndarray:
    """One trajectory's ``[tokens, layers, top_k]`` ids from an array or a compact payload, checked as SkyRL does."""
    rows, _ = encoded_array(value, field, WIRE_DTYPES)
    low, high = (int(rows.min()), int(rows.max())) if rows.size else (0, 0)
    if low < 0:
        raise PayloadError(f"{field} {list(rows.shape)} ({rows.dtype}) holds id {low}; SkyRL sends ids >= 0 only")
    if is_packed(value) and rows.dtype.name != canonical_dtype(high):
        raise PayloadError(f"{field}.dtype is {rows.dtype.name} for a largest id of {high}; SkyRL's compact payload "
                           f"sends {canonical_dtype(high)} (valid: {', '.join(WIRE_DTYPES)}, the narrowest that fits)")
    return rows


def from_skyrl(
    generator_output: Any,
    *,
    num_experts: int,
    moe_layers: Sequence[int] | None = None,
    physical_to_logical: Any | None = None,
) -> ImportedRoutes:
    """The routes of a SkyRL ``GeneratorOutput`` (dict or object) on moestab's layout, one trajectory each; response
    tokens with loss mask 0 are not scored."""
    prompts = field_of(generator_output, "prompt_token_ids", "generator_output.prompt_token_ids")
    responses = field_of(generator_output, "response_ids", "generator_output.response_ids")
    routes = field_of(generator_output, "rollout_expert_indices", "generator_output.rollout_expert_indices")
    masks = field_of(generator_output, "loss_masks", "", None)
    if routes is None or not len(prompts) == len(responses) == len(routes):
        raise PayloadError(f"generator_output.rollout_expert_indices must hold one [tokens, layers, top_k] array per "
                           f"trajectory: {len(prompts)} prompts, {len(responses)} responses, "
                           f"{'None' if routes is None else len(routes)} route arrays")
    if masks is not None and len(masks) != len(responses):
        raise PayloadError(f"generator_output.loss_masks holds {len(masks)} masks for {len(responses)} trajectories; "
                           "give one per trajectory, or none")
    sequences = []
    for i, (prompt, response, value) in enumerate(zip(prompts, responses, routes, strict=True)):
        field = f"generator_output.rollout_expert_indices[{i}]"
        trained = None if masks is None else as_mask(masks[i], f"generator_output.loss_masks[{i}]", (len(response),))
        sequences.append(SequenceRows(trajectory_rows(value, field), len(prompt), len(response), field,
                                      trained=trained))
    return lay_out(sequences, num_experts=num_experts, source="skyrl", moe_layers=moe_layers,
                   physical_to_logical=physical_to_logical)
