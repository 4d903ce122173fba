"""Ratios: distributions of the token log-ratio log w and the sequence log-ratio log s, clipping,
and their variance against response length (recorded tokens)."""

import pandas as pd
import streamlit as st
from dashkit import figures, loaders, ui

from moestab.analysis.dashboard_data import shared_histograms

ui.page_header(
    "Ratios",
    "log w = logp_update − logp_old per token (the ratio that entered the loss); log s = mean of log w over "
    "a response (GSPO's sequence ratio). From the per-token tables (recorded sequences).",
)
runs = ui.selected_runs()
if not runs:
    st.stop()
colors = {run.label: figures.color(i) for i, run in enumerate(runs)}

data: dict[str, dict] = {}
for run in runs:
    loaded = loaders.ratios(run.path, run.key)
    if ui.report(run, loaded, "per-token tables"):
        data[run.label] = loaded.value
if not data:
    st.stop()

st.header("Distributions")
bins = st.slider("Histogram bins", 10, 120, 50, step=10)
cells = st.columns(2)
for cell, (name, title, unit) in zip(
    cells,
    [
        ("log_w", "Token log-ratio log w", "log w (nats)"),
        ("log_s", "Sequence log-ratio log s", "log s (nats)"),
    ],
    strict=True,
):
    hists = shared_histograms({label: d[name] for label, d in data.items()}, bins=bins)
    with cell:
        fig = figures.stairs(hists, colors, f"{title} (shared bins; ends hold the tails)", unit, "share of values")
        figures.show(fig, alt=f"Histogram of {name} per run")

quantiles = pd.concat([d["quantiles"].assign(run=label) for label, d in data.items()], ignore_index=True).set_index(
    ["run", "quantity"]
)
st.dataframe(quantiles, width="stretch")

st.header("Clipping over steps")
st.caption(
    "A token counts as clipped when the ratio that governs it was clipped: its own (GRPO) or its sequence's "
    "(GSPO), as GSPO Fig. 2 compares them. Minibatches 2..n only: the first minibatch's ratio is 1 by construction."
)
cells = st.columns(2)
for cell, (column, title, ylabel) in zip(
    cells,
    [
        ("token_frac_later", "Clipped tokens (minibatches 2..n)", "fraction of recorded tokens"),
        ("seq_frac_later", "Sequences with a clipped token (minibatches 2..n)", "fraction of recorded sequences"),
    ],
    strict=True,
):
    series = [
        figures.Series(
            label, d["clip_by_step"]["step"].to_numpy(), d["clip_by_step"][column].to_numpy(float), colors[label]
        )
        for label, d in data.items()
    ]
    with cell:
        figures.show(figures.lines(series, title, "step", ylabel, integer_x=True), alt=f"{title} by step")

st.header("Variance against response length")
cells = st.columns(2)
for cell, (column, title) in zip(
    cells,
    [("var_log_w", "Variance of log w (over tokens)"), ("var_log_s", "Variance of log s (over sequences)")],
    strict=True,
):
    series = [
        figures.Series(
            label, d["by_length"]["length_bin"].to_numpy(), d["by_length"][column].to_numpy(float), colors[label]
        )
        for label, d in data.items()
    ]
    with cell:
        fig = figures.lines(series, title, "response length (tokens, bin start)", "variance (nats²)", logx=True)
        figures.show(fig, alt=f"{title} by response length")
