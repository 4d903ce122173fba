"""Distributions of the importance ratios that entered the loss, and their clipping.

Per token, ``log w = logp_update - logp_old`` (column ``log_w``; token ratio of GRPO/PPO). Per
sequence, the GSPO ratio ``s_i = exp(mean_t log w_it)`` (GSPO arXiv 2507.18071, Eq. 7), so
``log s_i`` is the mean of ``log_w`` over the response's tokens. The per-token tables hold every
loss token of each recorded sequence (docs/run-format.md), so the mean over a sequence's rows is
the mean over its response.

Inputs are per-token DataFrames with the run-format columns used by each function (``step``,
``seq``, ``log_w``, ``clipped``, ``response_length``), e.g. from
:func:`moestab.run_folder.reader.load_tokens`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from moestab.analysis.bins import DEFAULT_LENGTH_EDGES, bin_left_edges
from moestab.metrics.ratios import CLIP_FRACTIONS, sequence_log_ratios
from moestab.metrics.ratios import clip_fractions as clip_stats
from moestab.run_folder import schema

DEFAULT_QUANTILES: tuple[float, ...] = (0.001, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 0.999)


def _require(frame: pd.DataFrame, columns: Sequence[str]) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise KeyError(f"per-token frame lacks column(s) {missing}; has {list(frame.columns)}")


def _sequence_ids(tokens: pd.DataFrame) -> np.ndarray:
    """``[rows]`` int64 id of each row's sequence, (``step``, ``seq``) in one number."""
    return tokens[schema.COL_STEP].to_numpy(np.int64) * (1 << 32) + tokens[schema.COL_SEQ].to_numpy(np.int64)


def sequence_log_s(tokens: pd.DataFrame) -> pd.DataFrame:
    """One row per sequence (``step``, ``seq``): ``log_s`` (mean ``log_w``:
    :func:`moestab.metrics.ratios.sequence_log_ratios`, the step metrics' definition), ``tokens``, ``clipped``
    (any token clipped) and, when present in ``tokens``, ``response_length`` and ``reward``."""
    _require(tokens, [schema.COL_STEP, schema.COL_SEQ, schema.COL_LOG_W])
    grouped = tokens.groupby([schema.COL_STEP, schema.COL_SEQ], sort=True)
    out = grouped.size().to_frame("tokens")
    sequence = _sequence_ids(tokens)
    log_s = pd.Series(sequence_log_ratios(tokens[schema.COL_LOG_W].to_numpy(), sequence), index=pd.unique(sequence))
    step, seq = (out.index.get_level_values(level).to_numpy(np.int64) for level in (0, 1))
    out.insert(0, "log_s", log_s.reindex(step * (1 << 32) + seq).to_numpy())
    if schema.COL_CLIPPED in tokens:
        out["clipped"] = grouped[schema.COL_CLIPPED].any()
    for column in (schema.COL_RESPONSE_LEN, schema.COL_REWARD):
        if column in tokens:
            out[column] = grouped[column].first()
    return out.reset_index()


def describe(values: np.ndarray, quantiles: Sequence[float] = DEFAULT_QUANTILES) -> dict[str, float]:
    """``count``, ``mean``, ``std`` (population), ``min``, ``max`` and ``q<p>`` quantiles of the finite values."""
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    out: dict[str, float] = {"count": float(arr.size)}
    if arr.size == 0:
        out.update({"mean": np.nan, "std": np.nan, "min": np.nan, "max": np.nan})
        out.update({f"q{q:g}": np.nan for q in quantiles})
        return out
    out.update({"mean": arr.mean(), "std": arr.std(), "min": arr.min(), "max": arr.max()})
    out.update({f"q{q:g}": v for q, v in zip(quantiles, np.quantile(arr, quantiles), strict=True)})
    return out


def ratio_quantiles(tokens: pd.DataFrame, quantiles: Sequence[float] = DEFAULT_QUANTILES) -> pd.DataFrame:
    """Summary of ``log w`` (per token) and ``log s`` (per sequence): one row each, columns of :func:`describe`."""
    log_s = sequence_log_s(tokens)["log_s"].to_numpy()
    rows = [
        {"quantity": "log_w", **describe(tokens[schema.COL_LOG_W].to_numpy(), quantiles)},
        {"quantity": "log_s", **describe(log_s, quantiles)},
    ]
    return pd.DataFrame(rows)


def histogram(values: np.ndarray, bins: int = 60, limit: float | None = None) -> pd.DataFrame:
    """Histogram of the finite ``values`` over ``[-limit, limit]`` in ``bins`` equal bins.

    ``limit`` defaults to the larger of ``|q0.001|`` and ``|q0.999|`` (so the bulk is visible); values
    outside are counted in the first / last bin, so counts sum to the number of finite values.
    Columns: ``left``, ``right``, ``count``.
    """
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    if limit is None:
        limit = float(np.abs(np.quantile(arr, [0.001, 0.999])).max()) if arr.size else 1.0
    if not limit > 0:
        limit = 1e-6
    edges = np.linspace(-limit, limit, bins + 1)
    counts, _ = np.histogram(np.clip(arr, -limit, limit), bins=edges)
    return pd.DataFrame({"left": edges[:-1], "right": edges[1:], "count": counts.astype(np.int64)})


def ratio_histograms(tokens: pd.DataFrame, bins: int = 60) -> pd.DataFrame:
    """Tidy histograms of ``log_w`` and ``log_s``: columns ``quantity``, ``left``, ``right``, ``count``."""
    log_s = sequence_log_s(tokens)["log_s"].to_numpy()
    frames = []
    for name, values in (("log_w", tokens[schema.COL_LOG_W].to_numpy()), ("log_s", log_s)):
        frame = histogram(values, bins)
        frame.insert(0, "quantity", name)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def clip_fractions(tokens: pd.DataFrame, by: Sequence[str] = (schema.COL_STEP,)) -> pd.DataFrame:
    """:func:`moestab.metrics.ratios.clip_fractions` per group of ``by`` (default: per step).

    Needs ``step``, ``seq``, ``minibatch`` and ``clipped`` columns. Columns: ``by``..., ``tokens``,
    ``sequences``, ``token_frac``, ``seq_frac``, ``token_frac_later``, ``seq_frac_later`` (the last two
    over minibatches 2..n). A sequence is identified by (``step``, ``seq``).
    """
    needed = [schema.COL_STEP, schema.COL_SEQ, schema.COL_MINIBATCH, schema.COL_CLIPPED, *by]
    _require(tokens, needed)
    by = list(by)
    rows = []
    groups = tokens.groupby(by, sort=True) if by else [((), tokens)]
    for key, part in groups:
        sequence = _sequence_ids(part)
        stats = clip_stats(part[schema.COL_CLIPPED].to_numpy(bool), sequence, part[schema.COL_MINIBATCH].to_numpy())
        values = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(by, values, strict=True)), "tokens": len(part),
                     "sequences": int(pd.unique(sequence).size), **stats})
    return pd.DataFrame(rows, columns=[*by, "tokens", "sequences", *CLIP_FRACTIONS])


def variance_by_length(tokens: pd.DataFrame, edges: Sequence[int] = DEFAULT_LENGTH_EDGES) -> pd.DataFrame:
    """Variance of ``log w`` (over tokens) and ``log s`` (over sequences) per response-length bin.

    Columns: ``length_bin`` (left edge), ``tokens``, ``sequences``, ``mean_log_w``, ``var_log_w``,
    ``mean_log_s``, ``var_log_s`` (population variances; NaN for an empty group). Shows how the
    sequence ratio's length normalisation (GSPO Eq. 7) tames the spread of long responses.
    """
    _require(tokens, [schema.COL_STEP, schema.COL_SEQ, schema.COL_LOG_W, schema.COL_RESPONSE_LEN])
    token_bins = bin_left_edges(tokens[schema.COL_RESPONSE_LEN].to_numpy(), edges)
    tok = tokens[[schema.COL_LOG_W]].assign(length_bin=token_bins).groupby("length_bin", sort=True)
    token_part = tok[schema.COL_LOG_W].agg(tokens="size", mean_log_w="mean", var_log_w=lambda x: x.var(ddof=0))
    seqs = sequence_log_s(tokens)
    seqs["length_bin"] = bin_left_edges(seqs[schema.COL_RESPONSE_LEN].to_numpy(), edges)
    seq_part = seqs.groupby("length_bin", sort=True)["log_s"].agg(
        sequences="size", mean_log_s="mean", var_log_s=lambda x: x.var(ddof=0)
    )
    return token_part.join(seq_part, how="outer").reset_index()


def product_log_var(seq_log_var: np.ndarray | float, tokens: np.ndarray | float) -> np.ndarray:
    """``Var(log prod_t w_t)`` of responses of exactly ``tokens`` tokens, from ``Var(log s)``: the product's log is
    ``|y| log s``, so its variance is ``|y|^2 Var(log s)`` (what a sequence ratio without GSPO's length
    normalisation would spread by). Broadcast, float64."""
    return np.asarray(tokens, dtype=np.float64) ** 2 * np.asarray(seq_log_var, dtype=np.float64)


def independence_ratio(
    seq_log_var: np.ndarray | float, token_log_var: np.ndarray | float, tokens: np.ndarray | float
) -> np.ndarray:
    """``|y| Var(log s) / Var(log w)`` for responses of exactly ``tokens`` tokens (broadcast, float64; NaN where
    ``Var(log w)`` is 0).

    If a response's token log-ratios were independent with the variance of all tokens, ``Var(log s)`` would be
    ``Var(log w) / |y|`` (GSPO §4's argument) and the ratio 1. Above 1, a response's token log-ratios move together
    (positively correlated: the sequence ratio spreads more than independence predicts); below 1, they partly
    cancel. Reading it per length, rather than a log-log slope of ``Var(log s)`` alone, keeps a change of the
    per-token variance between lengths from passing for a change of correlation.
    """
    seq = np.asarray(seq_log_var, dtype=np.float64)
    tok = np.asarray(token_log_var, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tok > 0, np.asarray(tokens, dtype=np.float64) * seq / np.where(tok > 0, tok, 1.0), np.nan)


def log_log_slope(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Least-squares slope of ``log y`` against ``log x`` (the exponent of a power law ``y ~ x^slope``); NaN with
    fewer than two distinct ``x``. Every value must be > 0."""
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if xs.shape != ys.shape or xs.ndim != 1:
        raise ValueError(f"x and y must be 1-d of one length, got {xs.shape} and {ys.shape}")
    if np.any(xs <= 0) or np.any(ys <= 0):
        raise ValueError("log_log_slope needs positive x and y")
    if np.unique(xs).size < 2:
        return float("nan")
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])
