"""Figures of the analyses (matplotlib, PNG through the Agg renderer; pyplot is never imported, so
no global figure state and no display backend is touched).

Each ``plot_*`` function takes analysis results and returns a :class:`matplotlib.figure.Figure`;
:func:`run_figures` computes every figure a run folder allows and :func:`write_run_plots` writes them. Every axes
has a y label with its unit, and axes of steps tick integers only.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from moestab.analysis.attribution import Attribution, run_attribution
from moestab.analysis.dashboard_data import metric_curve
from moestab.analysis.experts import metrics_per_layer
from moestab.analysis.labels import is_percent
from moestab.analysis.ratios import ratio_histograms
from moestab.analysis.volatility import run_volatility, volatility_table
from moestab.metrics import keys
from moestab.run_folder import RunFolder, schema
from moestab.run_folder.errors import RunFileError, Skipped, skip
from moestab.run_folder.reader import list_token_files, load_metrics, load_tokens, read_run_info

CURVE_KEYS = ((keys.REWARD_MEAN, "reward (mean)", "reward per response (task's scale)"),
              (keys.ACCURACY, "rollout accuracy", "% of responses correct"),
              (keys.EVAL_ACCURACY, "eval accuracy (step 0 = start)", "% of the eval set correct"),
              (keys.ROUTING_CHANGED.format(pair="old_new"), "routing change old -> new", "% of routed slots"))
"""(metrics.jsonl key, title, y label with its unit) of each panel of :func:`plot_curves`; shares are drawn in
percent, as every surface shows them (``moestab.analysis.labels.is_percent``)."""


def _figure(ncols: int = 1, width: float = 5.0, height: float = 3.6) -> tuple[Figure, list]:
    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def _integer_steps(ax: Axes) -> None:
    """Ticks at whole steps only: matplotlib's default locator puts 1.5 between steps 1 and 2."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as PNG to ``path`` (parent folders created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=110)
    return path


def plot_curves(metrics: pd.DataFrame, start_accuracy: Mapping[str, float] | float | None = None) -> Figure:
    """Reward, rollout accuracy and eval accuracy against step; one line per ``run`` if that column exists.

    ``start_accuracy``: the eval accuracy of the starting policy (run.json's ``warm_start``; a mapping ``run`` ->
    accuracy for several runs), drawn at step 0 of the eval curve: the eval at start has no metrics.jsonl line,
    so without it the eval curve would begin at the first eval step.
    """
    fig, axes = _figure(len(CURVE_KEYS), width=4.2)
    several = "run" in metrics
    groups = metrics.groupby("run", sort=False) if several else [(None, metrics)]
    for name, part in groups:
        start = start_accuracy.get(name) if isinstance(start_accuracy, Mapping) else start_accuracy
        for ax, (key, _, _) in zip(axes, CURVE_KEYS, strict=True):
            eval_key = key == keys.EVAL_ACCURACY
            curve = metric_curve(part, key, start if eval_key and start is not None and np.isfinite(start) else None)
            if len(curve):
                scale = 100.0 if is_percent(key) else 1.0
                ax.plot(curve["step"], curve["value"] * scale, marker="o" if eval_key else None, label=name)
    for ax, (_, title, ylabel) in zip(axes, CURVE_KEYS, strict=True):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        _integer_steps(ax)
        if ax.get_legend_handles_labels()[0] and several:
            ax.legend(fontsize="small")
    return fig


def plot_volatility_heatmap(table: pd.DataFrame, value: str = "changed", title: str = "") -> Figure:
    """Heatmap layer x step of ``value`` from a tidy frame with columns ``step``, ``layer``, ``value``."""
    grid = table.pivot_table(index="layer", columns="step", values=value, aggfunc="mean")
    fig, (ax,) = _figure(width=7.0, height=4.5)
    if grid.size:
        image = ax.imshow(
            grid.to_numpy(np.float64) * 100,  # percent, as every surface shows a share
            aspect="auto",
            origin="lower",
            interpolation="nearest",
            extent=(grid.columns.min() - 0.5, grid.columns.max() + 0.5, -0.5, len(grid.index) - 0.5),
        )
        fig.colorbar(image, ax=ax, label=f"{value} (% of routed slots)")
        ticks = np.linspace(0, len(grid.index) - 1, min(len(grid.index), 8)).round().astype(int)
        ax.set_yticks(ticks, [str(grid.index[i]) for i in ticks])
    ax.set_xlabel("step")
    _integer_steps(ax)
    ax.set_ylabel("MoE layer (index)")
    ax.set_title(title or f"routing volatility ({value})")
    return fig


def plot_ratio_histograms(histograms: pd.DataFrame) -> Figure:
    """Histograms of ``log w`` and ``log s`` (the frame of :func:`~moestab.analysis.ratios.ratio_histograms`)."""
    fig, axes = _figure(2)
    for ax, quantity in zip(axes, ("log_w", "log_s"), strict=True):
        part = histograms[histograms["quantity"] == quantity]
        if len(part):
            ax.stairs(part["count"].to_numpy(), np.r_[part["left"].to_numpy(), part["right"].to_numpy()[-1]], fill=True)
            ax.set_yscale("log")
        per_token = quantity == "log_w"
        ax.set_title(f"{quantity.replace('_', ' ')} ({'per token' if per_token else 'per sequence'})")
        ax.set_xlabel(f"{quantity.replace('_', ' ')} (nats)")
        ax.set_ylabel("tokens" if per_token else "sequences")
    return fig


def plot_attribution(attribution: Attribution) -> Figure:
    """Mean / q0.99 ``|log w|`` of flipped vs unflipped tokens, and router flip rate vs margin bin."""
    fig, (left, right) = _figure(2)
    groups = attribution.groups[attribution.groups["flipped"].isin([False, True])]
    x = np.arange(len(groups))
    left.bar(x - 0.2, groups["mean_abs_log_w"], width=0.4, label="mean")
    left.bar(x + 0.2, groups["q99_abs_log_w"], width=0.4, label="q0.99")
    left.set_xticks(
        x,
        [
            f"{'flipped' if f else 'not flipped'}\n(n={n})"
            for f, n in zip(groups["flipped"], groups["tokens"], strict=True)
        ],
    )
    left.set_ylabel("|log w| (nats)")
    left.set_title(f"|log w| by routing flip ({attribution.pair})")
    left.legend(fontsize="small")
    margin = attribution.by_margin
    if len(margin):
        centers = (margin["margin_low"].to_numpy(np.float64) + margin["margin_high"].to_numpy(np.float64)) / 2
        right.plot(centers, margin["flip_rate"].to_numpy(np.float64), marker="o")
        if (centers > 0).all():
            right.set_xscale("log")
    right.set_xlabel("router margin under pi_old (quantile-bin centre)")
    right.set_ylabel("router flip rate (fraction of routers)")
    right.set_title("flip rate vs margin")
    return fig


HEATMAP_PAIRS = ("old_new", "rollout_old", "rollout_old_free")
"""Route pairs drawn as layer x step heatmaps by :func:`write_run_plots`."""


def _heatmap_table(
    run: str | Path, metrics: pd.DataFrame | None, pair: str, skipped: list[Skipped] | None
) -> pd.DataFrame | None:
    if metrics is not None:
        tidy = metrics_per_layer(metrics, keys.ROUTING_CHANGED_BY_LAYER.format(pair=pair)).dropna()
        if len(tidy):
            return tidy.rename(columns={"value": "changed"})
    counts = run_volatility(run, pair, skipped=skipped)
    return None if counts is None else volatility_table(counts, by=["step", "layer"])


def run_figures(run: str | Path, skipped: list[Skipped] | None = None) -> dict[str, Figure]:
    """Every figure a run allows, by file name.

    ``curves.png`` (metrics.jsonl, the eval curve from the start eval of run.json at step 0),
    ``volatility_<pair>.png`` for :data:`HEATMAP_PAIRS` (metrics' per-layer lists, else the per-token tables),
    ``ratios.png`` and ``attribution.png`` (per-token tables). A figure whose data is missing or unreadable goes to
    ``skipped`` (raises with ``None``); an unusable run.json raises (``NotARunError``, ...).
    """
    figures: dict[str, Figure] = {}
    start = read_run_info(run).warm_start_accuracy
    try:
        metrics = load_metrics(run, skipped)
    except RunFileError as exc:
        skip(skipped, RunFileError(exc.path, f"{exc.problem}; no curves"))
        metrics = None
    if metrics is not None and len(metrics):
        figures["curves.png"] = plot_curves(metrics, start)
    for pair in HEATMAP_PAIRS:
        table = _heatmap_table(run, metrics, pair, skipped)
        if table is not None and len(table):
            title = f"routing volatility {pair.replace('_', ' -> ')} (changed)"
            figures[f"volatility_{pair}.png"] = plot_volatility_heatmap(table, title=title)
    if len(list_token_files(run)) > 0:
        columns = [schema.COL_STEP, schema.COL_SEQ, schema.COL_LOG_W]
        tokens = load_tokens(run, columns=columns, skipped=skipped)
        if len(tokens):
            figures["ratios.png"] = plot_ratio_histograms(ratio_histograms(tokens))
        attribution = run_attribution(run, skipped=skipped)
        if attribution is not None:
            figures["attribution.png"] = plot_attribution(attribution)
    else:
        skip(skipped, RunFileError(RunFolder(run).tokens_dir, "no per-token tables: no ratio or attribution plots"))
    return figures


def write_run_plots(run: str | Path, out_dir: str | Path, skipped: list[Skipped] | None = None) -> list[Path]:
    """Write :func:`run_figures` of ``run`` into ``out_dir``; returns the paths written."""
    return [save_figure(fig, Path(out_dir) / name) for name, fig in run_figures(run, skipped).items()]
