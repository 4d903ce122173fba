"""Route payloads as frameworks put them on the wire: base64 bytes of a flat id array, a dtype by name, a shape.

Each framework names its own dtypes (SGLang: int32 / uint16 / uint8; NeMo-RL: int8 / int16 / int32; SkyRL: uint8 /
int16 / int32; prime-rl: uint8 / uint16), so a dtype is checked against the set its sender can send before a byte
is read. Bytes are read little-endian, as every one of them writes them (the native order of x86, ARM and GPUs).
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np
import torch

from moestab.routes_in.common import PayloadError, as_ids, field_of


def wire_dtype(name: Any, field: str, valid: Collection[str] | None = None) -> np.dtype:
    """The integer dtype named ``name`` (little-endian); with ``valid``, one of those names only."""
    text = str(name)
    if valid is not None and text not in valid:
        raise PayloadError(f"{field}: dtype {text!r} is not one this sender writes; valid: {', '.join(valid)}")
    try:
        kind = np.dtype(text)
    except TypeError as exc:
        raise PayloadError(f"{field}: unknown dtype {text!r}") from exc
    if not np.issubdtype(kind, np.integer):
        raise PayloadError(f"{field}: dtype {text!r} is not an integer type")
    return kind.newbyteorder("<")


def decode_base64(data: str | bytes, dtype: str | np.dtype, field: str) -> np.ndarray:
    """A flat array of ``dtype`` from base64 text (or raw bytes, passed through); :class:`PayloadError` on bad text,
    an unknown dtype or a byte count that is not a whole number of items."""
    kind = dtype if isinstance(dtype, np.dtype) else wire_dtype(dtype, field)
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


def shaped(flat: np.ndarray, shape: list[int], field: str) -> np.ndarray:
    """``flat`` as ``[tokens, layers, top_k]`` ``shape``; :class:`PayloadError` when the two disagree."""
    if len(shape) != 3 or min(shape) < 0 or math.prod(shape) != flat.size:  # Python ints: no int64 wraparound
        raise PayloadError(f"{field}: shape {shape} (expected [tokens, layers, top_k]) does not match its data, "
                           f"{flat.size} {flat.dtype.name} ids")
    return flat.reshape(shape)


def is_packed(value: Any) -> bool:
    """Whether ``value`` is a self-describing payload (a mapping or object with ``data``), not an array itself."""
    if torch.is_tensor(value) or isinstance(value, np.ndarray):
        return False
    return isinstance(value, Mapping) or hasattr(value, "data")


def encoded_array(value: Any, field: str, dtypes: Collection[str] | None = None) -> tuple[np.ndarray, int]:
    """An id array and its start position from a self-describing payload ``{"data": base64 text or bytes, "shape":
    [tokens, layers, top_k], "dtype": ..., "start": s}`` (prime-rl's encoding of vLLM's routes, SkyRL's compact
    payload; ``start`` 0 when absent), or from a plain array (start 0). ``dtypes``: the names the sender writes."""
    if not is_packed(value):
        return as_ids(value, field), 0
    data = field_of(value, "data", f"{field}.data")
    shape = [int(x) for x in field_of(value, "shape", f"{field}.shape")]
    kind = wire_dtype(field_of(value, "dtype", f"{field}.dtype"), f"{field}.dtype", dtypes)
    flat = decode_base64(data, kind, f"{field}.data")
    return shaped(flat, shape, field), int(field_of(value, "start", f"{field}.start", 0) or 0)
