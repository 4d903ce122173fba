"""Binning helpers shared by the analyzers: fixed edges labelled by their left edge, quantile edges."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Response-position bins (0-based token position), labelled by left edge: fine at the start of a
# response, where most tokens are, doubling further out.
DEFAULT_POSITION_EDGES: tuple[int, ...] = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# Response-length bins (tokens), labelled by left edge.
DEFAULT_LENGTH_EDGES: tuple[int, ...] = (1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def check_edges(edges: Sequence[float]) -> np.ndarray:
    """``edges`` as a float64 array, checked to be non-empty and strictly increasing."""
    arr = np.asarray(edges, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0 or not np.all(np.diff(arr) > 0):
        raise ValueError(f"bin edges must be a non-empty strictly increasing sequence, got {list(edges)}")
    return arr


def bin_left_edges(values: np.ndarray, edges: Sequence[float]) -> np.ndarray:
    """Label each value with the left edge of its bin ``[edges[i], edges[i+1])``; the last bin is open.

    Values below ``edges[0]`` get ``edges[0]`` (they belong to no bin; positions and lengths never
    are). Returns an array of ``edges``' dtype when it is integral, else float64.
    """
    arr = check_edges(edges)
    index = np.searchsorted(arr, np.asarray(values), side="right") - 1
    np.maximum(index, 0, out=index)
    labels = np.asarray(edges)[index]
    return labels


def quantile_edges(values: np.ndarray, bins: int) -> np.ndarray:
    """Edges of up to ``bins`` quantile bins of the finite ``values`` (duplicates merged), ends included.

    Returns ``[]`` when there are no finite values.
    """
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    if finite.size == 0:
        return np.array([], dtype=np.float64)
    return np.unique(np.quantile(finite, np.linspace(0.0, 1.0, bins + 1)))


def quantile_bin_index(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Index (0 .. len(edges)-2) of the quantile bin of each value; -1 for NaN or outside the edges.

    Bins are ``[e_i, e_{i+1})`` except the last, which includes its right edge.
    """
    vals = np.asarray(values, dtype=np.float64)
    if len(edges) < 2:
        # A single distinct value: everything equal to it is bin 0.
        out = np.full(vals.shape, -1, dtype=np.int64)
        if len(edges) == 1:
            out[vals == edges[0]] = 0
        return out
    index = np.searchsorted(edges, vals, side="right") - 1
    index[vals == edges[-1]] = len(edges) - 2
    index[(index < 0) | (index > len(edges) - 2) | ~np.isfinite(vals)] = -1
    return index
