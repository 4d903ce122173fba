"""Figures shared by the notebooks: curves as mean +- sd over seeds."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd


def mean_sd(frame: pd.DataFrame, x: str, y: str, by: Sequence[str] = ()) -> pd.DataFrame:
    """``y`` per ``x`` (and groups ``by``) as ``mean``, ``sd`` and ``n`` over the rest (seeds); NaN rows dropped."""
    keys = [*by, x]
    rows = frame.dropna(subset=[y]).groupby(keys)[y]
    return rows.agg(mean="mean", sd="std", n="count").reset_index()


def plot_mean_sd(ax, frame: pd.DataFrame, x: str, y: str, by: Sequence[str] = (), label: str | None = None) -> None:
    """One line per group of ``by``: the mean over seeds, with a +-1 sd band."""
    stats = mean_sd(frame, x, y, by)
    groups = stats.groupby(list(by)) if by else [((), stats)]
    for key, rows in groups:
        name = label or (", ".join(f"{k}={v}" for k, v in zip(by, key if isinstance(key, tuple) else (key,),
                                                              strict=True)) or y)
        ax.plot(rows[x], rows["mean"], label=name)
        ax.fill_between(rows[x], rows["mean"] - rows["sd"].fillna(0), rows["mean"] + rows["sd"].fillna(0), alpha=0.2)
    ax.set(xlabel=x, ylabel=y)
