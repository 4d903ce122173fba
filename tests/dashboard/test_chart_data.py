"""The dashboard's charts draw the analyzers' numbers.

Each page runs under AppTest on the two real runs; the frame a chart draws (read back from its Vega-Lite dataset)
is compared with what the analyzers return for the run folder, called here directly. (That each chart serves its
frame as CSV and is interactive: tests/dashboard/test_app.py.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from moestab.analysis import load_metrics, load_tokens, read_run_info, run_volatility, volatility_table
from moestab.analysis.attribution import run_attribution
from moestab.analysis.dashboard_data import run_coactivation, shared_histograms
from moestab.analysis.experts import metrics_load, metrics_per_layer
from moestab.analysis.ratios import clip_fractions
from moestab.run_folder import schema
from tests.support.dashboard import Chart, assert_clean, chart_named, open_page

pytestmark = pytest.mark.slow
RUNS = ("gspo-off", "gspo-r2")


def rows(chart: Chart, run: str, by: str = "run") -> pd.DataFrame:
    """The rows of ``chart``'s frame that belong to ``run``."""
    part = chart.data[chart.data[by] == run]
    assert len(part), f"{chart.alt}: no rows of {run}"
    return part.reset_index(drop=True)


def test_training_curves_are_metrics_jsonl(make_app, trained_runs: Path) -> None:
    at = open_page(make_app(trained_runs), "app_pages/training.py")
    assert_clean(at)
    reward = chart_named(at, "Reward (mean over the rollout batch) against step")
    evals = chart_named(at, "Eval accuracy")
    for run in RUNS:
        metrics = load_metrics(trained_runs / run)
        got = rows(reward, run)
        assert got["step"].tolist() == metrics["step"].tolist() == [1, 2, 3, 4, 5, 6]
        np.testing.assert_array_equal(got["value"], metrics["reward/mean"].astype(float))
        # Eval accuracy: the starting policy at step 0, then the eval steps only (every 2nd step).
        logged = metrics.dropna(subset=["eval/accuracy"])
        got = rows(evals, run)
        assert got["step"].tolist() == [0, *logged["step"]] == [0, 2, 4, 6]
        start = read_run_info(trained_runs / run).warm_start_accuracy
        np.testing.assert_array_equal(got["value"], [start, *logged["eval/accuracy"].astype(float)])
    assert reward.data["value"].nunique() > 1  # not a constant that any wiring would reproduce


def test_volatility_heatmaps_and_curves_are_the_analyzers(make_app, trained_runs: Path) -> None:
    at = open_page(make_app(trained_runs), "app_pages/volatility.py")
    assert_clean(at)
    run = trained_runs / "gspo-off"
    metrics = load_metrics(run)
    # Layer x step from metrics.jsonl's per-layer lists (all tokens).
    heat = chart_named(at, "Heatmap of routing change old_new by layer and step for gspo-off").data
    expected = metrics_per_layer(metrics, "routing/old_new/changed_by_layer")
    pd.testing.assert_frame_equal(heat, expected.rename(columns={"value": "changed"}), check_dtype=False)
    assert heat["changed"].max() > 0, "replay off: the router drifts over a step"
    # Layer x position from the per-token tables.
    heat = chart_named(at, "Heatmap of routing change old_new by layer and position for gspo-off").data
    table = volatility_table(run_volatility(run, "old_new"), by=["position_bin", "layer"])
    pd.testing.assert_frame_equal(heat, table[["position_bin", "layer", "changed"]], check_dtype=False)
    # Over steps, for the metric chosen in the box.
    for metric in ("changed", "router_flip"):
        at.selectbox[0].set_value(metric).run()
        curve = rows(chart_named(at, "old → new (trainer, free routing) by step"), "gspo-off")
        np.testing.assert_array_equal(curve["value"], metrics[f"routing/old_new/{metric}"].astype(float))
        by_minibatch = rows(chart_named(at, "update → old (the two sides of log w) by minibatch"), "gspo-r2")
        table = volatility_table(run_volatility(trained_runs / "gspo-r2", "update_old"), by=["minibatch"])
        np.testing.assert_array_equal(by_minibatch["value"], table[metric])
        assert (by_minibatch["value"] == 0).all()  # R2: both sides of log w replay pi_old's routes


def test_ratio_charts_are_the_analyzers(make_app, trained_runs: Path) -> None:
    at = open_page(make_app(trained_runs), "app_pages/ratios.py")
    assert_clean(at)
    columns = [schema.COL_STEP, schema.COL_SEQ, schema.COL_MINIBATCH, schema.COL_LOG_W, schema.COL_CLIPPED]
    tokens = {run: load_tokens(trained_runs / run, columns=columns) for run in RUNS}
    hist = chart_named(at, "Histogram of log_w per run").data
    expected = shared_histograms({run: t[schema.COL_LOG_W].to_numpy() for run, t in tokens.items()}, bins=50)
    pd.testing.assert_frame_equal(hist, expected, check_dtype=False)
    assert hist.groupby("run")["count"].sum().tolist() == [len(tokens[run]) for run in RUNS]
    clipped = chart_named(at, "Clipped tokens (minibatches 2..n) by step")
    for run in RUNS:
        table = clip_fractions(tokens[run], by=["step"])
        np.testing.assert_array_equal(rows(clipped, run)["token_frac_later"], table["token_frac_later"])


def test_attribution_charts_are_the_analyzers(make_app, trained_runs: Path) -> None:
    at = open_page(make_app(trained_runs), "app_pages/attribution.py")
    assert_clean(at)
    mean = chart_named(at, "Mean |log w| of flipped and unflipped tokens per run")
    margin = chart_named(at, "Router flip rate against router margin per run")
    for run in RUNS:
        result = run_attribution(trained_runs / run, "update_old")
        got = rows(mean, run).set_index("group")
        for flipped, group in ((False, "not flipped"), (True, "flipped")):
            (expected,) = result.groups.loc[result.groups["flipped"].eq(flipped), "mean_abs_log_w"]
            np.testing.assert_equal(got.loc[group, "mean_abs_log_w"], expected)  # NaN for R2's empty group
        curve = rows(margin, run)
        np.testing.assert_array_equal(curve["flip_rate"], result.by_margin["flip_rate"])
        assert ((curve["margin"] >= curve["margin_low"]) & (curve["margin"] <= curve["margin_high"])).all()
    assert rows(mean, "gspo-off").set_index("group").loc["flipped", "tokens"] > 0  # replay off: tokens flip


def test_expert_charts_are_the_analyzers(make_app, trained_runs: Path) -> None:
    at = open_page(make_app(trained_runs), "app_pages/experts.py")
    assert_clean(at)
    run = trained_runs / "gspo-off"
    metrics = load_metrics(run)
    load = metrics_load(metrics)
    heat = chart_named(at, "Heatmap of expert load by layer for gspo-off").data
    last = load[load["step"] == load["step"].max()][["layer", "expert", "load"]].reset_index(drop=True)
    pd.testing.assert_frame_equal(heat, last, check_dtype=False)
    entropy = chart_named(at, "Load entropy per layer against step for gspo-off").data
    pd.testing.assert_frame_equal(entropy, metrics_per_layer(metrics, "experts/load_entropy"), check_dtype=False)
    coact = chart_named(at, "Co-activation matrix of layer 0 for gspo-off").data
    matrix = coact.pivot(index="expert_i", columns="expert_j", values="share").to_numpy()
    np.testing.assert_array_equal(matrix, run_coactivation(run, 0))
    assert np.nanmax(matrix - np.diag(np.diag(matrix))) > 0  # experts do pair up
