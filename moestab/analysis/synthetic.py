"""Synthetic route sets with a known amount of change, for benchmarks and tests.

Expert sets are drawn as arithmetic progressions ``(offset + stride * j) mod E`` with ``stride``
coprime to ``E``: ``top_k`` distinct experts per decision, generated in a few vectorised passes
(fast enough for step-sized tables of ~50M decisions).
"""

from __future__ import annotations

import math

import numpy as np


def synthetic_routes(
    tokens: int,
    layers: int,
    top_k: int,
    num_experts: int,
    *,
    flip: float = 0.1,
    reorder: float = 0.05,
    reorder_flipped: bool = False,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Two int16 route sets ``[tokens, layers, top_k]`` of the same tokens.

    In ``b``, a fraction ``flip`` of decisions (chosen independently) has its last slot replaced by an
    expert outside the set (one changed slot: overlap ``top_k - 1``; the k-th and (k+1)-th experts
    trade places, as in a near-tie flip), and a fraction ``reorder`` of the others has its slots
    reversed (same set, other order). ``reorder_flipped`` also reverses the flipped decisions.
    Everything else is identical.
    """
    if not 1 <= top_k < num_experts:
        raise ValueError(f"need 1 <= top_k < num_experts, got top_k={top_k}, num_experts={num_experts}")
    rng = np.random.default_rng(seed)
    n = tokens * layers
    units = np.array([s for s in range(1, num_experts) if math.gcd(s, num_experts) == 1], np.int32)
    offset = rng.integers(0, num_experts, n, dtype=np.int32)  # [decisions]
    stride = units[rng.integers(0, len(units), n)]  # [decisions]
    slots = np.arange(top_k + 1, dtype=np.int32)  # the (k+1)-th term is the replacement expert
    a = np.empty((n, top_k), np.int16)  # [decisions, top_k]
    b = np.empty((n, top_k), np.int16)
    chunk = 1 << 20
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        prog = (offset[start:stop, None] + stride[start:stop, None] * slots) % num_experts  # [c, k+1]
        a[start:stop] = prog[:, :top_k]
        b[start:stop] = prog[:, :top_k]
        u = rng.random(stop - start)
        flipped = u < flip
        b[start:stop][flipped, top_k - 1] = prog[flipped, top_k]
        if reorder_flipped:
            b[start:stop][flipped] = b[start:stop][flipped][:, ::-1]
        reordered = (u >= flip) & (u < flip + reorder)
        b[start:stop][reordered] = b[start:stop][reordered][:, ::-1]
    return a.reshape(tokens, layers, top_k), b.reshape(tokens, layers, top_k)
