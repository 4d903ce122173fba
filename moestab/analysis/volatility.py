"""Routing volatility between two route sets of the same tokens.

A *route set* is an int16 array ``[tokens, layers, top_k]`` of expert ids, ``-1`` where a route was
not recorded. A *decision* (router) is one (token, layer): the set ``E(t, l)`` of its ``top_k``
experts. Slots are in the router's own order, so decisions are compared as sets. A decision with
any ``-1`` in either route set is *unrecorded* and excluded from every statistic of its layer; a
token counts in token-level statistics when at least one of its layers is recorded, over its
recorded layers. Expert sets are assumed to hold ``top_k`` distinct experts, as a top-k produces.

Metrics (GSPO arXiv 2507.18071 §5.3; R3 arXiv 2510.11370; docs/run-format.md ``routing/...``):

- ``changed``: slot-level changed fraction ``1 - sum |E_a ∩ E_b| / (k * decisions)`` — GSPO's
  "~10% of the activated experts differ" (REFERENCES "Slot-level change").
- ``router_flip``: share of decisions whose expert *sets* differ (R3's "~10% of routers differ").
- ``jaccard_distance``: ``1 - mean |E_a ∩ E_b| / |E_a ∪ E_b|`` over decisions.
- ``token_flip``: share of tokens with a flipped decision in any recorded layer (R3's "94% of
  tokens differ in >= 1 layer").
- ``routers_flipped_per_token``: mean number of flipped decisions per token.

All five are 0 for identical route sets and 1 for disjoint ones. Use them for old->new,
rollout->old, update->old or checkpoint->checkpoint routes alike.

Speed (bench/bench_analysis.py, docs/benchmarks.md): the kernel (:func:`intersection_sizes`)
first counts, per decision, the slots holding the same expert in both route sets (one vectorised
compare over all slots). ``k`` equal slots: unchanged; ``k - 1``: overlap ``k - 1`` (experts are
distinct) — this covers the typical flip, where the k-th and (k+1)-th experts trade places. Only
the remaining decisions (reordered or multi-slot changes) count
``|E_a ∩ E_b| = sum_i sum_j [a_i == b_j]`` with ``k`` vectorised compares over slot-major blocks
that stay in cache. Encoding each set as a ``ceil(E/64)``-word bitmask and counting
``bitwise_count(A & B)`` was measured too: in numpy the encoding alone (a table gather and an OR
per slot) ran at ~25M decisions/s per side, slower than the compares. The aggregation visits only
the decisions whose overlap is not ``k`` (all of them when most changed). Chunks run on a small
thread pool (numpy releases the GIL).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from moestab.analysis.bins import DEFAULT_POSITION_EDGES, bin_left_edges
from moestab.analysis.load import iter_run_routes, load_run_info
from moestab.records import schema

INVALID = 255
"""Value of :func:`intersection_sizes` for an unrecorded decision (a -1 in either route set)."""

# Route-column pairs by name: (a, b); all metrics are symmetric in a and b.
PAIRS: dict[str, tuple[str, str]] = {
    "old_new": (schema.COL_ROUTES_OLD, schema.COL_ROUTES_NEW),
    "rollout_old": (schema.COL_ROUTES_ROLLOUT, schema.COL_ROUTES_OLD),
    "update_old": (schema.COL_ROUTES_UPDATE, schema.COL_ROUTES_OLD),
    "rollout_new": (schema.COL_ROUTES_ROLLOUT, schema.COL_ROUTES_NEW),
}

# Decisions per kernel block: big enough to amortise numpy call overhead (k*k calls per block),
# small enough for the block's int16 slot rows to stay in L2.
DEFAULT_BLOCK = 65_536
# Decisions per aggregation chunk (a unit of work of the thread pool).
_CHUNK_DECISIONS = 1 << 20

METRICS = ("changed", "router_flip", "jaccard_distance", "token_flip", "routers_flipped_per_token")


def check_routes(routes: np.ndarray, name: str = "routes") -> np.ndarray:
    """``routes`` as a C-contiguous int16 ``[tokens, layers, top_k]`` array (no copy if it already is).

    Raises ``ValueError``/``TypeError`` for another rank, a non-integer dtype, ``top_k`` outside
    1..254, or ids outside -1..32767.
    """
    arr = np.asarray(routes)
    if arr.ndim != 3:
        raise ValueError(f"{name} must be [tokens, layers, top_k], got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integer expert ids, got dtype {arr.dtype}")
    if not 1 <= arr.shape[2] <= INVALID - 1:
        raise ValueError(f"{name}: top_k must be in 1..{INVALID - 1}, got {arr.shape[2]}")
    if arr.dtype != np.int16:
        if arr.size and (arr.min() < -1 or arr.max() > np.iinfo(np.int16).max):
            raise ValueError(f"{name}: expert ids must be in -1..32767")
        arr = arr.astype(np.int16)
    return np.ascontiguousarray(arr)


def _uint(nbytes: int) -> np.dtype | None:
    """Unsigned integer dtype of ``nbytes`` bytes, if numpy has one."""
    return {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}.get(nbytes)


def _all_rows(flags: np.ndarray) -> np.ndarray:
    """Row-wise ``all`` of a C-contiguous bool ``[m, w]`` array, as a ``[m]`` bool array.

    For w in 1, 2, 4, 8 the w flags of a row are read as one integer (faster than ``all(axis=1)``).
    """
    word = _uint(flags.shape[1])
    if word is None:
        return flags.all(axis=1)
    ones = np.frombuffer(np.ones(flags.shape[1], np.uint8).tobytes(), word)[0]
    return flags.view(word)[:, 0] == ones


def _row_sums(flags: np.ndarray) -> np.ndarray:
    """Row-wise count of a C-contiguous bool ``[m, w]`` array (w < 256), as uint8 ``[m]``.

    For w in 2, 4, 8 the w flags of a row are one integer; multiplying it by 0x0101... gathers their
    sum in the top byte (no carry reaches it since the sum is < 256).
    """
    w = flags.shape[1]
    word = _uint(w)
    if w == 1:
        return flags[:, 0].view(np.uint8).copy()
    if word is None:
        return flags.sum(axis=1, dtype=np.uint8)
    ones = np.frombuffer(np.ones(w, np.uint8).tobytes(), word)[0]
    return ((flags.view(word)[:, 0] * ones) >> word.type(8 * (w - 1))).astype(np.uint8)


def _intersect_block(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """Write ``|E_a ∩ E_b|`` (or :data:`INVALID`) of each decision of a block into ``out``.

    ``a``, ``b``: int16 ``[m, k]`` C-contiguous; ``out``: uint8 ``[m]``.
    """
    k = a.shape[1]
    # Slots holding the same expert in a and b. All k: the set is unchanged (the usual case). k - 1:
    # exactly one slot i differs and the overlap is k - 1, since a_i cannot equal another b_j = a_j
    # (experts are distinct) — the typical flip, where the k-th and (k+1)-th experts trade places.
    positional = _row_sums(a == b)  # [m]
    np.copyto(out, positional)
    same = positional >= k - 1  # [m] settled
    if a.min(initial=0) < 0 or b.min(initial=0) < 0:
        valid = _all_rows(a >= 0) & _all_rows(b >= 0)  # [m] no -1 in either
        out[~valid] = INVALID
        same |= ~valid
    todo = np.flatnonzero(~same)  # [p] recorded decisions with two or more differing slots
    if todo.size == 0:
        return
    # Make the decisions slot-major so that every compare below runs over a contiguous row: gather
    # the differing ones as whole rows (one 2k-byte item each), or take the whole block when most
    # differ. Ids < 256 (e.g. 128 experts) fit in uint8, which makes the compares ~20% faster.
    most = 2 * todo.size > a.shape[0]
    if most:
        sub_a, sub_b = a, b  # [m, k]
    else:
        row = np.dtype((np.void, 2 * k))
        sub_a = a.view(row)[:, 0][todo].view(np.int16).reshape(-1, k)  # [p, k]
        sub_b = b.view(row)[:, 0][todo].view(np.int16).reshape(-1, k)  # [p, k]
    narrow = np.uint8 if max(sub_a.max(), sub_b.max()) < 256 else np.int16
    at = sub_a.T.astype(narrow, order="C")  # [k, n]
    bt = sub_b.T.astype(narrow, order="C")  # [k, n]
    # |E_a ∩ E_b| = sum_i sum_j [a_i == b_j]: experts are distinct, so each pair matches at most once.
    matches = np.zeros(at.shape, np.uint8)  # [k, n] matches of b_j so far
    equal = np.empty(at.shape, np.bool_)  # [k, n]
    for i in range(k):
        np.equal(at[i], bt, out=equal)  # a_i against every b_j
        matches += equal.view(np.uint8)
    counts = np.add.reduce(matches, axis=0, dtype=np.uint8)  # [n]
    if most:
        np.copyto(out, counts, where=~same)  # unrecorded rows count as `same` and keep INVALID
    else:
        out[todo] = counts


def _workers(threads: int | None) -> int:
    workers = threads if threads is not None else min(4, os.cpu_count() or 1)
    if workers < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    return workers


def _parallel_map(fn, items: Sequence, workers: int) -> list:
    """``[fn(x) for x in items]``, on a thread pool when ``workers > 1`` (numpy releases the GIL)."""
    if workers == 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(min(workers, len(items))) as pool:
        return list(pool.map(fn, items))


def _check_pair(routes_a: np.ndarray, routes_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = check_routes(routes_a, "routes_a")
    b = check_routes(routes_b, "routes_b")
    if a.shape != b.shape:
        raise ValueError(f"route sets differ in shape: {a.shape} vs {b.shape}")
    return a, b


def _intersect_into(a: np.ndarray, b: np.ndarray, out: np.ndarray, block: int) -> None:
    """:func:`intersection_sizes` of ``[n, layers, k]`` routes into ``out`` ``[n * layers]``, one thread."""
    k = a.shape[2]
    flat_a = a.reshape(-1, k)  # [decisions, k]
    flat_b = b.reshape(-1, k)  # [decisions, k]
    for start in range(0, flat_a.shape[0], block):
        stop = start + block
        _intersect_block(flat_a[start:stop], flat_b[start:stop], out[start:stop])


def intersection_sizes(
    routes_a: np.ndarray,
    routes_b: np.ndarray,
    *,
    block: int = DEFAULT_BLOCK,
    threads: int | None = None,
) -> np.ndarray:
    """``|E_a(t, l) ∩ E_b(t, l)|`` for every decision: uint8 ``[tokens, layers]``.

    ``routes_a``, ``routes_b``: ``[tokens, layers, top_k]`` integer arrays of the same shape.
    Unrecorded decisions (a -1 in either) get :data:`INVALID` (255). ``block`` decisions are
    processed at a time on ``threads`` threads (default: up to 4, at most the CPU count).
    """
    a, b = _check_pair(routes_a, routes_b)
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    tokens, layers, k = a.shape
    flat_a = a.reshape(tokens * layers, k)  # [decisions, k]
    flat_b = b.reshape(tokens * layers, k)  # [decisions, k]
    out = np.empty(tokens * layers, np.uint8)  # [decisions]

    def run(start: int) -> None:
        stop = start + block
        _intersect_block(flat_a[start:stop], flat_b[start:stop], out[start:stop])

    _parallel_map(run, range(0, tokens * layers, block), _workers(threads))
    return out.reshape(tokens, layers)


@dataclass(frozen=True)
class VolatilityCounts:
    """Additive counts from which every volatility metric follows; merge partial counts with
    :func:`merge_counts` (e.g. over streamed batches, steps or runs).

    ``decisions``: one row per (keys..., ``layer``): ``overlap_0`` .. ``overlap_{k}`` = number of
    recorded decisions with ``|E_a ∩ E_b| = v``, and ``unrecorded``.
    ``tokens``: one row per (keys...): ``tokens`` (with >= 1 recorded layer), ``tokens_flipped``
    (>= 1 flipped decision), ``routers`` (recorded decisions), ``routers_flipped``.
    """

    top_k: int
    """Experts per decision."""
    keys: tuple[str, ...]
    """Names of the per-token grouping columns (e.g. ``step``, ``minibatch``, ``position_bin``)."""
    decisions: pd.DataFrame
    tokens: pd.DataFrame

    def overlap_columns(self) -> list[str]:
        return [f"overlap_{v}" for v in range(self.top_k + 1)]


def _local_groups(keys: Mapping[str, np.ndarray], tokens: int) -> tuple[np.ndarray, list[tuple]]:
    """Dense group id per token ``[tokens]`` and the key values (a tuple) of each group."""
    if not keys:
        return np.zeros(tokens, np.intp), [()]
    combined = np.zeros(tokens, np.int64)
    radix = 1
    factors = []
    for name, values in keys.items():
        values = np.asarray(values)
        if values.shape != (tokens,):
            raise ValueError(f"key {name!r} must have one value per token ({tokens}), got {values.shape}")
        codes, levels = pd.factorize(values)
        if (codes < 0).any():
            raise ValueError(f"key {name!r} has missing values")
        radix *= max(len(levels), 1)
        if radix >= 2**62:
            raise ValueError("too many distinct key combinations to group by")
        combined = combined * len(levels) + codes
        factors.append((np.asarray(levels), codes))
    group, _ = pd.factorize(combined)  # [tokens] dense group id, in order of first appearance
    first = np.zeros(group.max(initial=-1) + 1, np.intp)
    first[group[::-1]] = np.arange(tokens - 1, -1, -1)  # first token of each group
    columns = [levels[codes[first]].tolist() for levels, codes in factors]
    return group.astype(np.intp, copy=False), list(zip(*columns, strict=True))


def _row_counts(flags: np.ndarray) -> np.ndarray:
    """Row-wise count of a bool ``[tokens, layers]`` array (summing bytes is faster than count_nonzero)."""
    dtype = np.uint8 if flags.shape[1] < 256 else np.int64
    return np.add.reduce(flags.view(np.uint8), axis=1, dtype=dtype)


def _aggregate(inter: np.ndarray, group: np.ndarray, n_groups: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Histogram ``[groups, layers, k + 2]`` of overlaps (bucket k + 1 = unrecorded) and token counts
    ``[groups, 4]`` (tokens, tokens_flipped, routers, routers_flipped) of ``inter`` ``[tokens, layers]``."""
    tokens, n_layers = inter.shape
    flat = inter.reshape(-1)  # [tokens * layers]
    changed = flat != k  # [tokens * layers] flipped or unrecorded
    if np.count_nonzero(changed) * 4 < flat.size:
        # Few changes (the usual case): visit only those decisions.
        where = np.flatnonzero(changed)  # [q]
        values = flat[where]  # [q]
        token = where // n_layers  # [q]
        layer = where - token * n_layers  # [q]
        bucket = np.minimum(values, k + 1).astype(np.intp)  # [q]
        index = (group[token] * n_layers + layer) * (k + 2) + bucket
        hist = np.bincount(index, minlength=n_groups * n_layers * (k + 2)).reshape(n_groups, n_layers, k + 2)
        hist[:, :, k] = np.bincount(group, minlength=n_groups)[:, None] - hist.sum(axis=2)
        flipped = np.bincount(token[values < k], minlength=tokens)  # [tokens] flipped decisions
        unrecorded = np.bincount(token[values == INVALID], minlength=tokens)  # [tokens]
    else:
        bucket = np.minimum(inter, k + 1)  # [tokens, layers]
        base = np.arange(n_layers, dtype=np.intp) * (k + 2)  # [layers]
        index = bucket + base if n_groups == 1 else group[:, None] * (n_layers * (k + 2)) + base + bucket
        hist = np.bincount(index.reshape(-1), minlength=n_groups * n_layers * (k + 2))
        hist = hist.reshape(n_groups, n_layers, k + 2)
        flipped = _row_counts(inter < k)  # [tokens]
        unrecorded = _row_counts(inter == INVALID) if inter.max(initial=0) == INVALID else np.zeros(tokens, np.int64)
    recorded = n_layers - unrecorded  # [tokens]
    per_token = np.stack([recorded > 0, flipped > 0, recorded, flipped], axis=1).astype(np.float64)  # [tokens, 4]
    if n_groups == 1:
        totals = per_token.sum(axis=0, keepdims=True)
    else:
        totals = np.stack([np.bincount(group, weights=col, minlength=n_groups) for col in per_token.T], axis=1)
    return hist.astype(np.int64, copy=False), totals.round().astype(np.int64)


class VolatilityAccumulator:
    """Adds intersection sizes up, batch by batch, into :class:`VolatilityCounts`.

    Holds one histogram row per (group, layer), however many tokens are added.

    >>> acc = VolatilityAccumulator(top_k=8, key_names=("step",))
    >>> acc.add(intersection_sizes(a, b), {"step": steps})  # doctest: +SKIP
    >>> acc.result()  # doctest: +SKIP
    """

    def __init__(self, top_k: int, key_names: Sequence[str] = (), layers: Sequence[int] | None = None) -> None:
        if not 1 <= top_k <= INVALID - 1:
            raise ValueError(f"top_k must be in 1..{INVALID - 1}, got {top_k}")
        if "layer" in key_names:
            raise ValueError("'layer' is reserved for the layer column; rename that key")
        self.top_k = top_k
        self.key_names = tuple(key_names)
        self.layers = None if layers is None else list(layers)
        self._index: dict[tuple, int] = {}
        self._hist = np.zeros((0, 0, top_k + 2), np.int64)  # [groups, layers, k + 2]
        self._tokens = np.zeros((0, 4), np.int64)  # [groups, 4]

    def _groups(
        self, keys: Mapping[str, np.ndarray] | pd.DataFrame | None, tokens: int, n_layers: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per-token local group ids ``[tokens]`` and the global row of each local group ``[groups]``."""
        if self.layers is None:
            self.layers = list(range(n_layers))
        if n_layers != len(self.layers):
            raise ValueError(f"routes have {n_layers} layers, expected {len(self.layers)}")
        if self._hist.shape[1] != n_layers:
            self._hist = np.zeros((0, n_layers, self.top_k + 2), np.int64)
        if isinstance(keys, pd.DataFrame):
            keys = {c: keys[c].to_numpy() for c in keys.columns}
        keys = dict(keys or {})
        if set(keys) != set(self.key_names):
            raise ValueError(f"keys {sorted(keys)} differ from the accumulator's {sorted(self.key_names)}")
        group, key_values = _local_groups({name: keys[name] for name in self.key_names}, tokens)
        ids = np.array([self._index.setdefault(v, len(self._index)) for v in key_values], np.intp)
        grow = len(self._index) - self._hist.shape[0]
        if grow > 0:
            self._hist = np.concatenate([self._hist, np.zeros((grow, n_layers, self.top_k + 2), np.int64)])
            self._tokens = np.concatenate([self._tokens, np.zeros((grow, 4), np.int64)])
        return group, ids

    def _sum(self, parts: list[tuple[np.ndarray, np.ndarray]], ids: np.ndarray) -> None:
        for hist, totals in parts:
            self._hist[ids] += hist  # ids are distinct: a plain fancy add is exact
            self._tokens[ids] += totals

    def add(
        self,
        inter: np.ndarray,
        keys: Mapping[str, np.ndarray] | pd.DataFrame | None = None,
        *,
        threads: int | None = None,
    ) -> None:
        """Add :func:`intersection_sizes` output ``[tokens, layers]`` with per-token ``keys`` (``key_names``)."""
        inter = np.asarray(inter)
        if inter.ndim != 2 or inter.dtype != np.uint8:
            raise ValueError(f"inter must be uint8 [tokens, layers], got {inter.dtype} {inter.shape}")
        k = self.top_k
        tokens, n_layers = inter.shape
        top = inter.max(initial=0)
        if top > k and (top != INVALID or np.any((inter > k) & (inter != INVALID))):
            raise ValueError(f"intersection sizes exceed top_k={k}")
        group, ids = self._groups(keys, tokens, n_layers)
        step = max(1, _CHUNK_DECISIONS // max(n_layers, 1))

        def work(start: int) -> tuple[np.ndarray, np.ndarray]:
            return _aggregate(inter[start : start + step], group[start : start + step], len(ids), k)

        self._sum(_parallel_map(work, range(0, tokens, step), _workers(threads)), ids)

    def add_routes(
        self,
        routes_a: np.ndarray,
        routes_b: np.ndarray,
        keys: Mapping[str, np.ndarray] | pd.DataFrame | None = None,
        *,
        threads: int | None = None,
    ) -> None:
        """Compare two route sets ``[tokens, layers, top_k]`` and add them (= ``add(intersection_sizes(...))``).

        Runs the kernel and the aggregation chunk by chunk on the thread pool, so both are parallel
        and only a chunk's intersection sizes exist at a time.
        """
        a, b = _check_pair(routes_a, routes_b)
        if a.shape[2] != self.top_k:
            raise ValueError(f"routes have top_k={a.shape[2]}, the accumulator {self.top_k}")
        tokens, n_layers, k = a.shape
        group, ids = self._groups(keys, tokens, n_layers)
        step = max(1, _CHUNK_DECISIONS // max(n_layers, 1))

        def work(start: int) -> tuple[np.ndarray, np.ndarray]:
            stop = min(start + step, tokens)
            inter = np.empty((stop - start) * n_layers, np.uint8)  # [chunk * layers]
            _intersect_into(a[start:stop], b[start:stop], inter, DEFAULT_BLOCK)
            return _aggregate(inter.reshape(stop - start, n_layers), group[start:stop], len(ids), k)

        self._sum(_parallel_map(work, range(0, tokens, step), _workers(threads)), ids)

    def result(self) -> VolatilityCounts:
        """The counts added so far (one row per group and layer; no rows before the first ``add``)."""
        k = self.top_k
        n_groups = len(self._index)
        layers = self.layers or []
        key_rows = list(self._index)
        key_frame = (
            pd.DataFrame(key_rows, columns=list(self.key_names))
            if self.key_names
            else pd.DataFrame(index=range(n_groups))
        )
        token_frame = key_frame.copy()
        for i, name in enumerate(("tokens", "tokens_flipped", "routers", "routers_flipped")):
            token_frame[name] = self._tokens[:, i]
        decision_frame = key_frame.loc[np.repeat(np.arange(n_groups), len(layers))].reset_index(drop=True)
        decision_frame["layer"] = np.tile(np.asarray(layers), n_groups)
        flat_hist = self._hist.reshape(n_groups * len(layers), k + 2)
        for v in range(k + 1):
            decision_frame[f"overlap_{v}"] = flat_hist[:, v]
        decision_frame["unrecorded"] = flat_hist[:, k + 1]
        if self.key_names:
            token_frame = token_frame.sort_values(list(self.key_names), kind="stable").reset_index(drop=True)
            decision_frame = decision_frame.sort_values([*self.key_names, "layer"], kind="stable")
            decision_frame = decision_frame.reset_index(drop=True)
        return VolatilityCounts(top_k=k, keys=self.key_names, decisions=decision_frame, tokens=token_frame)


def counts_from_intersections(
    inter: np.ndarray,
    top_k: int,
    keys: Mapping[str, np.ndarray] | pd.DataFrame | None = None,
    layers: Sequence[int] | None = None,
) -> VolatilityCounts:
    """Aggregate :func:`intersection_sizes` output ``[tokens, layers]`` into :class:`VolatilityCounts`.

    ``keys``: per-token grouping columns (each ``[tokens]``); ``layers``: the layer label of each
    column of ``inter`` (default 0..layers-1, e.g. ``RunInfo.recorded_layers``).
    """
    names = list(keys.columns) if isinstance(keys, pd.DataFrame) else list(keys or {})
    n_layers = np.shape(inter)[1] if np.ndim(inter) == 2 else 0
    if layers is not None and len(layers) != n_layers:
        raise ValueError(f"layers must list {n_layers} labels, got {len(layers)}")
    accumulator = VolatilityAccumulator(top_k, names, layers)
    accumulator.add(inter, keys)
    return accumulator.result()


def volatility_counts(
    routes_a: np.ndarray,
    routes_b: np.ndarray,
    keys: Mapping[str, np.ndarray] | pd.DataFrame | None = None,
    layers: Sequence[int] | None = None,
    *,
    threads: int | None = None,
) -> VolatilityCounts:
    """Counts of the volatility between two route sets ``[tokens, layers, top_k]``, grouped by ``keys``.

    ``keys``: per-token grouping columns (each ``[tokens]``); ``layers``: layer labels (default
    0..layers-1). Equal to ``counts_from_intersections(intersection_sizes(a, b), k, keys, layers)``.
    """
    a, b = _check_pair(routes_a, routes_b)
    names = list(keys.columns) if isinstance(keys, pd.DataFrame) else list(keys or {})
    if layers is not None and len(layers) != a.shape[1]:
        raise ValueError(f"layers must list {a.shape[1]} labels, got {len(layers)}")
    accumulator = VolatilityAccumulator(a.shape[2], names, layers)
    accumulator.add_routes(a, b, keys, threads=threads)
    return accumulator.result()


def merge_counts(parts: Iterable[VolatilityCounts]) -> VolatilityCounts:
    """Sum :class:`VolatilityCounts` that share ``top_k`` and ``keys`` (an empty iterable is an error)."""
    parts = list(parts)
    if not parts:
        raise ValueError("merge_counts needs at least one VolatilityCounts")
    first = parts[0]
    for part in parts[1:]:
        if part.top_k != first.top_k or part.keys != first.keys:
            raise ValueError(
                f"cannot merge counts with top_k/keys {part.top_k}/{part.keys} into {first.top_k}/{first.keys}"
            )
    keys = list(first.keys)

    def merge(frames: list[pd.DataFrame], by: list[str]) -> pd.DataFrame:
        frame = pd.concat(frames, ignore_index=True)
        if not by:
            return frame.sum(numeric_only=True).to_frame().T.astype(np.int64)
        return frame.groupby(by, sort=True, as_index=False).sum()

    return VolatilityCounts(
        top_k=first.top_k,
        keys=first.keys,
        decisions=merge([p.decisions for p in parts], [*keys, "layer"]),
        tokens=merge([p.tokens for p in parts], keys),
    )


def volatility_table(counts: VolatilityCounts, by: Sequence[str] = ()) -> pd.DataFrame:
    """Volatility metrics per group of ``by`` (a subset of ``counts.keys`` plus ``"layer"``).

    Columns: ``by``..., ``routers`` (recorded decisions), ``unrecorded``, ``changed``,
    ``router_flip``, ``jaccard_distance``; unless ``layer`` is in ``by`` also ``tokens``,
    ``token_flip`` and ``routers_flipped_per_token``. Groups with nothing recorded get NaN.
    """
    by = list(by)
    unknown = [c for c in by if c not in (*counts.keys, "layer")]
    if unknown:
        raise ValueError(f"cannot group by {unknown}; valid: {[*counts.keys, 'layer']}")
    k = counts.top_k
    overlap = counts.overlap_columns()
    dec = counts.decisions
    dec = (
        dec.groupby(by, sort=True)[[*overlap, "unrecorded"]].sum()
        if by
        else dec[[*overlap, "unrecorded"]].sum().to_frame().T
    )
    n = dec[overlap].to_numpy(np.float64)  # [groups, k + 1]
    v = np.arange(k + 1, dtype=np.float64)  # overlap sizes
    routers = n.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        table = pd.DataFrame(
            {
                "routers": routers.astype(np.int64),
                "unrecorded": dec["unrecorded"].to_numpy(np.int64),
                "changed": 1.0 - (n @ v) / (k * routers),
                "router_flip": 1.0 - n[:, k] / routers,
                "jaccard_distance": 1.0 - (n @ (v / (2 * k - v))) / routers,
            },
            index=dec.index,
        )
    if "layer" not in by:
        tok = counts.tokens
        cols = ["tokens", "tokens_flipped", "routers_flipped"]
        tok = tok.groupby(by, sort=True)[cols].sum() if by else tok[cols].sum().to_frame().T
        tok = tok.reindex(table.index)
        with np.errstate(invalid="ignore", divide="ignore"):
            table["tokens"] = tok["tokens"].to_numpy(np.int64)
            table["token_flip"] = tok["tokens_flipped"].to_numpy(np.float64) / table["tokens"]
            table["routers_flipped_per_token"] = tok["routers_flipped"].to_numpy(np.float64) / table["tokens"]
    table = table.replace([np.inf, -np.inf], np.nan)
    return table.reset_index() if by else table.reset_index(drop=True)


def route_volatility(routes_a: np.ndarray, routes_b: np.ndarray, *, threads: int | None = None) -> dict[str, float]:
    """All volatility metrics between two route sets ``[tokens, layers, top_k]``, over every decision.

    Returns ``changed``, ``router_flip``, ``jaccard_distance``, ``token_flip``,
    ``routers_flipped_per_token`` (NaN if nothing is recorded), ``routers``, ``unrecorded``, ``tokens``.
    """
    row = volatility_table(volatility_counts(routes_a, routes_b, threads=threads)).iloc[0]
    return {name: float(row[name]) for name in row.index}


def volatility_by_layer(
    routes_a: np.ndarray, routes_b: np.ndarray, layers: Sequence[int] | None = None
) -> pd.DataFrame:
    """Per-layer ``changed``, ``router_flip``, ``jaccard_distance`` (one row per layer)."""
    return volatility_table(volatility_counts(routes_a, routes_b, layers=layers), by=["layer"])


RUN_KEYS = ("step", "minibatch", "position_bin")
"""Grouping keys of :func:`run_volatility` counts."""


def run_volatility(
    run: str | Path,
    pair: str = "old_new",
    *,
    steps: Iterable[int] | None = None,
    position_edges: Sequence[int] = DEFAULT_POSITION_EDGES,
    batch_rows: int | None = None,
    threads: int | None = None,
) -> VolatilityCounts | None:
    """Stream a run's per-token tables and count the volatility of route pair ``pair`` (see :data:`PAIRS`).

    Counts are keyed by ``step``, ``minibatch``, ``position_bin`` (left edge of the response-
    position bin of ``position_edges``) and ``layer`` (labels from ``run.json``
    ``model.recorded_layers``). Memory is bounded by ``batch_rows`` (default: see
    :func:`~moestab.analysis.load.default_batch_rows`), not by the size of the run.
    Returns ``None`` if no per-token table with these columns could be read (warnings say why).
    """
    if pair not in PAIRS:
        raise ValueError(f"unknown route pair {pair!r}; valid: {sorted(PAIRS)}")
    info = load_run_info(run)
    if info.top_k is None:
        raise ValueError(f"{info.path / schema.RUN_JSON}: model.top_k is missing; cannot read route columns")
    col_a, col_b = PAIRS[pair]
    others = [schema.COL_STEP, schema.COL_MINIBATCH, schema.COL_POSITION]
    accumulator: VolatilityAccumulator | None = None
    for _, batch, routes in iter_run_routes(run, [col_a, col_b], info.top_k, others, steps, batch_rows):
        routes_a, routes_b = routes[col_a], routes[col_b]  # [rows, layers, top_k] each
        if accumulator is None:
            layers = info.recorded_layers if len(info.recorded_layers) == routes_a.shape[1] else None
            accumulator = VolatilityAccumulator(info.top_k, RUN_KEYS, layers)
        keys = {
            "step": batch.column(schema.COL_STEP).to_numpy(),
            "minibatch": batch.column(schema.COL_MINIBATCH).to_numpy(),
            "position_bin": bin_left_edges(batch.column(schema.COL_POSITION).to_numpy(), position_edges),
        }
        accumulator.add_routes(routes_a, routes_b, keys, threads=threads)
    return None if accumulator is None else accumulator.result()
