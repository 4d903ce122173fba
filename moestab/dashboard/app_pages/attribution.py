"""Attribution: ratio noise and clipping of tokens whose routing flipped vs those whose did not, and
router flip rate against the router's margin."""

import numpy as np
import pandas as pd
import streamlit as st

from moestab.analysis.dashboard_data import margin_bin_centres, stack_runs
from moestab.dashboard.kit import charts, loaders, ui

PAIRS = {
    "update_old": "update vs old: the two forward passes on either side of log w",
    "old_new": "old vs new: free routes before vs after the step's updates",
}

ui.page_header(
    "Attribution",
    "A token is flipped when its expert set differs in at least one recorded layer between two route sets. "
    "Do flipped tokens carry the large |log w| and the clipping? (recorded tokens)",
)
pair = st.radio("Flip defined by", list(PAIRS), format_func=PAIRS.get, horizontal=True)
if pair == "update_old":
    st.caption(
        "Under R2, R3 and TRR both sides of log w replay the same routes (`routes_update` = `routes_old`), so no "
        "token flips: the ratio noise there comes from the weights alone."
    )
runs = ui.selected_runs()
if not runs:
    st.stop()
colors = {run.label: charts.color(i) for i, run in enumerate(runs)}

results = {}
reading = charts.placeholder("the attribution charts: reading the runs' per-token tables")
for run in runs:
    loaded = loaders.attribution(run.path, run.key, pair)
    if ui.report(run, loaded, "per-token tables"):
        results[run.label] = loaded.value
reading.empty()
if not results:
    st.stop()

groups = pd.concat([r.groups.assign(run=label) for label, r in results.items()], ignore_index=True)
groups["group"] = groups["flipped"].map({False: "not flipped", True: "flipped", "all": "all"})
for label, r in results.items():
    flipped = r.groups.loc[r.groups["flipped"].eq(True), "tokens"]
    if int(flipped.sum()) == 0:
        st.caption(f"**{label}**: no flipped token for this pair (nothing to attribute).")

st.header("|log w| and clipping, flipped vs not")
cells = st.columns(3)
panels = [
    ("mean_abs_log_w", "Mean |log w|", "|log w| (nats)"),
    ("q99_abs_log_w", "0.99 quantile of |log w|", "|log w| (nats)"),
    ("clip_frac", "Clipped share", "% of tokens clipped"),
]
kept = groups.loc[groups["group"] != "all"].reset_index(drop=True)
for cell, (column, title, ylabel) in zip(cells, panels, strict=True):
    data = kept[["run", "group", "tokens", column]]
    with cell:
        chart = charts.grouped_bars(data, "group", column, colors, groups=["not flipped", "flipped"], title=title,
                                    ylabel=ylabel, percent=column == "clip_frac")
        charts.show(chart, data, f"{title} of flipped and unflipped tokens per run")
st.dataframe(
    groups[
        ["run", "group", "tokens", "mean_abs_log_w", "median_abs_log_w", "q99_abs_log_w", "clip_frac", "extreme_frac"]
    ],
    hide_index=True,
    width="stretch",
)

st.header("Flip rate against router margin")
st.caption(
    "Per router (token × layer): share whose expert set flipped, in quantile bins of the margin between "
    "the k-th and (k+1)-th router score under pi_old. Near-ties (small margins) should flip more."
)
margins = stack_runs({label: margin_bin_centres(r.by_margin) for label, r in results.items() if len(r.by_margin)})
if len(margins):
    chart = charts.lines(
        margins,
        "margin",
        "flip_rate",
        title=f"Router flip rate vs margin ({pair.replace('_', ' vs ')})",
        xlabel="router margin under pi_old (score gap, bin centre)",
        ylabel="% of routers flipped",
        colors=colors,
        log_x=bool((margins["margin"] > 0).all()),
        percent=True,
    )
    cell, _ = st.columns([3, 2])
    with cell:
        charts.show(chart, margins, "Router flip rate against router margin per run")
else:
    st.info("No router margins recorded (`margin_old`) in the selected runs.")

st.header("How much do flips explain?")
explained = pd.concat([r.explained.assign(run=label) for label, r in results.items()], ignore_index=True)
st.caption(
    "For clipped and extreme (|log w| > ln 2) tokens: the share that flipped against the base flip rate; "
    "lift > 1 means flips are over-represented among them."
)
SHARE = "%.1f%%"
st.dataframe(
    explained[["run", *[c for c in explained.columns if c != "run"]]].replace({np.inf: np.nan}).assign(
        **{c: lambda f, c=c: f[c] * 100 for c in ("flip_rate_in_event", "base_flip_rate", "event_rate_flipped",
                                                 "event_rate_unflipped")}),
    hide_index=True,
    width="stretch",
    column_config={
        "event": st.column_config.TextColumn("tokens", help="clipped: the loss clipped their ratio; extreme: "
                                             "|log w| > ln 2"),
        "events": st.column_config.NumberColumn("how many"),
        "flip_rate_in_event": st.column_config.NumberColumn("flipped among them", format=SHARE,
                                                            help="P(flip | event), % of these tokens"),
        "base_flip_rate": st.column_config.NumberColumn("flipped among all tokens", format=SHARE,
                                                        help="P(flip), % of every recorded token"),
        "lift": st.column_config.NumberColumn("over-representation of flips", format="%.2fx",
                                              help="flipped among them / flipped among all: above 1x, flips are "
                                              "over-represented among these tokens"),
        "event_rate_flipped": st.column_config.NumberColumn("share of flipped tokens with the event", format=SHARE),
        "event_rate_unflipped": st.column_config.NumberColumn("share of unflipped tokens with the event",
                                                              format=SHARE),
    },
)
