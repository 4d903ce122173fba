"""Experts: expert load per layer, load entropy over steps, dead experts and co-activation."""

import pandas as pd
import streamlit as st

from moestab.analysis.dashboard_data import load_at_step, matrix_frame
from moestab.analysis.experts import metrics_load, metrics_per_layer
from moestab.dashboard.kit import charts, loaders, ui
from moestab.metrics import keys

ui.page_header(
    "Experts",
    "Load = share of a layer's routed slots that chose each expert under pi_old. Load heatmaps and entropy "
    "come from metrics.jsonl (all tokens); dead experts and co-activation from the recorded tokens.",
)
runs = ui.selected_runs()
if not runs:
    st.stop()

METRIC_KEYS = (keys.EXPERTS_LOAD, keys.EXPERTS_LOAD_ENTROPY)
"""The metrics.jsonl keys this page draws (the others are not held)."""
infos = {run.label: loaders.info(run.path, run.key).value for run in runs}
all_steps = sorted(
    {
        int(step)
        for run in runs
        for frame in [loaders.metrics(run.path, run.key, METRIC_KEYS).value]
        if frame is not None
        for step in frame["step"]
    }
)
step = all_steps[-1] if all_steps else 0
if len(all_steps) > 1:
    step = st.select_slider(
        "Step of the load heatmaps (a run without it shows its last step before)", options=all_steps, value=step
    )
layer_count = max(len(info.recorded_layers) for info in infos.values())
layer_index = 0
if layer_count > 1:
    first = next(info for info in infos.values() if len(info.recorded_layers) == layer_count)
    layer_index = st.selectbox(
        "Co-activation layer",
        range(layer_count),
        format_func=lambda i: f"MoE layer {first.recorded_layers[i]}",
    )

st.caption("One expander per run (the first open); notes about a run's files come before them.")
for index, run in enumerate(runs):
    info = infos[run.label]
    loaded = loaders.metrics(run.path, run.key, METRIC_KEYS)
    frame = loaded.value if ui.report(run, loaded, "metrics (metrics.jsonl)", missing="completed step") else None
    has_layer = layer_index < len(info.recorded_layers)
    coact = loaders.coactivation(run.path, run.key, int(layer_index)) if has_layer else None
    coact_ok = coact is not None and ui.report(run, coact, "per-token routes", missing="per-token tables")
    stats = loaders.expert_stats(run.path, run.key)
    stats_ok = ui.report(run, stats, "per-token routes", missing="per-token tables")
    with st.expander(run.label, expanded=index == 0, icon=":material/grid_view:"):
        load_cell, entropy_cell, coact_cell = st.columns(3)
        with load_cell:
            load = metrics_load(frame) if frame is not None else pd.DataFrame()
            if len(load):
                shown, grid = load_at_step(load, step)
                chart = charts.heatmap(grid, "expert", "layer", "load", title=f"Expert load at step {shown}",
                                       xlabel="expert", ylabel="MoE layer", legend="% of routed slots",
                                       domain=(0.0, None), percent=True)
                charts.show(chart, grid, f"Heatmap of expert load by layer for {run.label}", value="load")
            elif frame is not None:
                st.caption(f"metrics.jsonl has no `{keys.EXPERTS_LOAD}`.")
        with entropy_cell:
            entropy = metrics_per_layer(frame, keys.EXPERTS_LOAD_ENTROPY) if frame is not None else pd.DataFrame()
            if len(entropy):
                chart = charts.lines(entropy, "step", "value", series="layer", title="Load entropy per layer",
                                     xlabel="step", ylabel="entropy of the load (nats)", integer_x=True)
                charts.show(chart, entropy, f"Load entropy per layer against step for {run.label}",
                            value="value")
            elif frame is not None:
                st.caption(f"metrics.jsonl has no `{keys.EXPERTS_LOAD_ENTROPY}`.")
        with coact_cell:
            if not has_layer:
                st.caption(f"{run.label} records {len(info.recorded_layers)} layer(s).")
            elif coact_ok:
                label = info.recorded_layers[int(layer_index)]
                grid = matrix_frame(coact.value, "expert_i", "expert_j", "share")
                chart = charts.heatmap(grid, "expert_j", "expert_i", "share",
                                       title=f"Co-activation, layer {label}: P(j chosen | i chosen)",
                                       xlabel="expert j", ylabel="expert i", legend="% of i's tokens choosing j",
                                       domain=(0.0, 1.0), scheme="magma", percent=True)
                charts.show(chart, grid, f"Co-activation matrix of layer {label} for {run.label}")
        if stats_ok:
            st.caption("Over every recorded token of the run (routes under pi_old); dead = never chosen.")
            st.dataframe(stats.value, hide_index=True, width="stretch")
