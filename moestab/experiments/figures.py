"""Figures shared by the notebooks: curves as mean +- sd over seeds (one axes, or one small panel per group), paired
differences with their intervals, and a warning rule's record (per-run timelines of warnings and onsets, recall
against the false-alarm rate). An integer x (steps, layers, minibatches) gets integer ticks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
from matplotlib.ticker import MaxNLocator


def mean_sd(frame: pd.DataFrame, x: str, y: str, by: Sequence[str] = ()) -> pd.DataFrame:
    """``y`` per ``x`` (and groups ``by``) as ``mean``, ``sd`` and ``n`` over the rest (seeds); NaN rows dropped."""
    keys = [*by, x]
    rows = frame.dropna(subset=[y]).groupby(keys)[y]
    return rows.agg(mean="mean", sd="std", n="count").reset_index()


def plot_mean_sd(
    ax, frame: pd.DataFrame, x: str, y: str, by: Sequence[str] = (), label: str | None = None, *,
    styles: Mapping[Any, Mapping[str, Any]] | None = None, band_alpha: float = 0.2,
) -> None:
    """One line per group of ``by``: the mean over seeds, with a +-1 sd band.

    ``styles``: matplotlib line keywords per group key (the value of a single ``by`` column, else the tuple), so that
    many groups stay distinguishable (colour and dash); the band takes the line's colour."""
    stats = mean_sd(frame, x, y, by)
    groups = stats.groupby(list(by)) if by else [((), stats)]
    for key, rows in groups:
        values = key if isinstance(key, tuple) else (key,)
        name = label or (", ".join(f"{k}={v}" for k, v in zip(by, values, strict=True)) or y)
        style = dict((styles or {}).get(values[0] if len(values) == 1 else values, {}))
        (line,) = ax.plot(rows[x], rows["mean"], label=style.pop("label", name), **style)
        ax.fill_between(rows[x], rows["mean"] - rows["sd"].fillna(0), rows["mean"] + rows["sd"].fillna(0),
                        alpha=band_alpha, color=line.get_color(), linewidth=0)
    ax.set(xlabel=x, ylabel=y)
    if pd.api.types.is_integer_dtype(stats[x]):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))  # 0, 20, 40, not 15, 30


def plot_small_multiples(
    axes, frame: pd.DataFrame, x: str, y: str, by: str, *, styles: Mapping[Any, Mapping[str, Any]] | None = None,
    order: Sequence[Any] | None = None,
) -> None:
    """One panel per value of ``by`` (in ``order``; default sorted), titled with it: that group's mean +- sd over
    seeds in its style, and every other group's mean as a thin grey line, so that groups whose bands would overlap in
    one axes stay readable. ``axes``: as many as groups, best made with ``sharex``/``sharey``."""
    groups = list(order) if order is not None else sorted(frame[by].unique())
    axes = list(getattr(axes, "flat", axes))
    if len(axes) != len(groups):
        raise ValueError(f"{len(groups)} groups of {by!r} need {len(groups)} axes; got {len(axes)}")
    stats = mean_sd(frame, x, y, [by])
    for ax, group in zip(axes, groups, strict=True):
        for other, rows in stats.groupby(by):
            if other != group:
                ax.plot(rows[x], rows["mean"], color="0.75", linewidth=0.8)
        plot_mean_sd(ax, frame[frame[by] == group], x, y, by=[by], styles=styles)
        ax.set_title(str(group))


def plot_intervals(ax, paired: pd.DataFrame, label: str = "arm", title: str | None = None) -> None:
    """Paired differences as a forest plot: one row per ``label``, the mean difference as a dot and its interval
    (``ci_low`` .. ``ci_high``) as a bar, with the no-difference line at 0. Rows without an interval are left out."""
    rows = paired.dropna(subset=["mean_diff", "ci_low", "ci_high"]).reset_index(drop=True)
    y = list(range(len(rows)))[::-1]  # the first row on top
    below, above = rows["mean_diff"] - rows["ci_low"], rows["ci_high"] - rows["mean_diff"]
    ax.errorbar(rows["mean_diff"], y, xerr=[below, above], fmt="o", capsize=3)
    ax.axvline(0.0, color="grey", linewidth=0.8, linestyle=":")
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5))  # few enough that labels such as -0.0125 do not collide
    ax.set_yticks(y, rows[label].tolist())
    if title:
        ax.set_title(title)


def plot_warning_timelines(ax, runs: pd.DataFrame, horizon: int, steps: int) -> None:
    """One row per run (a per-run table of :func:`moestab.experiments.collapse_study.score_run`, in its order from
    the top): the rule's warnings as ticks, a collapsed run's onset as a cross and its hit window
    (``[onset - horizon, onset - 1]``) shaded; a run's label says whether it collapsed and was warned in time, and
    its lead. ``steps``: the runs' length (the x range)."""
    labels = []
    for y, row in enumerate(runs.itertuples(index=False)):
        y = len(runs) - 1 - y  # the first row on top
        # a CSV cell of one warning reads back as a number, of none as NaN
        warned = [] if pd.isna(row.warnings) else [int(float(w)) for w in str(row.warnings).split()]
        ax.hlines(y, 1, steps, color="0.85", linewidth=0.8)
        if row.collapsed:
            onset = int(row.onset)
            ax.fill_betweenx([y - 0.35, y + 0.35], max(onset - horizon, 1), onset - 1, color="tab:orange", alpha=0.25,
                             linewidth=0)
            ax.plot([onset], [y], marker="x", color="tab:red", markersize=7)
        if warned:
            ax.plot(warned, [y] * len(warned), linestyle="none", marker="|", color="tab:blue", markersize=10)
        outcome = ("hit, lead " + f"{row.lead:.0f}") if row.collapsed and row.hit else \
            "missed" if row.collapsed else f"{int(row.false_alarms)} false alarm(s)" if row.false_alarms else "quiet"
        labels.append(f"{row.arm} {row.seed}: {outcome}")
    ax.set_yticks(range(len(runs))[::-1], labels, fontsize=7)
    ax.set_xlim(0, steps + 1)
    ax.set_ylim(-0.7, len(runs) - 0.3)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))


def plot_recall_curves(ax, curve: pd.DataFrame, x: str, y: str, by: str = "rule") -> None:
    """Recall against the false-alarm rate: one line per ``by`` (a rule), its points marked."""
    for name, rows in curve.groupby(by, sort=False):
        rows = rows.sort_values(x)
        ax.plot(rows[x], rows[y], marker="o", label=str(name))
    ax.set(xlabel=x, ylabel=y, ylim=(-0.05, 1.05))
    ax.legend(fontsize=8)
