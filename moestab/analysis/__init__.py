"""Analyzers over run folders (docs/run-format.md): pure functions over numpy / pandas.

Modules, by concept:

- ``load``         run folders -> ``RunInfo``, metrics / per-token DataFrames, streamed route arrays
- ``volatility``   routing change between two route sets (slot, router, token level; by layer,
                   step, minibatch, position)
- ``saturation``   router saturation against a reference (OLMoE), also over checkpoint folders
- ``ratios``       ``log w`` / ``log s`` distributions, clip fractions, variance by length
- ``attribution``  ratio noise and clipping of flipped vs unflipped tokens; flip rate vs margin
- ``mismatch``     rollout-vs-trainer log-prob mismatch (k1, k3, F(2), chi2) and routing mismatch
- ``experts``      expert load, load entropy, dead experts, co-activation
- ``summary``      one row per run
- ``plots``        matplotlib figures (imported on demand: ``moestab.analysis.plots``)

Route arrays are int16 ``[tokens, layers, top_k]`` with -1 = not recorded; a (token, layer) with
any -1 is excluded from that layer's statistics.
"""

from moestab.analysis.errors import AnalysisError, NotARunError, RunFileError, RunReadWarning, SchemaVersionError
from moestab.analysis.load import (
    RunInfo,
    iter_run_batches,
    iter_token_batches,
    list_checkpoints,
    list_token_files,
    load_metrics,
    load_run_info,
    load_runs_metrics,
    load_tokens,
    margin_array,
    read_routes,
    route_array,
)
from moestab.analysis.summary import SUMMARY_COLUMNS, run_summary, summarize_runs
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

__all__ = [
    "PAIRS",
    "SUMMARY_COLUMNS",
    "AnalysisError",
    "NotARunError",
    "RunFileError",
    "RunInfo",
    "RunReadWarning",
    "SchemaVersionError",
    "VolatilityAccumulator",
    "VolatilityCounts",
    "intersection_sizes",
    "iter_run_batches",
    "iter_token_batches",
    "list_checkpoints",
    "list_token_files",
    "load_metrics",
    "load_run_info",
    "load_runs_metrics",
    "load_tokens",
    "margin_array",
    "merge_counts",
    "read_routes",
    "route_array",
    "route_volatility",
    "run_summary",
    "run_volatility",
    "summarize_runs",
    "volatility_by_layer",
    "volatility_counts",
    "volatility_table",
]
