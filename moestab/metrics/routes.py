"""Comparing two route sets of the same tokens: the kernel and the one reduction behind every routing-change metric.

A *route set* is an int16 array ``[tokens, layers, top_k]`` of expert ids, ``-1`` where a route was
not recorded. A *decision* (router) is one (token, layer): the set ``E(t, l)`` of its ``top_k``
experts, compared as a set. A decision with any ``-1`` in either route set is *unrecorded* and left
out of every statistic of its layer; a token counts in token-level statistics when at least one of
its layers is recorded, over its recorded layers. Expert sets hold ``top_k`` distinct experts
(:func:`repeated_experts` finds a decision that does not). The streamed
analysis hands the kernel the ids as a run folder stores them instead, uint8
with ``255`` where not recorded (or int16, -1; :func:`check_stored_pair`),
which it compares without widening them.

Metrics (GSPO arXiv 2507.18071 §5.3; R3 arXiv 2510.11370; docs/metrics.md), all from
:func:`change_rates` over the counts of :func:`aggregate_intersections`:

- ``changed``: slot-level changed fraction ``1 - sum |E_a ∩ E_b| / (k * decisions)`` — GSPO's
  "~10% of the activated experts differ" (REFERENCES "Slot-level change").
- ``router_flip``: share of decisions whose expert *sets* differ (R3's "~10% of routers differ").
- ``jaccard_distance``: ``1 - mean |E_a ∩ E_b| / |E_a ∪ E_b|`` over decisions.
- ``token_flip``: share of tokens with a flipped decision in any recorded layer (R3's "94% of
  tokens differ in >= 1 layer").
- ``routers_flipped_per_token``: mean number of flipped decisions per token.

The trainer's step metrics (``moestab.recording.step_metrics``) and the analyzers
(``moestab.analysis.volatility``) both call these functions, so a logged number and an offline
analysis of the same routes are the same computation.

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
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

INVALID = 255
"""Value of :func:`intersection_sizes` for an unrecorded decision (a -1 in either route set)."""

# Decisions per kernel block: big enough to amortise numpy call overhead (k*k calls per block),
# small enough for the block's int16 slot rows to stay in L2.
DEFAULT_BLOCK = 65_536


class RepeatedExpertError(ValueError):
    """Routes in which a decision names an expert twice, found by the comparison (whose overlap would exceed
    ``top_k``): not a top-k decision, so no change metric is defined for it."""


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

    ``a``, ``b``: ``[m, k]`` C-contiguous, both int16 (-1 = not recorded) or both uint8 (255 = not recorded, the run
    format's stored ids: :mod:`moestab.run_folder.route_columns`); ``out``: uint8 ``[m]``.
    """
    k = a.shape[1]
    # Slots holding the same expert in a and b. All k: the set is unchanged (the usual case). k - 1:
    # exactly one slot i differs and the overlap is k - 1, since a_i cannot equal another b_j = a_j
    # (experts are distinct) — the typical flip, where the k-th and (k+1)-th experts trade places.
    positional = _row_sums(a == b)  # [m]
    np.copyto(out, positional)
    same = positional >= k - 1  # [m] settled
    if a.dtype == np.uint8:
        if a.max(initial=0) == 255 or b.max(initial=0) == 255:
            valid = _all_rows(a != 255) & _all_rows(b != 255)  # [m] recorded in both
            out[~valid] = INVALID
            same |= ~valid
    elif a.min(initial=0) < 0 or b.min(initial=0) < 0:
        valid = _all_rows(a >= 0) & _all_rows(b >= 0)  # [m] no -1 in either
        out[~valid] = INVALID
        same |= ~valid
    todo = np.flatnonzero(~same)  # [p] recorded decisions with two or more differing slots
    if todo.size == 0:
        return
    # Make the decisions slot-major so that every compare below runs over a contiguous row: gather
    # the differing ones as whole rows (one item of k ids each), or take the whole block when most differ.
    most = 2 * todo.size > a.shape[0]
    if most:
        sub_a, sub_b = a, b  # [m, k]
    else:
        row = np.dtype((np.void, k * a.itemsize))
        sub_a = a.view(row)[:, 0][todo].view(a.dtype).reshape(-1, k)  # [p, k]
        sub_b = b.view(row)[:, 0][todo].view(b.dtype).reshape(-1, k)  # [p, k]
    # int16 ids < 256 (e.g. 128 experts) compare as uint8, ~20% faster; stored uint8 ids already are.
    narrow = np.uint8 if a.dtype == np.uint8 or max(sub_a.max(), sub_b.max()) < 256 else np.int16
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
    top = int(out[todo].max())
    if top > k:  # only an expert named twice in a decision counts more matches than slots
        raise RepeatedExpertError(f"a decision names an expert twice: {top} slot pairs match where top_k = {k} "
                                  "allows at most k (a top-k decision holds k distinct experts)")


def thread_workers(threads: int | None) -> int:
    workers = threads if threads is not None else min(4, os.cpu_count() or 1)
    if workers < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    return workers


def parallel_map(fn, items: Sequence, workers: int) -> list:
    """``[fn(x) for x in items]``, on a thread pool when ``workers > 1`` (numpy releases the GIL)."""
    if workers == 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(min(workers, len(items))) as pool:
        return list(pool.map(fn, items))


def check_pair(routes_a: np.ndarray, routes_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = check_routes(routes_a, "routes_a")
    b = check_routes(routes_b, "routes_b")
    if a.shape != b.shape:
        raise ValueError(f"route sets differ in shape: {a.shape} vs {b.shape}")
    return a, b


def check_stored_pair(routes_a: np.ndarray, routes_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two route sets ``[tokens, layers, top_k]`` as the run format stores them (``moestab.run_folder`` readers'
    ``stored=True``): both uint8 (255 = not recorded) or both int16 (-1), one shape; C-contiguous and native-endian
    (a copy only where they are not). Expert ids are the reader's to check."""
    arrays = []
    for name, routes in (("routes_a", routes_a), ("routes_b", routes_b)):
        arr = np.asarray(routes)
        if arr.dtype.kind not in "iu" or arr.dtype.itemsize not in (1, 2) or (arr.dtype.itemsize == 1) != (
                arr.dtype.kind == "u"):
            raise TypeError(f"{name}: stored route ids are uint8 or int16, got {arr.dtype}")
        if arr.ndim != 3 or not 1 <= arr.shape[2] <= INVALID - 1:
            raise ValueError(f"{name} must be [tokens, layers, top_k] with top_k in 1..{INVALID - 1}, got {arr.shape}")
        arrays.append(np.ascontiguousarray(arr, arr.dtype.newbyteorder("=")))
    a, b = arrays
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"route sets differ: {a.dtype} {a.shape} vs {b.dtype} {b.shape}")
    return a, b


def intersect_into(a: np.ndarray, b: np.ndarray, out: np.ndarray, block: int) -> None:
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
    a, b = check_pair(routes_a, routes_b)
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    tokens, layers, k = a.shape
    flat_a = a.reshape(tokens * layers, k)  # [decisions, k]
    flat_b = b.reshape(tokens * layers, k)  # [decisions, k]
    out = np.empty(tokens * layers, np.uint8)  # [decisions]

    def run(start: int) -> None:
        stop = start + block
        _intersect_block(flat_a[start:stop], flat_b[start:stop], out[start:stop])

    parallel_map(run, range(0, tokens * layers, block), thread_workers(threads))
    return out.reshape(tokens, layers)




def repeated_experts(routes: np.ndarray, *, block: int = DEFAULT_BLOCK) -> np.ndarray:
    """bool ``[tokens, layers]``: the recorded decisions of int16 ``routes`` ``[tokens, layers, top_k]`` (C-contiguous)
    that name an expert in two slots (a top-k decision holds k distinct experts; an engine's zero-filled rows do not).

    Compares the k (k - 1) / 2 slot pairs over slot-major blocks (uint8 when every id is below 255), which stay in
    cache: strided slot views of the whole array ran at ~15M decisions/s, these at several hundred million."""
    tokens, layers, k = routes.shape
    flat = routes.reshape(-1, k)  # [decisions, k]
    out = np.zeros(tokens * layers, bool)  # [decisions]
    for start in range(0, len(flat), block):
        part = flat[start:start + block]  # [m, k]
        narrow = np.uint8 if part.max(initial=0) < 255 else np.int16  # -1 -> 255: "not recorded" stays apart
        slots = part.T.astype(narrow, order="C")  # [k, m]
        absent = narrow(255) if narrow is np.uint8 else -1
        repeated = out[start:start + block]  # [m] a view: written in place
        same = np.empty(len(part), bool)  # [m]
        recorded = slots != absent if part.min(initial=0) < 0 else None  # [k, m]: two "not recorded" are no repeat
        for i in range(k - 1):
            for j in range(i + 1, k):
                np.equal(slots[i], slots[j], out=same)
                if recorded is not None:
                    same &= recorded[i]
                repeated |= same
    return out.reshape(tokens, layers)


def row_counts(flags: np.ndarray) -> np.ndarray:
    """Row-wise count of a bool ``[tokens, layers]`` array (summing bytes is faster than count_nonzero)."""
    dtype = np.uint8 if flags.shape[1] < 256 else np.int64
    return np.add.reduce(flags.view(np.uint8), axis=1, dtype=dtype)


def _group_sums(flags: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """int64 ``[groups, layers]``: the ``True`` flags of bool ``[tokens, layers]`` summed over each group's tokens.

    Tokens of one group come in runs (a response's position bin, a step's minibatch): each run is summed at once
    (``reduceat``), then the runs into their groups."""
    if n_groups == 1:
        return np.add.reduce(flags.view(np.uint8), axis=0, dtype=np.int64)[None]  # [1, layers]
    starts = np.flatnonzero(np.diff(group, prepend=-1))  # [runs] first token of each run of one group
    per_run = np.add.reduceat(flags.view(np.uint8), starts, axis=0, dtype=np.int64)  # [runs, layers]
    sums = np.zeros((n_groups, flags.shape[1]), np.int64)
    np.add.at(sums, group[starts], per_run)
    return sums


def aggregate_intersections(
    inter: np.ndarray, group: np.ndarray, n_groups: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Histogram ``[groups, layers, k + 2]`` of overlaps (bucket k + 1 = unrecorded) and token counts
    ``[groups, 4]`` (tokens, tokens_flipped, routers, routers_flipped) of ``inter`` ``[tokens, layers]``.

    Overlaps ``k`` (unchanged) and ``k - 1`` (one expert swapped: most changes) are counted as dense sums; the rest
    (reorders, several swaps, unrecorded) are visited one by one, unless they are not rare (then every decision is)."""
    tokens, n_layers = inter.shape
    flat = inter.reshape(-1)  # [tokens * layers]
    size = n_groups * n_layers * (k + 2)
    near = None  # [tokens, layers] decisions with overlap k - 1, when counted apart
    rare = flat != k  # [tokens * layers] flipped or unrecorded
    if np.count_nonzero(rare) * 4 >= flat.size:
        near = inter == k - 1
        rare &= ~near.reshape(-1)
    if np.count_nonzero(rare) * 4 < flat.size:
        # Few decisions left (the usual case): visit only those.
        where = np.flatnonzero(rare)  # [q]
        values = flat[where]  # [q]
        token = where // n_layers  # [q]
        layer = where - token * n_layers  # [q]
        bucket = np.minimum(values, k + 1).astype(np.intp)  # [q]
        index = (group[token] * n_layers + layer) * (k + 2) + bucket
        hist = np.bincount(index, minlength=size).reshape(n_groups, n_layers, k + 2)
        if near is not None:
            hist[:, :, k - 1] += _group_sums(near, group, n_groups)
        hist[:, :, k] = np.bincount(group, minlength=n_groups)[:, None] - hist.sum(axis=2)
        flipped = row_counts(inter < k) if near is not None else np.bincount(token[values < k], minlength=tokens)
        unrecorded = np.bincount(token[values == INVALID], minlength=tokens)  # [tokens]
    else:
        bucket = np.minimum(inter, k + 1)  # [tokens, layers]
        base = np.arange(n_layers, dtype=np.intp) * (k + 2)  # [layers]
        index = bucket + base if n_groups == 1 else group[:, None] * (n_layers * (k + 2)) + base + bucket
        hist = np.bincount(index.reshape(-1), minlength=size).reshape(n_groups, n_layers, k + 2)
        flipped = row_counts(inter < k)  # [tokens]
        unrecorded = row_counts(inter == INVALID) if inter.max(initial=0) == INVALID else np.zeros(tokens, np.int64)
    recorded = n_layers - unrecorded  # [tokens]
    per_token = np.stack([recorded > 0, flipped > 0, recorded, flipped], axis=1).astype(np.float64)  # [tokens, 4]
    if n_groups == 1:
        totals = per_token.sum(axis=0, keepdims=True)
    else:
        totals = np.stack([np.bincount(group, weights=col, minlength=n_groups) for col in per_token.T], axis=1)
    return hist.astype(np.int64, copy=False), totals.round().astype(np.int64)


CHANGE_METRICS = ("changed", "router_flip", "jaccard_distance", "token_flip", "routers_flipped_per_token")
"""Names of :func:`change_rates`' metrics."""


def change_rates(overlaps: np.ndarray, top_k: int, token_totals: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The routing-change metrics from counts: the one definition of every ``changed`` / ``*_flip`` number.

    Args:
        overlaps: ``[..., top_k + 1]`` (extra trailing buckets ignored): number of recorded decisions
            with ``|E_a ∩ E_b| = v`` for ``v = 0..top_k`` (from :func:`aggregate_intersections`).
        top_k: experts per decision.
        token_totals: ``[..., 4]`` = (tokens with a recorded layer, tokens with a flip, recorded
            decisions, flipped decisions), over the same groups without the layer axis; enables
            ``token_flip`` and ``routers_flipped_per_token``.

    Returns:
        ``routers`` (recorded decisions), ``changed``, ``router_flip``, ``jaccard_distance`` with the
        leading shape of ``overlaps``; with ``token_totals`` also ``tokens``, ``token_flip``,
        ``routers_flipped_per_token``. NaN where nothing was recorded.
    """
    n = np.asarray(overlaps, dtype=np.float64)[..., : top_k + 1]  # [..., k + 1]
    v = np.arange(top_k + 1, dtype=np.float64)  # overlap sizes
    routers = n.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = {
            "routers": routers,
            "changed": 1.0 - (n @ v) / (top_k * routers),
            "router_flip": 1.0 - n[..., top_k] / routers,
            "jaccard_distance": 1.0 - (n @ (v / (2 * top_k - v))) / routers,
        }
        if token_totals is not None:
            totals = np.asarray(token_totals, dtype=np.float64)  # [..., 4]
            out["tokens"] = totals[..., 0]
            out["token_flip"] = totals[..., 1] / totals[..., 0]
            out["routers_flipped_per_token"] = totals[..., 3] / totals[..., 0]
    return out


def token_changes(inter: np.ndarray, top_k: int) -> np.ndarray:
    """float64 ``[tokens]``: each token's ``changed`` over its recorded layers (share of its slots whose expert the
    other side did not choose), NaN for a token with no layer recorded on both sides; ``inter`` ``[tokens, layers]``
    from :func:`intersection_sizes`."""
    if inter.max(initial=0) <= top_k:  # every decision recorded (the usual case): plain row sums
        n = np.full(inter.shape[0], inter.shape[1], np.int64)  # [tokens]
        kept = np.add.reduce(inter, axis=1, dtype=np.int64)  # [tokens]
    else:
        known = inter <= top_k  # [tokens, layers]
        n = row_counts(known).astype(np.int64)  # [tokens]
        kept = np.add.reduce(np.where(known, inter, 0), axis=1, dtype=np.int64)  # [tokens]
    with np.errstate(invalid="ignore", divide="ignore"):
        return 1.0 - kept / (top_k * n)


def route_change(
    inter: np.ndarray, top_k: int, groups: np.ndarray | None = None, n_groups: int = 1, *, by_token: bool = False,
) -> dict[str, np.ndarray]:
    """:func:`change_rates` of :func:`intersection_sizes` output ``inter`` ``[tokens, layers]``, per group.

    ``groups``: ``[tokens]`` group id in ``0..n_groups-1`` (default: one group). Every metric has
    shape ``[n_groups]``; the per-layer ``changed`` and ``router_flip`` are added as
    ``changed_by_layer`` / ``router_flip_by_layer`` ``[n_groups, layers]``; with ``by_token``,
    ``changed_by_token`` ``[tokens]`` (:func:`token_changes`).
    """
    group = np.zeros(inter.shape[0], np.intp) if groups is None else np.asarray(groups, np.intp)
    hist, totals = aggregate_intersections(inter, group, n_groups, top_k)  # [g, layers, k + 2], [g, 4]
    out = _change_and_by_layer(hist, totals, top_k)
    if by_token:
        out["changed_by_token"] = token_changes(inter, top_k)
    return out


def _change_and_by_layer(hist: np.ndarray, totals: np.ndarray, top_k: int) -> dict[str, np.ndarray]:
    """:func:`change_rates` of the counts of :func:`aggregate_intersections`, with the per-layer ``changed`` and
    ``router_flip`` as ``changed_by_layer`` / ``router_flip_by_layer``."""
    out = change_rates(hist.sum(axis=1), top_k, totals)
    by_layer = change_rates(hist, top_k)
    out["changed_by_layer"] = by_layer["changed"]
    out["router_flip_by_layer"] = by_layer["router_flip"]
    return out


CHUNK_DECISIONS = 1 << 19
"""Decisions per chunk of :func:`route_change_of` (its overlaps, one byte each, stay in L2 for the aggregation)."""


def route_change_of(
    routes_a: np.ndarray, routes_b: np.ndarray, *, threads: int | None = None, chunk_tokens: int | None = None,
    by_token: bool = False,
) -> dict[str, np.ndarray]:
    """:func:`route_change` of :func:`intersection_sizes` of two route sets ``[tokens, layers, top_k]`` (one group),
    computed chunk by chunk of ``chunk_tokens`` tokens (default: :data:`CHUNK_DECISIONS` decisions): each chunk's
    overlaps are aggregated by :func:`aggregate_intersections` (and, with ``by_token``, :func:`token_changes`) while
    they are in cache, chunks run on ``threads`` threads, and the counts are summed. The same numbers as the two
    calls, without the ``[tokens, layers]`` array; what a per-step diagnostics call uses (docs/benchmarks.md,
    "Diagnostics for any trainer")."""
    a, b = check_pair(routes_a, routes_b)
    tokens, layers, k = a.shape
    chunk = chunk_tokens if chunk_tokens is not None else max(1, CHUNK_DECISIONS // max(layers, 1))
    if chunk < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    per_token = np.empty(tokens if by_token else 0)  # [tokens] changed_by_token, filled chunk by chunk

    def run(start: int) -> tuple[np.ndarray, np.ndarray]:
        stop = min(start + chunk, tokens)
        inter = np.empty((stop - start) * layers, np.uint8).reshape(stop - start, layers)  # [c, layers]
        intersect_into(a[start:stop], b[start:stop], inter.reshape(-1), DEFAULT_BLOCK)
        if by_token:
            per_token[start:stop] = token_changes(inter, k)
        return aggregate_intersections(inter, np.zeros(stop - start, np.intp), 1, k)

    hist = np.zeros((1, layers, k + 2), np.int64)  # [1, layers, k + 2]
    totals = np.zeros((1, 4), np.int64)  # [1, 4]
    for part_hist, part_totals in parallel_map(run, range(0, tokens, chunk), thread_workers(threads)):
        hist += part_hist
        totals += part_totals
    out = _change_and_by_layer(hist, totals, k)
    if by_token:
        out["changed_by_token"] = per_token
    return out
