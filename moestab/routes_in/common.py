"""What every importer shares: the result type, the payload error, id checks and moestab's position layout (payload
decoding: :mod:`moestab.routes_in.wire`).

moestab's layout of a batch (the one ``moestab train``'s rollout engines produce, docs/run-format.md): sequence ``i``
with a prompt of ``p_i`` tokens and a response of ``r_i`` tokens sits left-padded on ``P = max p_i`` prompt columns;
its input positions are its prompt and its first ``r_i - 1`` response tokens (the last sampled token is never an
input), ``P + R - 1`` columns in all; -1 everywhere nothing was routed. A response token's routes are those of the
input position whose logits score it: position ``P - 1 + t`` for response token ``t``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from moestab.routes_in.placement import RouteLayoutError, check_id_width, expert_ids, place_rows
from moestab.routing.routes import Routes


class PayloadError(ValueError):
    """A framework's payload does not fit its documented layout; the message names the field, its shape and what was
    expected (docs/integrations.md)."""


@dataclass(frozen=True)
class ImportedRoutes:
    """Routes brought in from another framework, in moestab's layout."""

    routes: Routes
    """``indices [batch, positions, layers, top_k]`` int16 over input positions, -1 where nothing was routed
    (padding, positions the engine did not return, sentinels)."""
    scoring: torch.Tensor
    """``[batch, positions]`` bool: the input positions whose logits score a response (trained) token, one per token."""
    source: str
    """The framework the payload came from (its registry name)."""
    response_width: int | None = None
    """``R``, when the layout is prompt + response (``P - 1 + R`` positions, response token ``t`` scored at position
    ``P - 1 + t``); None for a layout without that split (Megatron-Core's flat token lists)."""

    @classmethod
    def of(
        cls, indices: np.ndarray, scoring: np.ndarray, *, layers: Sequence[int], num_experts: int, source: str,
        response_width: int | None = None,
    ) -> ImportedRoutes:
        """From checked int16 ``indices`` ``[batch, positions, layers, top_k]`` and bool ``scoring`` ``[batch,
        positions]``."""
        routes = Routes(indices=torch.from_numpy(np.ascontiguousarray(indices)), layers=tuple(layers),
                        num_experts=num_experts)
        return cls(routes=routes, scoring=torch.from_numpy(scoring), source=source, response_width=response_width)

    def __post_init__(self) -> None:
        if self.scoring.shape != self.routes.indices.shape[:2]:
            raise ValueError(f"scoring must be [batch, positions] = {list(self.routes.indices.shape[:2])}, "
                             f"got {list(self.scoring.shape)}")

    @property
    def tokens(self) -> int:
        """Number of response tokens."""
        return int(self.scoring.sum())

    def response_routes(self) -> torch.Tensor:
        """``[tokens, layers, top_k]`` int16: each response token's routes, row-major over (sequence, position) — what
        :func:`moestab.recording.diagnostics.route_diagnostics` compares."""
        return self.routes.indices[self.scoring]

    def integrity(self, reference: Any | None = None) -> dict[str, object]:
        """``routes/integrity/*`` of the response tokens' routes (:mod:`moestab.metrics.integrity`): coverage, ids,
        constant layers and wraparound from the payload alone; with ``reference`` (the trainer's routes of the same
        tokens, ``[tokens, layers, top_k]``) the agreement against chance too."""
        from moestab.metrics.integrity import route_integrity

        ref = None if reference is None else np.asarray(torch.as_tensor(reference), dtype=np.int16)
        return route_integrity(self.response_routes().numpy(), ref, num_experts=self.routes.num_experts)

    def per_token(self, per_response: Any, field: str) -> torch.Tensor:
        """A response-aligned ``[batch, R]`` tensor (log-probs as frameworks hold them: column ``t`` = response token
        ``t``) -> ``[tokens]`` in :meth:`response_routes`' order."""
        if self.response_width is None:
            raise PayloadError(f"{field}: routes from {self.source} have no prompt/response split; pass per-token "
                               "values in response_routes() order instead")
        values = per_response if torch.is_tensor(per_response) else torch.as_tensor(np.asarray(per_response))
        shape = [self.scoring.shape[0], self.response_width]
        if list(values.shape) != shape:
            raise PayloadError(f"{field} must be [batch, response] = {shape}, got {list(values.shape)}")
        start = self.scoring.shape[1] - self.response_width  # the position scoring response token 0
        return values[self.scoring[:, start:]]  # [tokens]


def field_of(payload: Any, name: str, field: str, default: Any = ...) -> Any:
    """``payload[name]`` or ``payload.name``; :class:`PayloadError` naming ``field`` when it is absent and no
    ``default`` is given."""
    if isinstance(payload, Mapping):
        if name in payload:
            return payload[name]
    elif hasattr(payload, name):
        return getattr(payload, name)
    if default is not ...:
        return default
    raise PayloadError(f"{field} is missing (no {name!r} in {type(payload).__name__})")


def as_ids(value: Any, field: str) -> np.ndarray:
    """An integer array from a numpy array, torch tensor or nested list, without a copy where possible."""
    if value is None:
        raise PayloadError(f"{field} is None: the engine returned no routes (was route capture enabled?)")
    if torch.is_tensor(value):
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    if arr.dtype == object or not np.issubdtype(arr.dtype, np.integer):
        raise PayloadError(f"{field} must hold integer expert ids, got dtype {arr.dtype} and shape {arr.shape}")
    return arr


def checked_ids(
    arr: np.ndarray, field: str, num_experts: int, physical_to_logical: np.ndarray | None = None,
) -> np.ndarray:
    """``arr`` as int16 expert ids in ``-1 .. num_experts - 1`` (-1 kept as the "not routed" sentinel).

    A payload dtype too narrow for the model (uint8 above 256 experts: prime-rl and vLLM switch to uint16 there, verl's
    older R2 records wrapped; int8 above 128) is refused: its ids wrapped. With ``physical_to_logical``
    (``[physical]`` or ``[layers, physical]``, an engine's expert-parallel load-balancing map) ids are physical slots
    mapped to logical experts first, for an engine that says it returns physical ids.
    """
    try:
        check_id_width(arr.dtype, num_experts, field)  # the payload as sent, before any mapping
        if physical_to_logical is not None:
            arr = to_logical(arr, physical_to_logical, field)
        return expert_ids(arr, field, num_experts)
    except RouteLayoutError as exc:
        raise PayloadError(str(exc)) from exc


def to_logical(arr: np.ndarray, physical_to_logical: Any, field: str) -> np.ndarray:
    """Map physical expert slots ``arr`` ``[..., layers, top_k]`` to logical ids with ``physical_to_logical``."""
    table = as_ids(physical_to_logical, "physical_to_logical").astype(np.int64)
    ids = arr.astype(np.int64)
    valid = ids >= 0
    if ids.size and valid.any() and int(ids[valid].max()) >= table.shape[-1]:
        raise PayloadError(f"{field} holds physical id {int(ids[valid].max())} but physical_to_logical "
                           f"{tuple(table.shape)} maps {table.shape[-1]} slots")
    safe = np.where(valid, ids, 0)
    if table.ndim == 1:
        mapped = table[safe]
    elif table.ndim == 2 and arr.ndim >= 2 and table.shape[0] == arr.shape[-2]:
        layer = np.arange(table.shape[0]).reshape(-1, 1)  # [layers, 1] broadcast over [..., layers, top_k]
        mapped = table[layer, safe]
    else:
        raise PayloadError(f"physical_to_logical must be [physical] or [layers, physical] with {arr.shape[-2]} layers, "
                           f"got {tuple(table.shape)}")
    return np.where(valid, mapped, -1)


def pick_layers(arr: np.ndarray, moe_layers: Sequence[int] | None, field: str) -> tuple[np.ndarray, tuple[int, ...]]:
    """The MoE layers' rows of ``arr`` ``[..., payload_layers, top_k]`` and their decoder-layer indices.

    Engines that size their capture by every decoder layer (vLLM 0.33, SGLang) leave dense layers' rows zero;
    ``moe_layers`` names the rows to keep (default: every row is an MoE layer, numbered from 0)."""
    width = arr.shape[-2]
    if moe_layers is None:
        return arr, tuple(range(width))
    layers = tuple(int(x) for x in moe_layers)
    if not layers or min(layers) < 0 or max(layers) >= width or len(set(layers)) != len(layers):
        raise PayloadError(f"moe_layers {list(layers)} must be distinct indices of the {width} layer rows of {field} "
                           f"{tuple(arr.shape)}")
    return arr[..., list(layers), :], layers


def unrecorded_zero_rows(arr: np.ndarray) -> np.ndarray:
    """bool ``[..., layers]``: decisions whose ``top_k >= 2`` slots are all expert 0. Top-k experts are distinct, so
    such a decision is zero padding (verl, prime-rl and vLLM fill what they did not record with zeros), not a route."""
    if arr.shape[-1] < 2:
        return np.zeros(arr.shape[:-1], bool)
    return ~arr.any(axis=-1)


def as_mask(value: Any, field: str, shape: tuple[int, ...]) -> np.ndarray:
    """A bool array of ``shape`` from a 0/1 or bool array / tensor; :class:`PayloadError` naming ``field`` otherwise."""
    if torch.is_tensor(value):
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    if arr.shape != shape:
        raise PayloadError(f"{field} must be {list(shape)}, got shape {list(arr.shape)}")
    return arr.astype(bool)


@dataclass(frozen=True)
class SequenceRows:
    """One sequence's route rows as its framework sent them, and where they sit in the sequence."""

    rows: np.ndarray
    """``[n, payload_layers, top_k]`` integer ids of the sequence's positions ``start .. start + n - 1`` (position 0
    is its first prompt token)."""
    prompt: int
    """Prompt tokens."""
    response: int
    """Response tokens."""
    field: str
    """The payload field the rows came from, for errors."""
    start: int = 0
    """The sequence position of the first row (an engine's prompt start, for incremental returns)."""
    trained: np.ndarray | None = None
    """bool ``[response]``: the response tokens the trainer trains on (loss mask); None for all of them."""


def lay_out(
    sequences: Sequence[SequenceRows],
    *,
    num_experts: int,
    source: str,
    moe_layers: Sequence[int] | None = None,
    physical_to_logical: Any | None = None,
) -> ImportedRoutes:
    """Sequences' routes on moestab's layout (module docstring), their ids checked.

    Positions before a sequence's start are unrecorded (-1); a row for the last token (position ``p + r - 1``, which
    predicts nothing) is dropped; a sequence whose rows end before its last input position, or run past its last
    token (rows of another sequence: a misaligned payload), is refused, naming the field and the shapes. A response
    token is scored unless its sequence's ``trained`` mask leaves it out.
    """
    rows: list[np.ndarray] = []
    layers: tuple[int, ...] = ()
    for seq in sequences:
        if seq.rows.ndim != 3 or seq.rows.shape[-1] < 1:
            raise PayloadError(f"{seq.field} must be [tokens, layers, top_k] with top_k >= 1, got shape "
                               f"{list(seq.rows.shape)} ({seq.rows.dtype})")
        if seq.start + len(seq.rows) > seq.prompt + seq.response:
            raise PayloadError(f"{seq.field} has {len(seq.rows)} rows from position {seq.start}, past the sequence's "
                               f"{seq.prompt + seq.response} tokens ({seq.prompt} prompt + {seq.response} response): "
                               "at most a row per token; the payload does not belong to this sequence")
        picked, layers = pick_layers(seq.rows, moe_layers, seq.field)
        rows.append(checked_ids(picked, seq.field, num_experts, physical_to_logical))
    prompts, responses = [s.prompt for s in sequences], [s.response for s in sequences]
    width_p, width_r = max(prompts, default=0), max(responses, default=0)
    try:
        # [B, P + R - 1, layers, k], [B, P + R - 1]
        out, scoring = place_rows(rows, prompts, responses, starts=[s.start for s in sequences], prompt_width=width_p,
                                  length=width_p + width_r - 1, field=f"{source} routed_experts")
    except RouteLayoutError as exc:
        raise PayloadError(str(exc)) from exc
    for i, seq in enumerate(sequences):
        if seq.trained is not None:
            scoring[i, width_p - 1 : width_p - 1 + seq.response] &= seq.trained  # response token t at P - 1 + t
    return ImportedRoutes.of(out, scoring, layers=layers, num_experts=num_experts, source=source,
                             response_width=width_r)


def refuse_partial_sentinels(ids: np.ndarray, field: str) -> None:
    """A decision ``[..., top_k]`` is either all -1 ("not routed") or a route: one with only some slots -1 is corrupt
    (NeMo-RL's replay refuses it too) and would be half counted."""
    unset = ids < 0
    partial = unset.any(axis=-1) & ~unset.all(axis=-1)
    if partial.any():
        where = [int(x) for x in np.argwhere(partial)[0]]
        raise PayloadError(f"{field} {list(ids.shape)} ({ids.dtype}) has a decision at {where} that is partly -1 "
                           f"({ids[tuple(where)].tolist()}); valid: every top_k slot an expert id, or all -1")
