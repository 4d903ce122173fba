"""What every importer shares: the result type, the payload error, decoding, id checks and moestab's position layout.

moestab's layout of a batch (the one ``moestab train``'s rollout engines produce, docs/run-format.md): sequence ``i``
with a prompt of ``p_i`` tokens and a response of ``r_i`` tokens sits left-padded on ``P = max p_i`` prompt columns;
its input positions are its prompt and its first ``r_i - 1`` response tokens (the last sampled token is never an
input), ``P + R - 1`` columns in all; -1 everywhere nothing was routed. A response token's routes are those of the
input position whose logits score it: position ``P - 1 + t`` for response token ``t``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from moestab.recording.engine_routes import RouteLayoutError, check_id_width, expert_ids, place_rows
from moestab.routing.routes import Routes

ID_LIMIT = np.iinfo(np.int16).max
"""The largest expert id moestab's int16 routes hold."""


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


def decode_base64(data: str | bytes, dtype: str, field: str) -> np.ndarray:
    """A flat array of ``dtype`` from base64 text (or raw bytes, passed through); :class:`PayloadError` on bad text,
    an unknown dtype or a byte count that is not a whole number of items."""
    try:
        kind = np.dtype(dtype)
    except TypeError as exc:
        raise PayloadError(f"{field}: unknown dtype {dtype!r}") from exc
    if not np.issubdtype(kind, np.integer):
        raise PayloadError(f"{field}: dtype {dtype!r} is not an integer type")
    if isinstance(data, str):
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise PayloadError(f"{field} is not valid base64 ({exc})") from exc
    elif isinstance(data, bytes | bytearray | memoryview):
        raw = bytes(data)
    else:
        raise PayloadError(f"{field} must be base64 text or bytes, got {type(data).__name__}")
    if len(raw) % kind.itemsize:
        raise PayloadError(f"{field}: {len(raw)} bytes is not a whole number of {kind.name} ids")
    return np.frombuffer(raw, dtype=kind)


def checked_ids(
    arr: np.ndarray, field: str, num_experts: int, physical_to_logical: np.ndarray | None = None,
) -> np.ndarray:
    """``arr`` as int16 expert ids in ``-1 .. num_experts - 1`` (-1 kept as the "not routed" sentinel).

    A uint8 payload cannot name more than 256 experts (prime-rl and vLLM switch to uint16 above that; verl's older R2
    records wrapped ids into uint8): refused for a model with more. With ``physical_to_logical`` (``[physical]`` or
    ``[layers, physical]``, an engine's expert-parallel load-balancing map) ids are physical slots mapped to logical
    experts first, for an engine that says it returns physical ids.
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
    if not layers or min(layers) < 0 or max(layers) >= width:
        raise PayloadError(f"moe_layers {list(layers)} must index the {width} layer rows of {field} {tuple(arr.shape)}")
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


def lay_out(
    rows: Sequence[np.ndarray],
    prompt_lens: Sequence[int],
    response_lens: Sequence[int],
    *,
    starts: Sequence[int] | None = None,
    layers: tuple[int, ...],
    num_experts: int,
    source: str,
    field: str,
) -> ImportedRoutes:
    """Sequences' routes on moestab's layout (module docstring).

    ``rows[i]`` ``[n_i, layers, top_k]`` int16 (checked) are the routes of sequence ``i``'s own token positions
    ``starts[i] .. starts[i] + n_i - 1`` (default start 0: from its first prompt token). Positions before the start
    are unrecorded (-1); rows past its last input position (``p_i + r_i - 2``) are dropped; a sequence whose rows end
    before it is refused, naming ``field`` and the shapes.
    """
    starts = [0] * len(rows) if starts is None else list(starts)
    width_p, width_r = max(prompt_lens, default=0), max(response_lens, default=0)
    try:
        # [B, P + R - 1, layers, k], [B, P + R - 1]
        out, scoring = place_rows(rows, prompt_lens, response_lens, starts=starts, prompt_width=width_p,
                                  length=width_p + width_r - 1, field=field)
    except RouteLayoutError as exc:
        raise PayloadError(str(exc)) from exc
    routes = Routes(indices=torch.from_numpy(out), layers=layers, num_experts=num_experts)
    return ImportedRoutes(routes=routes, scoring=torch.from_numpy(scoring), source=source, response_width=width_r)


def encoded_array(value: Any, field: str) -> tuple[np.ndarray, int]:
    """An id array and its start position from a self-describing payload ``{"data": base64 text or bytes, "shape":
    [tokens, layers, top_k], "dtype": "uint8" | "uint16" | ..., "start": s}`` (prime-rl's encoding of vLLM's routes;
    ``start`` 0 when absent), or from a plain array (start 0)."""
    if not isinstance(value, Mapping) and not hasattr(value, "data"):
        return as_ids(value, field), 0
    data = field_of(value, "data", f"{field}.data")
    shape = [int(x) for x in field_of(value, "shape", f"{field}.shape")]
    dtype = str(field_of(value, "dtype", f"{field}.dtype"))
    flat = decode_base64(data, dtype, f"{field}.data")
    if len(shape) != 3 or int(np.prod(shape)) != flat.size:
        raise PayloadError(f"{field}: shape {shape} (expected [tokens, layers, top_k]) does not match its data, "
                           f"{flat.size} {dtype} ids")
    return flat.reshape(shape), int(field_of(value, "start", f"{field}.start", 0) or 0)
