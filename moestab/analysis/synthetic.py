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


ROUTE_POOL = 1 << 16
"""Random ordered expert sets :func:`route_chain` draws decisions from (each shifted by a random offset)."""


def route_chain(
    tokens: int,
    layers: int,
    top_k: int,
    num_experts: int,
    *,
    length: int,
    flip: float = 0.1,
    reorder: float = 0.05,
    reorder_flipped: bool = False,
    seed: int = 0,
) -> list[np.ndarray]:
    """``length`` int16 route sets ``[tokens, layers, top_k]`` of the same tokens, each changed from the one before
    as :func:`synthetic_routes` changes ``b`` from ``a`` (``flip``: the last slot replaced by an expert none of the
    sets held; ``reorder``: slots reversed), with routes as incompressible as a router's.

    :func:`synthetic_routes`' progressions take 13 bits a decision and repeat within a Parquet page, so zstd packs
    them into ~2.7 B a decision (bench/bench_analysis.py). Here each decision is one of :data:`ROUTE_POOL` random
    ordered sets of ``top_k + length - 1`` distinct experts (the first ``top_k`` are the route, the others the
    replacements of later flips), shifted by a random offset mod ``num_experts``: 23 bits a decision at 128 experts,
    too many distinct decisions for a compressor to find repeats, so the ids cost what uniformly random distinct ids
    do (7.0 B a decision of top-8 of 128 under zstd, as an argsort of random scores measured).
    """
    spare = top_k + length - 1
    if length < 1 or top_k < 1 or spare > num_experts:
        raise ValueError(f"need length >= 1 and top_k + length - 1 <= num_experts, got top_k={top_k}, "
                         f"length={length}, num_experts={num_experts}")
    rng = np.random.default_rng(seed)
    rows = max(1, (1 << 22) // num_experts)  # pool rows a pass: bounded memory for any number of experts
    pool = np.concatenate([np.argsort(rng.random((min(rows, ROUTE_POOL - start), num_experts), np.float32), axis=1)
                           [:, :spare] for start in range(0, ROUTE_POOL, rows)]).astype(np.int32)  # [pool, spare]
    n = tokens * layers
    out = [np.empty((n, top_k), np.int16) for _ in range(length)]  # [decisions, top_k] each
    chunk = 1 << 20
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        drawn = pool[rng.integers(0, ROUTE_POOL, stop - start)]  # [c, spare]
        sets = (drawn + rng.integers(0, num_experts, stop - start, dtype=np.int32)[:, None]) % num_experts
        routes = sets[:, :top_k].astype(np.int16)  # [c, top_k]
        out[0][start:stop] = routes
        for i in range(1, length):
            u = rng.random(stop - start)
            flipped = u < flip
            routes[flipped, top_k - 1] = sets[flipped, top_k + i - 1]
            if reorder_flipped:
                routes[flipped] = routes[flipped][:, ::-1]
            reordered = (u >= flip) & (u < flip + reorder)
            routes[reordered] = routes[reordered][:, ::-1]
            out[i][start:stop] = routes
    return [routes.reshape(tokens, layers, top_k) for routes in out]
