"""Routes an inference engine returned per sequence, placed on the trainer's layout.

Engines return, per sequence, the experts of its own token positions from some start position through its last
input (the last response token is never fed back, so it has no route). The trainer's layout is one array
``[batch, length, layers, top_k]``: each prompt left-padded to ``prompt_width``, its response inputs after it, -1
wherever nothing was routed (padding, positions before the start, past the last input). ``place_rows`` does that for
every engine: ``--rollout-engine vllm`` (``moestab.train.vllm_engine``) and the payload importers of
``moestab.routes_in`` call it, so the two cannot disagree on where a route lands.

``vllm_rows`` owns vLLM's two layouts (``enable_return_routed_experts``):

- *split* (vLLM up to the 0.2x series): ``RequestOutput.prompt_routed_experts`` ``[prompt_len, layers, top_k]`` and
  ``CompletionOutput.routed_experts`` ``[generated (- 1), layers, top_k]``;
- *one array* (vLLM 0.33, ``vllm/outputs.py`` and ``sampling_params.py`` of the 0.33.0 wheel):
  ``CompletionOutput.routed_experts`` ``[prompt_len - start + generated - 1, layers, top_k]`` from the sampling
  parameter ``routed_experts_prompt_start`` (default 0) through the penultimate token, with one row per decoder
  layer (dense layers' rows are zero).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from moestab.run_folder.route_columns import INT16_MAX_EXPERTS


class RouteLayoutError(ValueError):
    """An engine's routes that cannot be placed: the message names the field, the shapes and what was expected."""


def check_id_width(dtype: np.dtype, num_experts: int, field: str) -> None:
    """Refuse a payload dtype too narrow for the model's ids: they wrapped (uint8 above 256 experts, where vLLM and
    prime-rl switch to uint16 and verl's older R2 records wrapped; int8 above 128, NeMo-RL's narrowest carry dtype)."""
    top = int(np.iinfo(dtype).max)
    if top < num_experts - 1:
        raise RouteLayoutError(f"{field} is {np.dtype(dtype).name}, which cannot hold the ids of {num_experts} experts "
                               f"(ids wrap at {top + 1}); the engine must send a wider dtype")


def expert_ids(arr: np.ndarray, field: str, num_experts: int) -> np.ndarray:
    """``arr`` as int16 expert ids, checked: each in ``0 .. num_experts - 1`` or -1 ("not routed"), and a dtype wide
    enough for ``num_experts`` (:func:`check_id_width`); moestab's int16 routes name at most 32768 experts."""
    if num_experts > INT16_MAX_EXPERTS:
        raise RouteLayoutError(f"{field}: num_experts={num_experts}, but moestab's int16 routes hold ids 0.."
                               f"{INT16_MAX_EXPERTS - 1} (at most {INT16_MAX_EXPERTS} experts)")
    check_id_width(arr.dtype, num_experts, field)
    if arr.size:
        low, high = int(arr.min()), int(arr.max())
        if low < -1 or high >= num_experts:
            raise RouteLayoutError(f"{field} {tuple(arr.shape)} holds expert ids {low}..{high}; valid ids are "
                                   f"0..{num_experts - 1} (num_experts={num_experts}) and -1 for not routed "
                                   f"(dtype {arr.dtype})")
    return arr.astype(np.int16, copy=False)


def vllm_rows(
    routed: np.ndarray, prompt_routed: np.ndarray | None, prompt_len: int, *, start: int, field: str,
    prompt_field: str,
) -> tuple[np.ndarray, int]:
    """One vLLM sequence's route rows ``[tokens, layers, top_k]`` and the position of the first.

    ``routed`` is the completion's ``routed_experts``; ``prompt_routed`` the request's ``prompt_routed_experts``
    (``None`` in the one-array layout, whose rows start at ``start``, the ``routed_experts_prompt_start`` sent). In
    the split layout the prompt's rows come first and the rows start at position 0. ``field`` / ``prompt_field``
    name the two arrays in errors.
    """
    if prompt_routed is None:
        return routed, start
    if prompt_routed.ndim != 3 or prompt_routed.shape[0] < prompt_len or prompt_routed.shape[1:] != routed.shape[1:]:
        raise RouteLayoutError(
            f"{prompt_field} has shape {list(prompt_routed.shape)}; expected [{prompt_len}, "
            f"{', '.join(map(str, routed.shape[1:]))}] (prompt tokens, layers, top_k of {field} "
            f"{list(routed.shape)})")
    return np.concatenate([prompt_routed[:prompt_len], routed]), 0


def place_rows(
    rows: Sequence[np.ndarray],
    prompt_lens: Sequence[int],
    response_lens: Sequence[int],
    *,
    starts: Sequence[int],
    prompt_width: int,
    length: int,
    field: str,
) -> tuple[np.ndarray, np.ndarray]:
    """Sequences' route rows on the trainer's layout: ``(indices, scoring)``.

    ``rows[i]`` ``[n_i, layers, top_k]`` are the routes of sequence ``i``'s positions ``starts[i] .. starts[i] + n_i
    - 1`` (position 0 is its first prompt token); rows past its last input position (``p_i + r_i - 2``) are dropped
    and a sequence whose rows end before it is refused. ``indices`` ``[B, length, layers, top_k]`` int16 (-1 where
    nothing was routed); ``scoring`` ``[B, length]`` marks the input positions that predict a response token. Ids
    are copied as given: checking them against the model is the caller's.
    """
    batch = len(rows)
    if not batch:
        raise RouteLayoutError(f"{field}: no sequences")
    if not len(prompt_lens) == len(response_lens) == len(starts) == batch:
        raise RouteLayoutError(f"{field}: {batch} sequences but {len(prompt_lens)} prompt lengths, "
                               f"{len(response_lens)} response lengths and {len(starts)} starts")
    shape = rows[0].shape[1:]  # (layers, top_k)
    out = np.full((batch, max(length, 0), *shape), -1, np.int16)  # [B, length, layers, top_k]
    scoring = np.zeros(out.shape[:2], bool)  # [B, length]
    for i, (seq, p, r, start) in enumerate(zip(rows, prompt_lens, response_lens, starts, strict=True)):
        if seq.ndim != 3 or seq.shape[1:] != shape:
            raise RouteLayoutError(f"{field} of sequence {i} has shape {list(seq.shape)}; expected [tokens, "
                                   f"{', '.join(map(str, shape))}] (tokens, layers, top_k)")
        if p < 1 or r < 1 or not 0 <= start <= p:
            raise RouteLayoutError(f"{field} of sequence {i}: need a prompt and a response token and 0 <= start <= "
                                   f"prompt, got prompt {p}, response {r}, start {start}")
        if p > prompt_width or prompt_width + r - 1 > length:
            raise RouteLayoutError(f"{field} of sequence {i}: a {p}-token prompt and {r}-token response do not fit "
                                   f"a prompt width of {prompt_width} and {length} input positions")
        need = p + r - 1 - start  # rows through the last input position
        if seq.shape[0] < need:
            raise RouteLayoutError(f"{field} of sequence {i} has {seq.shape[0]} route rows from position {start}; "
                                   f"its {p} prompt + {r} response tokens need {need} (through the last input "
                                   "position)")
        offset = prompt_width - p  # left padding
        out[i, offset + start : offset + p + r - 1] = seq[:need]
        scoring[i, prompt_width - 1 : prompt_width - 1 + r] = True
    return out, scoring
