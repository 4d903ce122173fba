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
from moestab.analysis.run_index import INDEX_FILE, Entry, RunIndex, read_within
from moestab.configs import cache_root
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
    """Forget every cached result and the run index's rows (the Refresh button)."""
    st.cache_data.clear()
    run_index(_index_file()).clear()


def _index_file() -> str:
    return str(cache_root() / INDEX_FILE)


_CACHE = {"show_spinner": False, "max_entries": 512}


@st.cache_data(**_CACHE)
def info(run: str, key: Key) -> Loaded:
    """:func:`moestab.run_folder.read_run_info`."""
    return guarded(lambda skipped: read_run_info(run))


@st.cache_resource(show_spinner=False)
def run_index(file: str) -> RunIndex:
    """The run index kept in ``file`` (:class:`moestab.analysis.run_index.RunIndex`), one per process and file."""
    return RunIndex(file)


def _overview_entry(run: str) -> Entry:
    loaded = guarded(lambda skipped: run_overview(run, skipped))
    return Entry(loaded.value, loaded.skipped, loaded.error, loaded.trace)


@dataclass(frozen=True)
class Overviews:
    """The Runs table rows read so far (:func:`overviews`)."""

    rows: dict[str, Loaded[dict]]
    """Run path -> its row (:func:`moestab.analysis.dashboard_data.run_overview`), for every run read."""
    pending: tuple[str, ...]
    """Runs not read yet."""
    computed: int
    """Runs read in this call (the others came from the index)."""
    note: str | None
    """Why the index is not kept on disk (:attr:`RunIndex.note`), or ``None``."""


def overviews(runs: dict[str, Key], budget_s: float | None) -> Overviews:
    """The Runs table rows of ``runs`` (path -> fingerprint): from the run index, the others computed (and kept
    there) for ``budget_s`` seconds (``None``: all; 0: none, only what the index holds)."""
    index = run_index(_index_file())
    read = read_within(index, runs, _overview_entry, budget_s)
    rows = {path: Loaded(e.value, e.skipped, e.error, e.trace) for path, e in read.entries.items()}
    return Overviews(rows, read.pending, read.computed, index.note)


def _metrics(run: str, keys: tuple[str, ...] | None) -> tuple[Loaded, frozenset[str]]:
    """metrics.jsonl's rows (``keys`` only) and the names of its keys that hold numbers; no value (and no error) while
    the file does not exist or has no complete step yet."""
    if not RunFolder(run).metrics_file.is_file():
        return Loaded(None), frozenset()
    names: set[str] = set()
    loaded = guarded(lambda skipped: load_metrics(run, skipped, keys=keys, names=names))
    if loaded.value is not None and len(loaded.value) == 0:
        return Loaded(None, loaded.skipped), frozenset(names)
    return loaded, frozenset(names)


@st.cache_data(**_CACHE)
def metrics(run: str, key: Key, keys: tuple[str, ...] | None = None) -> Loaded:
    """metrics.jsonl as one row per step (:func:`moestab.run_folder.reader.load_metrics`), the columns of ``keys`` (and
    ``step``) only, so that memory follows what a page draws, not the file (``None``: every key); no value (and no
    error) while the file does not exist or has no complete step yet."""
    return _metrics(run, keys)[0]


@st.cache_data(**_CACHE)
def metrics_and_names(run: str, key: Key, keys: tuple[str, ...]) -> tuple[Loaded, frozenset[str]]:
    """:func:`metrics` and, from the same pass over the file, the names of every key holding a number at some step
    (what a page offers to draw)."""
    return _metrics(run, keys)


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
