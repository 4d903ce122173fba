"""Training: step curves of metrics.jsonl for the selected runs, overlaid."""

import pandas as pd
import streamlit as st

from moestab.analysis.compare import DRAWN_STEPS, thin
from moestab.analysis.dashboard_data import COLLAPSE_MARK_KEYS, collapse_marks, metric_curve, stack_runs
from moestab.analysis.labels import is_percent
from moestab.dashboard.kit import charts, loaders, ui
from moestab.metrics import keys

# (metrics.jsonl key, chart title, y label with units). Keys absent from every run are skipped.
CURVES = [
    (keys.REWARD_MEAN, "Reward (mean over the rollout batch)", "reward"),
    (keys.ACCURACY, "Rollout accuracy", "% of responses correct"),
    (keys.EVAL_ACCURACY, "Eval accuracy (greedy, fixed eval set; step 0 = start)", "% correct"),
    (keys.RESPONSE_LENGTH_MEAN, "Response length (mean)", "tokens"),
    (keys.LOSS, "Policy loss (mean over minibatches)", "loss"),
    (keys.LOSS_KL_OLD_NEW_K3, "KL from pi_old to the updated policy, k3 estimate", "nats per token"),
    (keys.MISMATCH_K3.format(pair="rollout_old"), "Rollout vs pi_old as used in the ratio, k3 (R3 / TRR lower it)",
     "nats per token"),
    (keys.MISMATCH_K3.format(pair="rollout_old_free"), "Rollout vs the trainer's free pi_old, k3", "nats per token"),
    (keys.GRAD_NORM, "Gradient norm (before clipping, mean over minibatches)", "L2 norm"),
    (keys.CLIP_TOKEN_FRAC_LATER, "Clipped tokens, minibatches 2..n (GSPO Fig. 2)", "% of tokens"),
    (keys.CLIP_SEQ_FRAC_LATER, "Sequences with a clipped token, minibatches 2..n", "% of sequences"),
    (keys.RATIO_TOKEN_LOG_VAR, "Variance of the token log-ratio log w", "nats²"),
    (keys.RATIO_SEQ_LOG_VAR, "Variance of the sequence log-ratio log s", "nats²"),
    (keys.ROUTING_SHARE_VAR, "Routing's share of the variance of log w (--routing-share)",
     "% of the variance of log w"),
    (keys.ROUTING_SHARE_LOG_VAR_FREE, "Variance of log w, free routing at the update (--routing-share)", "nats²"),
    (keys.ROUTING_SHARE_LOG_VAR_REPLAYED, "Variance of log w, pi_old's routes replayed (--routing-share)", "nats²"),
    (keys.ENTROPY, "Policy entropy on response tokens", "nats per token"),
    (keys.TIME_STEP, "Wall time per step", "seconds"),
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
    drawn = tuple(dict.fromkeys([*(key for key, _, _ in CURVES), *COLLAPSE_MARK_KEYS]))  # what is drawn, not the file
    loaded = loaders.metrics(run.path, run.key, drawn)
    if not ui.report(run, loaded, "metrics (metrics.jsonl)", missing="completed step"):
        continue
    frames[run.label] = loaded.value
    info = loaders.info(run.path, run.key).value
    if info is not None and info.warm_start_accuracy is not None:
        start_accuracy[run.label] = info.warm_start_accuracy

colors = {run.label: charts.color(i) for i, run in enumerate(runs)}
curves = [c for c in CURVES if any(c[0] in frame for frame in frames.values())]
marks = stack_runs({label: collapse_marks(frame, start_accuracy.get(label)) for label, frame in frames.items()})
if len(marks):
    st.caption("Vertical rules: collapse warnings (dashed: the run's `collapse/warning`, or the default rule over its "
               "metrics) and collapse onsets (solid: the first evaluation from which eval accuracy stays more than 5 "
               "points below the start, in a run that ends more than 10 below it). docs/collapse.md says what the "
               "warning's rule can and cannot promise.")
if frames and curves:
    cells = ui.grid(len(curves), per_row=3)
    for cell, (key, title, ylabel) in zip(cells, curves, strict=True):
        start = start_accuracy if key == keys.EVAL_ACCURACY else {}
        data, width = thin(stack_runs({label: metric_curve(frame, key, start.get(label))
                                       for label, frame in frames.items() if key in frame}))
        data = charts.marked(data, marks[marks.run.isin(data.run)] if len(marks) else marks)
        chart = charts.with_marks(charts.lines(data, "step", "value", title=title, xlabel="training step",
                                               ylabel=ylabel, colors=colors, integer_x=True,
                                               points=key == keys.EVAL_ACCURACY or None, percent=is_percent(key)),
                                  data, "step", colors)
        with cell:
            charts.show(chart, data, f"{title} against step", value="value")
            if width > 1:
                st.caption(f"Over {DRAWN_STEPS:,} steps: each point is the mean of {width:,} consecutive steps.")
    with st.expander("Raw metrics (the keys drawn above; the Compare page draws any key)"):
        for label, frame in frames.items():
            st.markdown(f"**{label}**")
            st.dataframe(frame.select_dtypes("number"), hide_index=True)
