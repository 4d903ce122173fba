"""NeMo-RL (``policy.router_replay.enabled``, vLLM rollouts; read from its source, ``nemo_rl/utils/
routed_experts_codec.py`` and ``nemo_rl/models/generation/vllm/utils.py``, NVIDIA-NeMo/RL commit ``7ea279ab``).

Its OpenAI-compatible server puts on each chat choice's message ``routed_experts``, ``prompt_token_ids`` and
``generation_token_ids``; NeMo-Gym output items carry the same three fields. ``routed_experts`` is the text envelope
``nrlre1:<dtype>:<S>x<L>x<K>:<base64>`` (NeMo-RL PR #3292): the C-order bytes of an ``[S, L, K]`` array, dtype
``int8``, ``int16`` or ``int32`` (the narrowest signed type for the model's experts, PR #3113); older payloads are
nested lists. The array is aligned to the whole sequence, ``S = prompt + generated`` tokens from the first prompt
token: rows vLLM did not return are all -1 (NeMo-RL's "no route": the trainer routes those itself), and the last row,
the final token that is never fed back, is a placeholder (``0 .. K - 1``) that is dropped here. A decision only partly
-1 is refused, as NeMo-RL's replay refuses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from moestab.routes_in.common import (
    ImportedRoutes,
    PayloadError,
    SequenceRows,
    as_ids,
    field_of,
    lay_out,
    refuse_partial_sentinels,
)
from moestab.routes_in.wire import decode_base64, shaped, wire_dtype

MAGIC = "nrlre1"
WIRE_DTYPES = ("int8", "int16", "int32")


def decode_envelope(text: str, field: str) -> np.ndarray:
    """``nrlre1:<dtype>:<S>x<L>x<K>:<base64>`` -> ``[S, L, K]`` of that dtype."""
    parts = text.split(":", 3)
    if len(parts) != 4 or parts[0] != MAGIC:
        raise PayloadError(f"{field} is not an '{MAGIC}:<dtype>:<S>x<L>x<K>:<base64>' envelope (it starts "
                           f"{text[:24]!r})")
    _, name, dims, data = parts
    kind = wire_dtype(name, f"{field} dtype", WIRE_DTYPES)
    try:
        shape = [int(d) for d in dims.split("x")]
    except ValueError:
        raise PayloadError(f"{field}: shape {dims!r} is not <S>x<L>x<K> (three whole numbers)") from None
    return shaped(decode_base64(data, kind, field), shape, field)


def message_rows(item: Any, i: int) -> SequenceRows:
    """Sequence ``i``: a chat choice (its ``message``) or a message / NeMo-Gym output item."""
    message = field_of(item, "message", "", item)
    where = f"outputs[{i}]" + (".message" if message is not item else "")
    routed = field_of(message, "routed_experts", f"{where}.routed_experts")
    prompt = len(field_of(message, "prompt_token_ids", f"{where}.prompt_token_ids"))
    generated = len(field_of(message, "generation_token_ids", f"{where}.generation_token_ids"))
    field = f"{where}.routed_experts"
    rows = decode_envelope(routed, field) if isinstance(routed, str) else as_ids(routed, field)  # [S, L, K]
    if rows.ndim == 3:
        refuse_partial_sentinels(rows, field)
    return SequenceRows(rows, prompt, generated, field)


def from_nemo_rl(
    outputs: Sequence[Any],
    *,
    num_experts: int,
    moe_layers: Sequence[int] | None = None,
    physical_to_logical: Any | None = None,
) -> ImportedRoutes:
    """NeMo-RL's routes of ``outputs`` (chat choices, their messages or NeMo-Gym output items; objects or JSON) on
    moestab's layout, one sequence each; every generated token is a trained one."""
    sequences = [message_rows(item, i) for i, item in enumerate(outputs)]
    return lay_out(sequences, num_experts=num_experts, source="nemo-rl", moe_layers=moe_layers,
                   physical_to_logical=physical_to_logical)
