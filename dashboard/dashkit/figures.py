"""Matplotlib figures of the dashboard (Agg canvas; pyplot is never imported) and how to show them.

Figures only draw the numbers they are given: every value comes from ``moestab.analysis``.
Runs keep one colour on every page (their position in the selection).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import streamlit as st
from matplotlib import colormaps
from matplotlib import colors as mcolors
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

DPI = 110


@dataclass(frozen=True)
class Series:
    """One run's line on an overlaid chart."""

    label: str
    x: np.ndarray
    y: np.ndarray
    color: str
    marker: str | None = None
    linestyle: str = "-"


def color(index: int) -> str:
    """Colour of the ``index``-th selected run (tab10, cycling)."""
    return mcolors.to_hex(colormaps["tab10"](index % 10))


def new_figure(width: float = 5.2, height: float = 3.3, ncols: int = 1) -> tuple[Figure, list]:
    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def show(fig: Figure, alt: str) -> None:
    """Render ``fig`` as a PNG image filling its container (``alt`` names it for screen readers and tests)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    st.image(buffer.getvalue(), width="stretch", alt=alt)


def lines(
    series: Sequence[Series],
    title: str,
    xlabel: str,
    ylabel: str,
    *,
    logx: bool = False,
    logy: bool = False,
    integer_x: bool = False,
    hline: float | None = None,
) -> Figure:
    """Overlaid lines, one per run, with a legend; ``integer_x`` for steps and indices."""
    fig, (ax,) = new_figure()
    for s in series:
        ok = np.isfinite(np.asarray(s.y, dtype=np.float64))
        x, y = np.asarray(s.x)[ok], np.asarray(s.y, dtype=np.float64)[ok]
        marker = s.marker or ("o" if len(x) <= 12 else None)
        ax.plot(x, y, color=s.color, marker=marker, markersize=4, linestyle=s.linestyle, label=s.label)
    if hline is not None:
        ax.axhline(hline, color="0.6", linewidth=0.8, linestyle=":")
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    if integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _labels(ax, title, xlabel, ylabel)
    if series:
        ax.legend(fontsize="small", loc="best")
    return fig


def heatmap(
    grid: pd.DataFrame,
    title: str,
    xlabel: str,
    ylabel: str,
    colorbar: str,
    *,
    vmin: float | None = None,
    vmax: float | None = None,
    cmap: str = "viridis",
    width: float = 5.2,
    height: float = 3.3,
) -> Figure:
    """A matrix with its index on y and columns on x (one cell per label; NaN blank)."""
    fig, (ax,) = new_figure(width, height)
    values = grid.to_numpy(np.float64)
    image = ax.imshow(
        np.ma.masked_invalid(values),
        aspect="auto",
        origin="lower",
        interpolation="nearest",
        cmap=cmap,
        vmin=vmin,
        vmax=vmax,
    )
    fig.colorbar(image, ax=ax, label=colorbar)
    ax.set_xticks(*_ticks(list(grid.columns)))
    ax.set_yticks(*_ticks(list(grid.index)))
    _labels(ax, title, xlabel, ylabel)
    return fig


def _ticks(labels: list, most: int = 12) -> tuple[list[int], list[str]]:
    """At most ``most`` evenly spread tick positions over ``labels`` and their texts."""
    if not labels:
        return [], []
    at = sorted(set(np.linspace(0, len(labels) - 1, min(len(labels), most)).round().astype(int).tolist()))
    return at, [str(labels[i]) for i in at]


def stairs(
    hists: pd.DataFrame, colors: dict[str, str], title: str, xlabel: str, ylabel: str, *, logy: bool = True
) -> Figure:
    """Overlaid histograms (``run``, ``left``, ``right``, ``share``) as outlined steps, one per run."""
    fig, (ax,) = new_figure()
    for run, part in hists.groupby("run", sort=False):
        edges = np.r_[part["left"].to_numpy(), part["right"].to_numpy()[-1]]
        ax.stairs(part["share"].to_numpy(), edges, color=colors.get(run), label=run, linewidth=1.5)
    if logy:
        ax.set_yscale("log")
    _labels(ax, title, xlabel, ylabel)
    if len(hists):
        ax.legend(fontsize="small", loc="best")
    return fig


def grouped_bars(table: pd.DataFrame, groups: Sequence[str], colors: dict[str, str], title: str, ylabel: str) -> Figure:
    """Bars of ``table`` (index: runs, columns: ``groups``): one cluster per group, one bar per run."""
    fig, (ax,) = new_figure()
    runs = list(table.index)
    width = 0.8 / max(len(runs), 1)
    x = np.arange(len(groups))
    for i, run in enumerate(runs):
        values = table.loc[run, list(groups)].to_numpy(np.float64)
        ax.bar(x + (i - (len(runs) - 1) / 2) * width, np.nan_to_num(values), width, color=colors.get(run), label=run)
    ax.set_xticks(x, list(groups))
    _labels(ax, title, "", ylabel)
    if runs:
        ax.legend(fontsize="small", loc="best")
    return fig


def _labels(ax, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title, fontsize="medium")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, linewidth=0.4, alpha=0.5)
