"""Attribution: how much of the ratio noise and clipping coincides with routing flips.

A token is *flipped* when, in at least one recorded layer, its expert set differs between two
route sets (``update_old`` by default: ``routes_update`` vs ``routes_old``, the routes that produced
``logp_update`` and ``logp_old``, i.e. exactly the two sides of ``log w`` — under R2, R3 and TRR both sides
replay the same routes, so no token is flipped; or any pair of :data:`moestab.run_folder.schema.ROUTE_PAIRS`).
Tokens with no recorded layer are left out. The first minibatch of every step updates from pi_old's own weights,
so its ``log w`` is exactly 0 whatever the routing: it is kept apart (``by_minibatch``) and the flipped-vs-unflipped
comparison of ``groups`` / ``explained`` is over minibatches 2..n only (pooling it in put every first-minibatch token
in the unflipped group at ``|log w| = 0`` and inflated the contrast). Compared between flipped and unflipped tokens:

- ``|log w|`` (mean, median, q0.99) and the clipped share;
- for *clipped* and *extreme* tokens (``|log w| > ln 2``, the F(2) threshold of REFERENCES
  "Train-inference mismatch"): the share that had a flip, against the base flip rate (a lift above 1
  means flips explain part of them);
- per router (token x layer): flip rate against ``margin_old``, the gap between the k-th and
  (k+1)-th router score under pi_old, in quantile bins — near-ties should flip more.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from moestab.analysis.bins import quantile_bin_index, quantile_edges
from moestab.metrics.kl import EXTREME_LOG_RATIO
from moestab.metrics.routes import INVALID, intersection_sizes
from moestab.run_folder import RunFolder, schema
from moestab.run_folder.errors import RunFileError, Skipped, skip
from moestab.run_folder.reader import (
    iter_run_batches,
    iter_run_routes,
    list_token_files,
    margin_array,
    open_token_file,
    read_run_info,
)

PAIRS = schema.ROUTE_PAIRS

def router_flips(routes_a: np.ndarray, routes_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per decision: ``flipped`` (expert sets differ) and ``recorded`` (no -1 in either), bool ``[tokens, layers]``."""
    inter = intersection_sizes(routes_a, routes_b)  # [tokens, layers]
    recorded = inter != INVALID
    return recorded & (inter < np.shape(routes_a)[2]), recorded


def flip_groups(log_w: np.ndarray, clipped: np.ndarray, flipped: np.ndarray) -> pd.DataFrame:
    """``|log w|`` and clipping of flipped vs unflipped tokens (all ``[tokens]`` arrays).

    One row per group ``flipped`` = False, True and ``"all"``: ``tokens``, ``mean_abs_log_w``,
    ``median_abs_log_w``, ``q99_abs_log_w``, ``clip_frac``, ``extreme_frac`` (NaN if empty).
    """
    abs_w = np.abs(np.asarray(log_w, dtype=np.float64))
    clipped = np.asarray(clipped, dtype=bool)
    flipped = np.asarray(flipped, dtype=bool)
    if not abs_w.shape == clipped.shape == flipped.shape:
        raise ValueError(f"shapes differ: log_w {abs_w.shape}, clipped {clipped.shape}, flipped {flipped.shape}")
    rows = []
    for label, select in ((False, ~flipped), (True, flipped), ("all", np.ones_like(flipped))):
        w = abs_w[select]
        empty = w.size == 0
        rows.append(
            {
                "flipped": label,
                "tokens": int(w.size),
                "mean_abs_log_w": np.nan if empty else float(np.nanmean(w)),
                "median_abs_log_w": np.nan if empty else float(np.nanmedian(w)),
                "q99_abs_log_w": np.nan if empty else float(np.nanquantile(w, 0.99)),
                "clip_frac": np.nan if empty else float(clipped[select].mean()),
                "extreme_frac": np.nan if empty else float((w > EXTREME_LOG_RATIO).mean()),
            }
        )
    return pd.DataFrame(rows)


def explained_by_flips(log_w: np.ndarray, clipped: np.ndarray, flipped: np.ndarray) -> pd.DataFrame:
    """How much of the clipped / extreme tokens had a routing flip, against the base rate.

    One row per event (``clipped``, ``extreme``): ``events`` (tokens with it), ``flip_rate_in_event``
    ``P(flip | event)``, ``base_flip_rate`` ``P(flip)``, ``lift`` (their ratio), ``event_rate_flipped``
    ``P(event | flip)`` and ``event_rate_unflipped`` ``P(event | no flip)``.
    """
    abs_w = np.abs(np.asarray(log_w, dtype=np.float64))
    flipped = np.asarray(flipped, dtype=bool)
    events = {"clipped": np.asarray(clipped, dtype=bool), "extreme": abs_w > EXTREME_LOG_RATIO}
    n = flipped.size
    base = flipped.mean() if n else np.nan
    rows = []
    for name, event in events.items():
        count = int(event.sum())
        in_event = flipped[event].mean() if count else np.nan
        rows.append(
            {
                "event": name,
                "events": count,
                "flip_rate_in_event": float(in_event),
                "base_flip_rate": float(base),
                "lift": float(in_event / base) if count and base > 0 else np.nan,
                "event_rate_flipped": float(event[flipped].mean()) if flipped.any() else np.nan,
                "event_rate_unflipped": float(event[~flipped].mean()) if (~flipped).any() else np.nan,
            }
        )
    return pd.DataFrame(rows)


MARGIN_COLUMNS = ["bin", "margin_low", "margin_high", "routers", "flipped", "flip_rate"]


def _margin_table(flips: np.ndarray, counts: np.ndarray, edges: np.ndarray) -> pd.DataFrame:
    """Rows of :func:`flip_rate_by_margin` from per-bin flip and decision counts."""
    if len(edges) == 0:
        return pd.DataFrame(columns=MARGIN_COLUMNS)
    # One distinct margin value makes a single bin [e, e].
    lows, highs = (edges[:-1], edges[1:]) if len(edges) > 1 else (edges, edges)
    n = len(lows)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = flips[:n] / counts[:n]
    return pd.DataFrame(
        {
            "bin": np.arange(n),
            "margin_low": lows,
            "margin_high": highs,
            "routers": counts[:n].astype(np.int64),
            "flipped": flips[:n].round().astype(np.int64),
            "flip_rate": rate,
        }
    )


def flip_rate_by_margin(
    router_flipped: np.ndarray, recorded: np.ndarray, margin: np.ndarray, bins: int = 10
) -> pd.DataFrame:
    """Router flip rate per quantile bin of ``margin`` (all ``[tokens, layers]``).

    Decisions not ``recorded`` or with a NaN margin are left out. Columns: ``bin``, ``margin_low``,
    ``margin_high`` (bin edges; the last bin includes its right edge), ``routers``, ``flipped``,
    ``flip_rate``. Ties in the margin can merge quantile bins, so there may be fewer than ``bins``.
    """
    margin = np.asarray(margin, dtype=np.float64)
    keep = np.asarray(recorded, dtype=bool) & np.isfinite(margin)
    edges = quantile_edges(margin[keep], bins)
    index = quantile_bin_index(margin[keep], edges)
    size = max(len(edges) - 1, 1)
    flips = np.bincount(index[index >= 0], weights=np.asarray(router_flipped)[keep][index >= 0], minlength=size)
    counts = np.bincount(index[index >= 0], minlength=size).astype(np.float64)
    return _margin_table(flips, counts, edges)


def flip_groups_by_minibatch(
    log_w: np.ndarray, clipped: np.ndarray, flipped: np.ndarray, minibatch: np.ndarray
) -> pd.DataFrame:
    """:func:`flip_groups` per minibatch index (0-based, column ``minibatch`` first), all ``[tokens]`` arrays."""
    minibatch = np.asarray(minibatch)
    if minibatch.shape != np.shape(log_w):
        raise ValueError(f"shapes differ: log_w {np.shape(log_w)}, minibatch {minibatch.shape}")
    parts = [flip_groups(log_w[minibatch == m], clipped[minibatch == m], flipped[minibatch == m]).assign(minibatch=m)
             for m in np.unique(minibatch)]
    if not parts:
        return pd.DataFrame(columns=["minibatch", *flip_groups(log_w, clipped, flipped).columns])
    frame = pd.concat(parts, ignore_index=True)
    return frame[["minibatch", *[c for c in frame.columns if c != "minibatch"]]]


@dataclass(frozen=True)
class Attribution:
    """Result of :func:`run_attribution`."""

    pair: str
    """Route pair that defines a flip (a key of :data:`moestab.run_folder.schema.ROUTE_PAIRS`)."""
    groups: pd.DataFrame
    """:func:`flip_groups` over the run's recorded tokens of minibatches 2..n (the first one's log w is 0)."""
    explained: pd.DataFrame
    """:func:`explained_by_flips` over the same tokens as ``groups``."""
    by_minibatch: pd.DataFrame
    """:func:`flip_groups_by_minibatch` over every recorded token, the first minibatch (index 0) included."""
    by_margin: pd.DataFrame
    """:func:`flip_rate_by_margin` over the run's routers (empty without ``margin_old``)."""


def run_attribution(
    run: str | Path,
    pair: str = "update_old",
    *,
    margin_bins: int = 10,
    margin_sample: int = 1_000_000,
    steps: Iterable[int] | None = None,
    batch_rows: int | None = None,
    skipped: list[Skipped] | None = None,
) -> Attribution | None:
    """Stream a run's per-token tables into an :class:`Attribution` (``None`` if none is readable).

    Token arrays (``log_w``, ``clipped``, flip flag: a few bytes a token) are kept; routes are
    streamed. Margin quantile edges come from a first pass over ``margin_old`` that keeps an evenly
    strided sample of about ``margin_sample`` decisions; the counts per bin (second pass) are exact.
    Unreadable parts go to ``skipped`` (raise with ``skipped=None``).
    """
    if pair not in PAIRS:
        raise ValueError(f"unknown route pair {pair!r}; valid: {sorted(PAIRS)}")
    info = read_run_info(run)
    steps = None if steps is None else list(steps)
    col_a, col_b = PAIRS[pair]

    edges = np.array([], dtype=np.float64)
    if margin_bins > 0:
        sample = _sample_margins(run, steps, batch_rows, margin_sample)
        edges = quantile_edges(sample, margin_bins) if sample.size else edges

    log_w, clipped, flipped, minibatch = [], [], [], []
    size = max(len(edges) - 1, 1)
    margin_flips = np.zeros(size)
    margin_counts = np.zeros(size)
    others = [schema.COL_LOG_W, schema.COL_CLIPPED, schema.COL_MINIBATCH]
    with_margin = edges.size > 0
    if with_margin:
        others.append(schema.COL_MARGIN_OLD)
    bad_margin: set[int] = set()
    batches = iter_run_routes(run, [col_a, col_b], info.top_k, others, steps, batch_rows, skipped,
                              num_experts=info.num_experts)
    for step, batch, routes in batches:
        router_flipped, recorded = router_flips(routes[col_a], routes[col_b])  # [rows, layers] each
        keep = recorded.any(axis=1)  # [rows] tokens with a recorded layer
        log_w.append(batch.column(schema.COL_LOG_W).to_numpy(zero_copy_only=False)[keep])
        clipped.append(batch.column(schema.COL_CLIPPED).to_numpy(zero_copy_only=False)[keep])
        flipped.append(router_flipped.any(axis=1)[keep])
        minibatch.append(batch.column(schema.COL_MINIBATCH).to_numpy(zero_copy_only=False)[keep])
        if not with_margin or step in bad_margin:
            continue
        margin = margin_array(batch.column(schema.COL_MARGIN_OLD)).astype(np.float64)  # [rows, layers]
        if margin.shape != recorded.shape:
            bad_margin.add(step)
            where = RunFolder(run).tokens_file(step)
            problem = f"margin_old has {margin.shape[1]} layers, routes {recorded.shape[1]}; its margins are left out"
            skip(skipped, RunFileError(where, problem))
            continue
        ok = recorded & np.isfinite(margin)
        index = quantile_bin_index(margin[ok], edges)
        inside = index >= 0
        margin_flips += np.bincount(index[inside], weights=router_flipped[ok][inside], minlength=size)
        margin_counts += np.bincount(index[inside], minlength=size)
    if not log_w:
        return None
    log_w_all = np.concatenate(log_w)
    clipped_all = np.concatenate(clipped).astype(bool)
    flipped_all = np.concatenate(flipped)
    minibatch_all = np.concatenate(minibatch)
    later = minibatch_all > 0  # the first minibatch's log w is 0 by construction
    by_margin = (
        _margin_table(margin_flips, margin_counts, edges) if with_margin else pd.DataFrame(columns=MARGIN_COLUMNS)
    )
    return Attribution(
        pair=pair,
        groups=flip_groups(log_w_all[later], clipped_all[later], flipped_all[later]),
        explained=explained_by_flips(log_w_all[later], clipped_all[later], flipped_all[later]),
        by_minibatch=flip_groups_by_minibatch(log_w_all, clipped_all, flipped_all, minibatch_all),
        by_margin=by_margin,
    )


def _sample_margins(run: str | Path, steps: list[int] | None, batch_rows: int | None, target: int) -> np.ndarray:
    """An evenly strided sample of finite ``margin_old`` values of the run (about ``target`` of them).

    The stride is coprime with the number of layers so that every layer is sampled.
    """
    files = list_token_files(run)
    if steps is not None:
        files = files[files["step"].isin(steps)]
    total, width = 0, 1
    for path in files["path"]:
        try:
            parquet = open_token_file(path)
        except RunFileError:  # reported by the main pass
            continue
        if schema.COL_MARGIN_OLD not in parquet.schema_arrow.names:
            continue
        field = parquet.schema_arrow.field(schema.COL_MARGIN_OLD)
        width = getattr(field.type, "list_size", 1) or 1
        total += parquet.metadata.num_rows * width
    stride = max(1, total // max(target, 1))
    while math.gcd(stride, width) != 1:  # a stride sharing a factor with the row width skips layers
        stride += 1
    parts = []
    ignored: list[Skipped] = []  # the main pass reports (or raises for) the same unreadable files
    for _, batch in iter_run_batches(run, [schema.COL_MARGIN_OLD], steps=steps, batch_rows=batch_rows, skipped=ignored):
        flat = margin_array(batch.column(schema.COL_MARGIN_OLD)).reshape(-1)
        sample = flat[::stride]
        parts.append(sample[np.isfinite(sample)])
    return np.concatenate(parts) if parts else np.array([], dtype=np.float32)
