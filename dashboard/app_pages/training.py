"""Training: step curves of metrics.jsonl for the selected runs, overlaid."""

import pandas as pd
import streamlit as st
from dashkit import charts, loaders, ui

from moestab.analysis.dashboard_data import metric_curve, stack_runs

# (metrics.jsonl key, chart title, y label with units). Keys absent from every run are skipped.
CURVES = [
    ("reward/mean", "Reward (mean over the rollout batch)", "reward"),
    ("accuracy", "Rollout accuracy", "fraction of responses correct"),
    ("eval/accuracy", "Eval accuracy (greedy, fixed eval set; step 0 = start)", "fraction correct"),
    ("response/length_mean", "Response length (mean)", "tokens"),
    ("loss", "Policy loss (mean over minibatches)", "loss"),
    ("loss/kl/old_new_k3", "KL(pi_old ‖ pi_new), k3 estimate", "nats per token"),
    ("mismatch/rollout_old/k3", "Rollout vs pi_old as used in the ratio, k3 (R3 / TRR lower it)", "nats per token"),
    ("mismatch/rollout_old_free/k3", "Rollout vs the trainer's free pi_old, k3", "nats per token"),
    ("grad_norm", "Gradient norm (before clipping, mean over minibatches)", "L2 norm"),
    ("clip/token_frac_later", "Clipped tokens, minibatches 2..n (GSPO Fig. 2)", "fraction of tokens"),
    ("clip/seq_frac_later", "Sequences with a clipped token, minibatches 2..n", "fraction of sequences"),
    ("ratio/token_log_var", "Var(log w) over the step's tokens", "nats²"),
    ("ratio/seq_log_var", "Var(log s) over the step's sequences", "nats²"),
    ("entropy", "Policy entropy on response tokens", "nats per token"),
    ("time/step_s", "Wall time per step", "seconds"),
]

ui.page_header(
    "Training",
    "Per-step aggregates from metrics.jsonl (all response tokens of each step), one line per selected run.",
)
runs = ui.selected_runs()
if not runs:
    st.stop()

frames: dict[str, pd.DataFrame] = {}
start_accuracy: dict[str, float] = {}  # eval accuracy of the starting policy, drawn at step 0
for run in runs:
    loaded = loaders.metrics(run.path, run.key)
    if not ui.report(run, loaded, "metrics (metrics.jsonl)", missing="completed step"):
        continue
    frames[run.label] = loaded.value
    info = loaders.info(run.path, run.key).value
    if info is not None and info.warm_start_accuracy is not None:
        start_accuracy[run.label] = info.warm_start_accuracy

colors = {run.label: charts.color(i) for i, run in enumerate(runs)}
curves = [c for c in CURVES if any(c[0] in frame for frame in frames.values())]
if frames and curves:
    cells = ui.grid(len(curves), per_row=3)
    for cell, (key, title, ylabel) in zip(cells, curves, strict=True):
        start = start_accuracy if key == "eval/accuracy" else {}
        data = stack_runs({label: metric_curve(frame, key, start.get(label))
                           for label, frame in frames.items() if key in frame})
        chart = charts.lines(data, "step", "value", title=title, xlabel="step", ylabel=ylabel, colors=colors,
                             integer_x=True, points=key == "eval/accuracy" or None)
        with cell:
            charts.show(chart, data, f"{title} against step")
    with st.expander("Raw metrics"):
        for label, frame in frames.items():
            st.markdown(f"**{label}**")
            st.dataframe(frame.select_dtypes("number"), hide_index=True)
