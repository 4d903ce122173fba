"""The figures of `moestab analyze --plots` (moestab.analysis.plots) on a synthetic run: the eval curve starts with the
eval at start (step 0, run.json's warm start), step axes tick whole steps only, and every axes has a y label."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from moestab.analysis.plots import CURVE_KEYS, plot_curves, run_figures
from moestab.metrics import keys
from tests.support.runs import write_run

EVAL_PANEL = [key for key, _, _ in CURVE_KEYS].index(keys.EVAL_ACCURACY)


def eval_points(fig) -> list[tuple[float, float]]:
    """(step, accuracy) of each point of the one line of the eval accuracy panel."""
    (line,) = fig.axes[EVAL_PANEL].get_lines()
    return list(zip(line.get_xdata().tolist(), line.get_ydata().tolist(), strict=True))


def test_the_eval_curve_starts_with_the_eval_at_start(fake_run):
    figures = run_figures(fake_run.path)
    # conftest: warm start 0.25 (run.json, not a metrics.jsonl line), evals 0.5 at step 1 and 0.625 at step 3; drawn
    # in percent, as every surface shows accuracy.
    assert eval_points(figures["curves.png"]) == [(0, 25.0), (1, 50.0), (3, 62.5)]
    # The other panels are per-step metrics: no step 0.
    for ax in figures["curves.png"].axes[:EVAL_PANEL]:
        (line,) = ax.get_lines()
        assert line.get_xdata().tolist() == [1, 2, 3]


def test_several_runs_each_start_from_their_own_start_eval(tmp_path):
    runs = {name: write_run(tmp_path, name, seed=i) for i, name in enumerate(["a", "b"])}
    metrics = pd.concat([pd.DataFrame(run.metrics).assign(run=name) for name, run in runs.items()], ignore_index=True)
    fig = plot_curves(metrics, {"a": 0.125, "b": float("nan")})  # b: no start eval recorded
    lines = {line.get_label(): line for line in fig.axes[EVAL_PANEL].get_lines()}
    assert lines["a"].get_xdata().tolist() == [0, 1, 3] and lines["a"].get_ydata()[0] == 12.5
    assert lines["b"].get_xdata().tolist() == [1, 3]


def test_every_axes_has_a_y_label_and_step_axes_tick_whole_steps(fake_run):
    figures = run_figures(fake_run.path)
    assert set(figures) == {"curves.png", "volatility_old_new.png", "volatility_rollout_old.png",
                            "volatility_rollout_old_free.png", "ratios.png", "attribution.png"}
    step_axes = 0
    for name, fig in figures.items():
        for ax in fig.axes:  # colour bars included: their label is their y label
            assert ax.get_ylabel().strip(), f"{name}: axes {ax.get_title()!r} has no y label"
            if ax.get_xlabel() != "step":
                continue
            step_axes += 1
            locator = ax.xaxis.get_major_locator()
            assert isinstance(locator, MaxNLocator) and locator._integer, f"{name}: {type(locator).__name__}"
            low, high = sorted(ax.get_xlim())
            ticks = np.asarray([t for t in ax.get_xticks() if low <= t <= high])
            assert len(ticks) >= 2 and np.array_equal(ticks, ticks.round()), f"{name}: x ticks {ticks}"
    assert step_axes == 7  # the four curves (routing change among them) and the three heatmaps

