"""Ratios: distributions of the token log-ratio log w and the sequence log-ratio log s, clipping,
and their variance against response length (recorded tokens)."""

import pandas as pd
import streamlit as st

from moestab.analysis.dashboard_data import shared_histograms, stack_runs
from moestab.analysis.labels import metric_label
from moestab.dashboard.kit import charts, loaders, ui
from moestab.metrics import keys

ui.page_header(
    "Ratios",
    "log w = logp_update − logp_old per token (the ratio that entered the loss); log s = mean of log w over "
    "a response (GSPO's sequence ratio). From the per-token tables (recorded sequences).",
)
runs = ui.selected_runs()
if not runs:
    st.stop()
colors = {run.label: charts.color(i) for i, run in enumerate(runs)}

data: dict[str, dict] = {}
reading = charts.placeholder("the ratio charts: reading the runs' per-token tables")
for run in runs:
    loaded = loaders.ratios(run.path, run.key)
    if ui.report(run, loaded, "per-token tables"):
        data[run.label] = loaded.value
reading.empty()
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
        chart = charts.stairs(hists, colors, title=f"{title} (shared bins; ends hold the tails)", xlabel=unit,
                              ylabel="% of values")
        charts.show(chart, hists, f"Histogram of {name} per run")

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
for cell, (column, title, key) in zip(
    cells,
    [
        ("token_frac_later", "Clipped tokens (minibatches 2..n)", keys.CLIP_TOKEN_FRAC_LATER),
        ("seq_frac_later", "Sequences with a clipped token (minibatches 2..n)", keys.CLIP_SEQ_FRAC_LATER),
    ],
    strict=True,
):
    frame = stack_runs({label: d["clip_by_step"][["step", column]] for label, d in data.items()})
    with cell:
        unit = metric_label(key)  # the key's unit, as every surface writes it (recorded tokens here)
        chart = charts.lines(frame, "step", column, title=title, xlabel="step", ylabel=f"{unit.unit} (recorded)",
                             colors=colors, integer_x=True, percent=unit.percent)
        charts.show(chart, frame, f"{title} by step", value=column)

st.header("Variance against response length")
cells = st.columns(2)
for cell, (column, title) in zip(
    cells,
    [("var_log_w", "Variance of log w (over tokens)"), ("var_log_s", "Variance of log s (over sequences)")],
    strict=True,
):
    frame = stack_runs({label: d["by_length"][["length_bin", column]] for label, d in data.items()})
    with cell:
        chart = charts.lines(frame, "length_bin", column, title=title, xlabel="response length (tokens, bin start)",
                             ylabel="variance (nats²)", colors=colors, log_x=True)
        charts.show(chart, frame, f"{title} by response length")
