"""Cached calls into ``moestab.analysis`` (and ``moestab.probes``), one per thing a page shows.

Every loader takes the run folder and its :func:`~moestab.analysis.dashboard_data.run_fingerprint`
(a probe folder: :func:`moestab.dashboard.kit.probes.fingerprint`), so a changed file is a new cache key and gets
re-read, and returns a :class:`Loaded`: the value, the parts of the run that the readers skipped
(their ``Skipped`` entries: file, line, reason) and, when nothing could be read, the error. A loader
never raises for a bad run: one corrupt run (or probe folder) must not take the page down. Each call
collects its own skipped parts, so concurrent sessions need no lock.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import streamlit as st

from moestab.analysis import run_volatility, volatility_table
from moestab.analysis.attribution import run_attribution
from moestab.analysis.dashboard_data import run_coactivation, run_overview
from moestab.analysis.experts import load_stats, run_expert_counts
from moestab.analysis.ratios import clip_fractions, ratio_quantiles, sequence_log_s, variance_by_length
from moestab.probes.errors import ProbeError
from moestab.probes.folder import ProbeResult, read_probe_folder
from moestab.run_folder import RunFolder, schema
from moestab.run_folder.errors import RunError, Skipped
from moestab.run_folder.reader import load_metrics, load_tokens, read_run_info

T = TypeVar("T")

Key = tuple[tuple[str, int, int], ...]
"""A run's fingerprint: part of every cache key."""


@dataclass(frozen=True)
class Loaded(Generic[T]):
    """What a loader got from one run."""

    value: T | None
    """The result (``None`` when ``error`` is set, or when the run has nothing of this kind yet)."""
    skipped: tuple[str, ...] = ()
    """Parts of the run that could not be read and were left out (the value is still valid)."""
    error: str | None = None
    """Why nothing could be read (names the file where the analyzers know it)."""
    trace: str | None = None
    """Traceback of an unexpected error (not an ``AnalysisError``), for a details box."""


def guarded(fn: Callable[[list[Skipped]], T]) -> Loaded[T]:
    """Call ``fn(skipped)`` and turn what it skipped and the errors it raised into a :class:`Loaded`."""
    skipped: list[Skipped] = []
    try:
        value, error, trace = fn(skipped), None, None
    except (RunError, ProbeError, FileNotFoundError) as exc:
        value, error, trace = None, str(exc), None
    except Exception as exc:  # a run we cannot read must not break the other runs' views
        value, error, trace = None, f"{type(exc).__name__}: {exc}", traceback.format_exc()
    return Loaded(value, tuple(dict.fromkeys(str(part) for part in skipped)), error, trace)


def clear() -> None:
    """Forget every cached result (the Refresh button)."""
    st.cache_data.clear()


_CACHE = {"show_spinner": False, "max_entries": 512}


@st.cache_data(**_CACHE)
def info(run: str, key: Key) -> Loaded:
    """:func:`moestab.run_folder.read_run_info`."""
    return guarded(lambda skipped: read_run_info(run))


@st.cache_data(**_CACHE)
def overview(run: str, key: Key) -> Loaded[dict]:
    """The Runs table row (:func:`moestab.analysis.dashboard_data.run_overview`)."""
    return guarded(lambda skipped: run_overview(run, skipped))


@st.cache_data(**_CACHE)
def metrics(run: str, key: Key) -> Loaded:
    """metrics.jsonl as one row per step (:func:`moestab.run_folder.reader.load_metrics`); no value (and no
    error) while the file does not exist or has no complete step yet."""
    if not RunFolder(run).metrics_file.is_file():
        return Loaded(None)
    loaded = guarded(lambda skipped: load_metrics(run, skipped))
    if loaded.value is not None and len(loaded.value) == 0:
        return Loaded(None, loaded.skipped)
    return loaded


RATIO_COLUMNS = (schema.COL_STEP, schema.COL_SEQ, schema.COL_MINIBATCH, schema.COL_LOG_W, schema.COL_CLIPPED,
                 schema.COL_RESPONSE_LEN)


@st.cache_data(**_CACHE)
def ratios(run: str, key: Key) -> Loaded[dict]:
    """Token and sequence log-ratios, their quantiles, clip fractions per step and variance by length.

    Value: ``None`` without per-token tables, else a dict with ``log_w`` and ``log_s`` (arrays),
    ``quantiles``, ``clip_by_step`` and ``by_length`` (frames of :mod:`moestab.analysis.ratios`).
    """

    def compute(skipped: list[Skipped]) -> dict | None:
        tokens = load_tokens(run, columns=list(RATIO_COLUMNS), skipped=skipped)
        if not len(tokens):
            return None
        return {
            "log_w": tokens[schema.COL_LOG_W].to_numpy(),
            "log_s": sequence_log_s(tokens)["log_s"].to_numpy(),
            "quantiles": ratio_quantiles(tokens),
            "clip_by_step": clip_fractions(tokens, by=[schema.COL_STEP]),
            "by_length": variance_by_length(tokens),
        }

    return guarded(compute)


VOLATILITY_VIEWS = {
    "step_layer": ["step", "layer"],
    "step": ["step"],
    "minibatch": ["minibatch"],
    "position": ["position_bin"],
    "position_layer": ["position_bin", "layer"],
}
"""Groupings of :func:`volatility` (name -> ``volatility_table`` ``by``)."""


@st.cache_data(**_CACHE)
def volatility(run: str, key: Key, pair: str) -> Loaded[dict]:
    """Routing volatility of route pair ``pair`` over the per-token tables, one table per view of
    :data:`VOLATILITY_VIEWS` (``None`` without per-token tables)."""

    def compute(skipped: list[Skipped]) -> dict | None:
        counts = run_volatility(run, pair, skipped=skipped)
        if counts is None:
            return None
        return {name: volatility_table(counts, by=by) for name, by in VOLATILITY_VIEWS.items()}

    return guarded(compute)


@st.cache_data(**_CACHE)
def attribution(run: str, key: Key, pair: str) -> Loaded:
    """:func:`moestab.analysis.attribution.run_attribution` for flips of route pair ``pair``."""
    return guarded(lambda skipped: run_attribution(run, pair, skipped=skipped))


@st.cache_data(**_CACHE)
def expert_stats(run: str, key: Key) -> Loaded:
    """Per-layer load statistics over the recorded tokens' ``routes_old_free`` (``None`` without tables)."""

    def compute(skipped: list[Skipped]):
        layers = read_run_info(run).recorded_layers
        counts = run_expert_counts(run, skipped=skipped)
        if counts is None:
            return None
        return load_stats(counts, layers if len(layers) == counts.shape[0] else None)

    return guarded(compute)


@st.cache_data(**_CACHE)
def coactivation(run: str, key: Key, layer_index: int) -> Loaded:
    """Co-activation matrix of one layer (:func:`moestab.analysis.dashboard_data.run_coactivation`)."""
    return guarded(lambda skipped: run_coactivation(run, layer_index, skipped=skipped))


@st.cache_data(**_CACHE)
def probe(folder: str, key: Key) -> Loaded[ProbeResult]:
    """A probe folder (:func:`moestab.probes.folder.read_probe_folder`); ``key``: its files' times and sizes."""
    return guarded(lambda skipped: read_probe_folder(folder))
