"""Routing volatility between two route sets of the same tokens, grouped (by step, minibatch, position, layer).

The comparison itself, and the formulas of every metric (``changed``, ``router_flip``,
``jaccard_distance``, ``token_flip``, ``routers_flipped_per_token``), are
:mod:`moestab.metrics.routes`; this module adds up its counts over streamed batches and groups,
and reads them from run folders. Use it for old->new, rollout->old, update->old or
checkpoint->checkpoint routes alike (:data:`PAIRS`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from moestab.analysis.bins import DEFAULT_POSITION_EDGES, bin_left_edges
from moestab.metrics.routes import (
    CHANGE_METRICS,
    DEFAULT_BLOCK,
    INVALID,
    RepeatedExpertError,
    aggregate_intersections,
    change_rates,
    check_pair,
    check_routes,
    check_stored_pair,
    intersect_into,
    intersection_sizes,
    parallel_map,
    thread_workers,
)
from moestab.run_folder import schema
from moestab.run_folder.errors import RunFileError, Skipped, skip
from moestab.run_folder.prefetch import prefetch
from moestab.run_folder.reader import iter_run_routes, read_run_info

__all__ = [
    "INVALID",
    "METRICS",
    "PAIRS",
    "RUN_KEYS",
    "RepeatedExpertError",
    "VolatilityAccumulator",
    "VolatilityCounts",
    "check_routes",
    "counts_from_intersections",
    "intersection_sizes",
    "merge_counts",
    "route_volatility",
    "run_volatility",
    "volatility_by_layer",
    "volatility_counts",
    "volatility_table",
]

PAIRS = schema.ROUTE_PAIRS
"""Route-column pairs by name (see :data:`moestab.run_folder.schema.ROUTE_PAIRS`); metrics are symmetric."""

METRICS = CHANGE_METRICS

# Decisions per aggregation chunk (a unit of work of the thread pool).
_CHUNK_DECISIONS = 1 << 20


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
    ) -> tuple[np.ndarray, list[tuple]]:
        """Per-token local group ids ``[tokens]`` and the key values of each local group."""
        layers = self.layers if self.layers is not None else list(range(n_layers))
        if n_layers != len(layers):
            raise ValueError(f"routes have {n_layers} layers, expected {len(layers)}")
        if isinstance(keys, pd.DataFrame):
            keys = {c: keys[c].to_numpy() for c in keys.columns}
        keys = dict(keys or {})
        if set(keys) != set(self.key_names):
            raise ValueError(f"keys {sorted(keys)} differ from the accumulator's {sorted(self.key_names)}")
        return _local_groups({name: keys[name] for name in self.key_names}, tokens)

    def _sum(self, parts: list[tuple[np.ndarray, np.ndarray]], key_values: list[tuple], n_layers: int) -> None:
        """Add the counts of local groups ``key_values`` to their global rows, created as needed: only once the
        counts exist, so that routes refused on the way (``RepeatedExpertError``) leave the accumulator as it was."""
        if self.layers is None:
            self.layers = list(range(n_layers))
        if self._hist.shape[1] != n_layers:
            self._hist = np.zeros((0, n_layers, self.top_k + 2), np.int64)
        ids = np.array([self._index.setdefault(v, len(self._index)) for v in key_values], np.intp)
        grow = len(self._index) - self._hist.shape[0]
        if grow > 0:
            self._hist = np.concatenate([self._hist, np.zeros((grow, n_layers, self.top_k + 2), np.int64)])
            self._tokens = np.concatenate([self._tokens, np.zeros((grow, 4), np.int64)])
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
        group, key_values = self._groups(keys, tokens, n_layers)
        step = max(1, _CHUNK_DECISIONS // max(n_layers, 1))

        def work(start: int) -> tuple[np.ndarray, np.ndarray]:
            return aggregate_intersections(inter[start : start + step], group[start : start + step], len(key_values), k)

        self._sum(parallel_map(work, range(0, tokens, step), thread_workers(threads)), key_values, n_layers)

    def add_routes(
        self,
        routes_a: np.ndarray,
        routes_b: np.ndarray,
        keys: Mapping[str, np.ndarray] | pd.DataFrame | None = None,
        *,
        threads: int | None = None,
        stored: bool = False,
    ) -> None:
        """Compare two route sets ``[tokens, layers, top_k]`` and add them (= ``add(intersection_sizes(...))``).

        Runs the kernel and the aggregation chunk by chunk on the thread pool, so both are parallel
        and only a chunk's intersection sizes exist at a time. ``stored``: the routes are the run format's stored
        ids (uint8 with 255 = not recorded, or int16; :func:`~moestab.metrics.routes.check_stored_pair`), compared
        as they are (the reader's ``stored=True``).
        """
        a, b = check_stored_pair(routes_a, routes_b) if stored else check_pair(routes_a, routes_b)
        if a.shape[2] != self.top_k:
            raise ValueError(f"routes have top_k={a.shape[2]}, the accumulator {self.top_k}")
        tokens, n_layers, k = a.shape
        group, key_values = self._groups(keys, tokens, n_layers)
        step = max(1, _CHUNK_DECISIONS // max(n_layers, 1))

        def work(start: int) -> tuple[np.ndarray, np.ndarray]:
            stop = min(start + step, tokens)
            inter = np.empty((stop - start) * n_layers, np.uint8)  # [chunk * layers]
            intersect_into(a[start:stop], b[start:stop], inter, DEFAULT_BLOCK)
            return aggregate_intersections(inter.reshape(stop - start, n_layers), group[start:stop],
                                           len(key_values), k)

        self._sum(parallel_map(work, range(0, tokens, step), thread_workers(threads)), key_values, n_layers)

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
    a, b = check_pair(routes_a, routes_b)
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
    rates = change_rates(dec[overlap].to_numpy(np.int64), k)  # each [groups]
    table = pd.DataFrame(
        {
            "routers": rates["routers"].astype(np.int64),
            "unrecorded": dec["unrecorded"].to_numpy(np.int64),
            "changed": rates["changed"],
            "router_flip": rates["router_flip"],
            "jaccard_distance": rates["jaccard_distance"],
        },
        index=dec.index,
    )
    if "layer" not in by:
        tok = counts.tokens
        cols = ["tokens", "tokens_flipped", "routers", "routers_flipped"]
        tok = tok.groupby(by, sort=True)[cols].sum() if by else tok[cols].sum().to_frame().T
        tok = tok.reindex(table.index)
        token_rates = change_rates(dec[overlap].to_numpy(np.int64), k, tok[cols].to_numpy(np.float64))
        table["tokens"] = tok["tokens"].to_numpy(np.int64)
        table["token_flip"] = token_rates["token_flip"]
        table["routers_flipped_per_token"] = token_rates["routers_flipped_per_token"]
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
    skipped: list[Skipped] | None = None,
    read_ahead: int = 1,
) -> VolatilityCounts | None:
    """Stream a run's per-token tables and count the volatility of route pair ``pair`` (see :data:`PAIRS`).

    Counts are keyed by ``step``, ``minibatch``, ``position_bin`` (left edge of the response-
    position bin of ``position_edges``) and ``layer`` (labels from ``run.json``
    ``model.recorded_layers``). Memory is bounded by ``batch_rows`` (default: see
    :func:`~moestab.run_folder.reader.default_batch_rows`), not by the size of the run.
    Returns ``None`` if no per-token table could be read; unreadable parts go to ``skipped``
    (raise with ``skipped=None``). ``read_ahead`` batches are read and decoded ahead on a background thread
    while this one counts (:func:`~moestab.run_folder.prefetch.prefetch`; 0: none).
    """
    if pair not in PAIRS:
        raise ValueError(f"unknown route pair {pair!r}; valid: {sorted(PAIRS)}")
    info = read_run_info(run)
    col_a, col_b = PAIRS[pair]
    others = [schema.COL_STEP, schema.COL_MINIBATCH, schema.COL_POSITION]
    accumulator: VolatilityAccumulator | None = None
    batches = iter_run_routes(run, [col_a, col_b], info.top_k, others, steps, batch_rows, skipped,
                              num_experts=info.num_experts, stored=True)
    bad: set[int] = set()  # steps whose table named an expert twice in a decision: left out from there on
    for step, batch, routes in prefetch(batches, read_ahead):
        if step in bad:
            continue
        routes_a, routes_b = routes[col_a], routes[col_b]  # [rows, layers, top_k] each
        if accumulator is None:
            layers = info.recorded_layers if len(info.recorded_layers) == routes_a.shape[1] else None
            accumulator = VolatilityAccumulator(info.top_k, RUN_KEYS, layers)
        keys = {
            "step": batch.column(schema.COL_STEP).to_numpy(),
            "minibatch": batch.column(schema.COL_MINIBATCH).to_numpy(),
            "position_bin": bin_left_edges(batch.column(schema.COL_POSITION).to_numpy(), position_edges),
        }
        try:
            accumulator.add_routes(routes_a, routes_b, keys, threads=threads, stored=True)
        except RepeatedExpertError as exc:  # found before anything of the batch was added
            bad.add(step)
            where = Path(run) / schema.tokens_file(step)
            skip(skipped, RunFileError(where, f"malformed route column {col_a} or {col_b} ({exc}); the rest of the "
                                              "file is left out"))
    return None if accumulator is None else accumulator.result()
