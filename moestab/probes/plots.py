"""Figures of a probe result: flip rate against router margin and change by layer (compare, numerics), the
saturation heatmap of layer x checkpoint, and the step probes' line charts (one figure each), drawn from the frames
of ``views``."""

from __future__ import annotations

from pathlib import Path

from moestab.probes.folder import ProbeResult
from moestab.probes.views import charts_for, flip_rate_by_margin, router_flip_by_layer, saturation_grid

STEP_PROBES = ("step-volatility", "depth")
"""Probes whose charts (``views.charts_for``) are drawn side by side in one figure, ``PROBE.png``."""


def plot_probe(result: ProbeResult, out: str | Path) -> list[Path]:
    """Write the result's PNG figures to ``out``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if "by_margin" in result.tables:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        for label, rows in flip_rate_by_margin(result).groupby("series", sort=False):
            left.plot(rows["x"], rows["y"], marker="o", label=label)
        left.set(xlabel="router margin (k-th minus (k+1)-th selection score), bin middle", ylabel="router flip rate",
                 title="flips against router margin")
        left.legend(fontsize=7)
        for label, rows in router_flip_by_layer(result).groupby("series", sort=False):
            right.plot(rows["x"], rows["y"], marker="o", label=label)
        right.set(xlabel="layer", ylabel="router flip rate", title="flips by layer")
        fig.tight_layout()
        written.append(out / f"{result.probe}_flips.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    if "saturation" in result.tables:
        wide = saturation_grid(result)
        fig, ax = plt.subplots(figsize=(1.2 + 0.6 * wide.shape[1], 1.2 + 0.35 * wide.shape[0]))
        image = ax.imshow(wide.to_numpy(), vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_xticks(range(wide.shape[1]), wide.columns)
        ax.set_yticks(range(wide.shape[0]), wide.index, fontsize=7)
        ax.set(xlabel="layer", title="top-k router saturation vs the reference")
        fig.colorbar(image, ax=ax)
        fig.tight_layout()
        written.append(out / "saturation_heatmap.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    if result.probe in STEP_PROBES:
        charts = charts_for(result.probe)
        fig, axes = plt.subplots(1, len(charts), figsize=(5.5 * len(charts), 4), squeeze=False)
        for ax, chart in zip(axes[0], charts, strict=True):
            frame = chart.shape(result)
            for label, rows in frame.groupby("series", sort=False):
                ax.plot(rows["x"], rows["y"], marker="o", label=label)
            if chart.log_x and (frame["x"] > 0).all():  # doubling counts (minibatches): evenly spaced, ticked
                ax.set_xscale("log", base=2)
                ax.set_xticks(sorted(frame["x"].unique()), [f"{x:g}" for x in sorted(frame["x"].unique())])
            elif chart.integer_x:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set(xlabel=chart.xlabel, ylabel=chart.ylabel, title=chart.title)
            ax.legend(fontsize=7)
        fig.tight_layout()
        written.append(out / f"{result.probe}.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    return written
