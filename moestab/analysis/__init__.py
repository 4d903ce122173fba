"""Analyzers over run folders (docs/run-format.md): pure functions over numpy / pandas.

Reading a run folder is :mod:`moestab.run_folder` (re-exported here: ``read_run_info``, ``load_metrics``,
...); every metric's definition is :mod:`moestab.metrics`. Modules, by concept:

- ``volatility``   routing change between two route sets (slot, router, token level; by layer,
                   step, minibatch, position)
- ``saturation``   router saturation against a reference (OLMoE), also over checkpoint folders
- ``ratios``       ``log w`` / ``log s`` distributions, clip fractions, variance by length
- ``attribution``  ratio noise and clipping of flipped vs unflipped tokens; flip rate vs margin
- ``mismatch``     rollout-vs-trainer mismatch on both sides of pi_old (as used / free): k1, k3,
                   F(2), chi2 and routing mismatch
- ``experts``      expert load, load entropy, dead experts, co-activation
- ``summary``      one row per run
- ``plots``        matplotlib figures (imported on demand: ``moestab.analysis.plots``)

Route arrays are int16 ``[tokens, layers, top_k]`` with -1 = not recorded; a (token, layer) with
any -1 is excluded from that layer's statistics. Readers that may leave parts of a run out take
``skipped``: ``None`` raises on the first unreadable part, a list collects :class:`Skipped` entries.
"""

from moestab.analysis.summary import SUMMARY_COLUMNS, SUMMARY_KEYS, run_summary, summarize_runs
from moestab.analysis.volatility import (
    PAIRS,
    VolatilityAccumulator,
    VolatilityCounts,
    intersection_sizes,
    merge_counts,
    route_volatility,
    run_volatility,
    volatility_by_layer,
    volatility_counts,
    volatility_table,
)
from moestab.run_folder.errors import NotARunError, RunError, RunFileError, SchemaVersionError, Skipped
from moestab.run_folder.reader import (
    RunInfo,
    iter_run_batches,
    iter_token_batches,
    list_checkpoints,
    list_token_files,
    load_metrics,
    load_runs_metrics,
    load_tokens,
    margin_array,
    read_routes,
    read_run_info,
    route_array,
)

AnalysisError = RunError

__all__ = [
    "PAIRS",
    "SUMMARY_COLUMNS",
    "SUMMARY_KEYS",
    "AnalysisError",
    "NotARunError",
    "RunError",
    "RunFileError",
    "RunInfo",
    "SchemaVersionError",
    "Skipped",
    "VolatilityAccumulator",
    "VolatilityCounts",
    "intersection_sizes",
    "iter_run_batches",
    "iter_token_batches",
    "list_checkpoints",
    "list_token_files",
    "load_metrics",
    "load_runs_metrics",
    "load_tokens",
    "margin_array",
    "merge_counts",
    "read_routes",
    "read_run_info",
    "route_array",
    "route_volatility",
    "run_summary",
    "run_volatility",
    "summarize_runs",
    "volatility_by_layer",
    "volatility_counts",
    "volatility_table",
]
