"""Compare: the selected runs grouped by their config, each group's seeds as mean ± sd per step, outcome (reward, eval
accuracy) beside routing volatility, rollout -> trainer mismatch, ratio variance and clipping on one step axis; and
"by how much": each group's mean ± se over one step window that is the same for every run, and the paired difference
of two groups over seeds with its 95% interval.

Grouping, the mean and sd over seeds, smoothing, the list of keys, the step window, the group means and the paired
difference are :mod:`moestab.analysis.compare`'s, titles, units and the text of a value
:mod:`moestab.analysis.labels`'; this page lays out its widgets, tables and charts."""

import pandas as pd
import streamlit as st

from moestab.analysis.compare import (
    ABSENT,
    DEFAULT_KEYS,
    DRAWN_STEPS,
    SEED_FIELD,
    aggregate,
    common_steps,
    config_table,
    curves,
    default_group_fields,
    describe,
    group_labels,
    group_members,
    group_stats,
    key_counts,
    label_fields,
    named_values,
    paired_difference,
    runs_without,
    smooth,
    step_domain,
    step_ranges,
    style_fields,
    thin,
    varying_fields,
    window_means,
)
from moestab.analysis.labels import format_value, metric_label
from moestab.dashboard.kit import charts, loaders, ui
from moestab.metrics import keys

MEAN, EACH = "mean ± sd over a group's runs", "each run"
METRICS_BOX = "compare_metrics"
GROUP, NO_DASH = "group", "none"

ui.page_header(
    "Compare",
    "Did routing volatility rise, and did it hurt one objective more than another? Runs grouped by what their "
    "run.json config says; each group's runs (seeds) drawn as mean ± sd per step, from metrics.jsonl (every "
    "response token of each step).",
)
ctx = ui.context()
runs = ui.selected_runs()
if not runs:
    st.stop()

hidden = ui.left_out(ctx)
if hidden:
    st.info(
        f"Comparing {len(runs)} of {len(ctx.runs)} runs found. Not shown: {ui.left_out_text(hidden)}.",
        icon=":material/visibility_off:",
    )

# Only the keys drawn are held (a metrics.jsonl of 1 GB holds ~100 keys a step): those chosen in the box below at the
# last rerun, else the first view's. The same pass names every key the box offers.
drawn = tuple(sorted(set(st.session_state.get(METRICS_BOX) or DEFAULT_KEYS)))
frames: dict[str, pd.DataFrame] = {}
names: dict[str, frozenset[str]] = {}
configs: dict[str, dict] = {}
starts: dict[str, float] = {}  # eval accuracy of the starting policy, drawn at step 0
for run in runs:
    loaded, names[run.label] = loaders.metrics_and_names(run.path, run.key, drawn)
    if not ui.report(run, loaded, "metrics (metrics.jsonl)", missing="completed step"):
        continue  # said why (no step yet, or unreadable)
    info = loaders.info(run.path, run.key).value
    frames[run.label], configs[run.label] = loaded.value, info.config
    if info.warm_start_accuracy is not None:
        starts[run.label] = info.warm_start_accuracy
if not frames:
    st.stop()

table = config_table(configs)
varying = varying_fields(table)
group_cell, colour_cell, dash_cell, mode_cell = st.columns([3, 2, 2, 2])
with group_cell:
    group_by = st.multiselect(
        "Group by", varying, default=default_group_fields(varying, table), key="compare_group_by",
        help="run.json config fields whose value differs among the runs. Runs with equal values share a group "
        "(seed, out and other fields that only tell runs apart, and fields that differ only by being absent from "
        "some runs, are left out at first, so seeds fall together).",
    )
first_colour, first_dash = style_fields(group_by, table)
with colour_cell:
    colour_options = [GROUP, *group_by]
    color_by = st.selectbox("Colour by", colour_options, index=colour_options.index(first_colour or GROUP),
                            key="compare_color", help="A group field (each of its values one colour), or the group.")
with dash_cell:
    dash_options = [NO_DASH, *(field for field in group_by if field != color_by)]
    dash_by = st.selectbox("Dash by", dash_options, key="compare_dash",
                           index=dash_options.index(first_dash) if first_dash in dash_options else 0,
                           help="A second group field drawn as line style.")
with mode_cell:
    mode = st.radio("Draw", [MEAN, EACH], key="compare_mode")
weight = st.slider(
    "Smoothing (EMA weight; 0 = off)", 0.0, 0.99, 0.0, 0.01, key="compare_smoothing",
    help="Each run's curve is averaged with weights weight^age (TensorBoard's debiased EMA) before the mean over "
    "its group, so the band is the spread of the smoothed runs.",
)
available = key_counts({label: names[label] for label in frames})
chosen = st.multiselect(
    "Metrics (type to search)", list(available), default=[key for key in DEFAULT_KEYS if key in available],
    format_func=lambda key: f"{key} ({available[key]}/{len(frames)} runs)", key=METRICS_BOX,
    help="Every scalar metrics.jsonl key of the selected runs (docs/metrics.md); the count says how many runs "
    "logged it.",
)

groups = group_labels(table, group_by)
group_of = groups.to_dict()
members = group_members(groups)
fields = [field for field in (color_by, dash_by) if field not in (GROUP, NO_DASH)]
color_values = list(members) if color_by == GROUP else list(dict.fromkeys(named_values(table, color_by)))
colors = charts.value_colors(color_values)
st.dataframe(
    pd.DataFrame({"group": list(members), "runs": [len(r) for r in members.values()],
                  "run folders": [", ".join(r) for r in members.values()]}),
    hide_index=True, width="stretch",
)
if mode == MEAN and all(len(r) == 1 for r in members.values()):
    st.caption("Every group holds one run: no sd band. Group by fewer fields, or add seeds.")

missing = {key: runs_without(frames, key) for key in chosen}
missing = {key: labels for key, labels in missing.items() if labels}
if missing:
    st.info(
        "Not every run has every chosen metric (its metrics.jsonl lacks the key: another trainer, e.g. TRL or a "
        "diagnostics run, or a setting that does not log it); those runs are left out of that chart: "
        + "; ".join(f"`{key}`: {', '.join(labels)}" for key, labels in missing.items()) + ".",
        icon=":material/info:",
    )



def steps_text(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first}–{last}"


def by_how_much(window: tuple[int, int]) -> None:
    """Each group's mean ± se over ``window`` and the paired difference of two groups, one row per chosen metric."""
    raw = {key: curves(frames, key) for key in chosen}  # unsmoothed: the mean over the window is the smoothing
    means = {key: window_means(data, window) for key, data in raw.items() if len(data)}
    rows = []
    for key, per_run in means.items():
        label = metric_label(key)
        for stat in group_stats(per_run, group_of).itertuples():
            rows.append({"metric": label.title, "group": stat.group, "runs": stat.runs,
                         "mean": format_value(stat.mean, label.percent), "± se": format_value(stat.se, label.percent),
                         "unit": label.unit})
    if rows:
        st.markdown(f"**Each group's mean ± se over its runs**, {steps_text(*window)}")
        st.table(pd.DataFrame(rows).set_index("metric"))
    if len(members) < 2:
        st.caption("One group: no difference to take. Group by a field that tells conditions apart.")
        return
    names = list(members)
    first_cell, second_cell = st.columns(2)
    with first_cell:
        a = st.selectbox("Paired difference: group", names, index=0, key="compare_diff_a")
    with second_cell:
        rest = [name for name in names if name != a]
        b = st.selectbox("minus group", rest, index=0, key="compare_diff_b")
    seeds = table[SEED_FIELD].to_dict() if SEED_FIELD in table else dict.fromkeys(table.index, ABSENT)
    rows, unpaired = [], {}
    for key, per_run in means.items():
        label = metric_label(key)
        diff = paired_difference(per_run, group_of, seeds, a, b)
        if diff.unpaired:
            unpaired[label.title] = diff.unpaired
        ci = diff.interval
        if ci is None:
            continue
        interval = (f"{format_value(ci.low, label.percent, difference=True)} to "
                    f"{format_value(ci.high, label.percent, difference=True)}") if ci.n > 1 else ""
        rows.append({"metric": label.title, "seeds paired": ci.n,
                     "difference": format_value(ci.mean, label.percent, difference=True),
                     "95% interval": interval, "seeds": ", ".join(diff.pairs["seed"])})
    if rows:
        st.markdown(f"**{a} − {b}**, run against run of the same seed, {steps_text(*window)}: the mean of the seeds' "
                    "differences and its 95% t-interval (differences of shares in percentage points, pp)")
        st.table(pd.DataFrame(rows).set_index("metric"))
    else:
        st.info(f"No seed has a run in both {a} and {b}: nothing to pair.", icon=":material/link_off:")
    for title, runs in unpaired.items():
        st.caption(f"Left out of the pairs of *{title}*: " + "; ".join(f"**{run}** ({why})" for run, why in runs) + ".")


st.subheader("By how much")
common = common_steps(frames)
if common is None:
    st.info("The selected runs have no step in common, so no step window is the same for every run: choose runs "
            "that overlap on the Runs page.", icon=":material/info:")
elif chosen:
    first, last = common
    window = common
    if first < last:
        window = st.slider(
            "Step window (the same for every run)", first, last, common, key="compare_window",
            help="Each run's mean is taken over these steps only. At first: every step all selected runs have.",
        )
    ranges = step_ranges(frames)
    beyond = [f"{run} ({steps_text(*span)})" for run, span in ranges.items() if span != common]
    st.caption(
        f"Every run's mean over {steps_text(*window)}, the same steps for every run; the steps all selected runs "
        f"have are {steps_text(*common)}."
        + (f" Steps outside them are left out of these runs' means: {', '.join(beyond)}." if beyond else "")
        + " Then each group's mean over its runs, ± its standard error (sd over the runs / √runs; blank with one "
        "run). Means of unsmoothed values."
    )
    by_how_much(window)

if not chosen:
    st.info("Choose metrics to draw in the box above (type part of a key to search).", icon=":material/search:")
shown, widths = {}, {}
for key in chosen:  # smoothed on every step, then thinned for drawing (DRAWN_STEPS a run at most)
    shown[key], widths[key] = thin(smooth(curves(frames, key, starts if key == keys.EVAL_ACCURACY else None), weight))
if any(width > 1 for width in widths.values()):
    st.caption(f"Runs longer than {DRAWN_STEPS:,} steps are drawn thinned: each point is the mean of "
               f"{max(widths.values()):,} consecutive steps (the means above use every step).")
domain = step_domain(shown.values())
for cell, (key, data) in zip(ui.grid(len(shown), per_row=3), shown.items(), strict=True):
    with cell:
        if not len(data):
            st.info(f"No selected run has `{key}`.", icon=":material/help:")
            continue
        dash = None if dash_by == NO_DASH else dash_by
        label = metric_label(key)
        style = {"color_by": color_by, "dash_by": dash, "colors": colors, "title": label.title, "ylabel": label.unit,
                 "x_domain": domain, "percent": label.percent}
        if mode == MEAN:
            frame = label_fields(aggregate(data, group_of), table, group_of, fields)
            chart = charts.group_lines(frame, "mean", series=GROUP, band=("low", "high"), tooltip=["sd", "n"], **style)
            alt_text = f"{key} against step, mean ± sd by group"
        else:
            frame = label_fields(data.assign(group=data["run"].map(group_of)), table, group_of, fields)
            chart = charts.group_lines(frame, "value", series="run", tooltip=[GROUP], **style)
            alt_text = f"{key} against step, each run"
        charts.show(chart, frame, alt_text, value="mean" if "mean" in frame else "value")
        st.caption(f"`{key}`: {describe(key)}" if describe(key) else f"`{key}`")
