"""Figures of a probe result: flip rate against router margin and change by layer (compare, numerics), and the
saturation heatmap of layer x checkpoint."""

from __future__ import annotations

from pathlib import Path

from moestab.probes.folder import ProbeResult


def plot_probe(result: ProbeResult, out: str | Path) -> list[Path]:
    """Write the result's PNG figures to ``out``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if "by_margin" in result.tables:
        margin, layer = result.tables["by_margin"], result.tables["by_layer"]
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        groups = margin.groupby("comparison") if "comparison" in margin else [(result.probe, margin)]
        for label, rows in groups:
            middle = (rows["margin_low"] + rows["margin_high"]) / 2
            left.plot(middle, rows["flip_rate"], marker="o", label=label)
        left.set(xlabel="router margin (k-th minus (k+1)-th selection score), bin middle", ylabel="router flip rate",
                 title="flips against router margin")
        left.legend(fontsize=7)
        groups = layer.groupby("comparison") if "comparison" in layer else [(result.probe, layer)]
        for label, rows in groups:
            right.plot(rows["layer"], rows["router_flip"], marker="o", label=label)
        right.set(xlabel="layer", ylabel="router flip rate", title="flips by layer")
        fig.tight_layout()
        written.append(out / f"{result.probe}_flips.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    if "saturation" in result.tables:
        table = result.tables["saturation"]
        wide = table.pivot(index="checkpoint", columns="layer", values="saturation").loc[
            list(dict.fromkeys(table["checkpoint"]))]
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
    return written
