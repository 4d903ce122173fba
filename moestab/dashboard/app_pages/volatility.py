"""Routing volatility: how often routers change their experts, over steps, by minibatch and by response position
(the runs overlaid), then per run by layer x step and layer x response position (heatmaps, one expander per run);
old->new and rollout->trainer side by side."""

import numpy as np
import pandas as pd
import streamlit as st

from moestab.analysis.dashboard_data import TOKENS_SOURCE, changed_by_layer_step, routing_by_step, stack_runs
from moestab.analysis.labels import format_value, is_percent
from moestab.dashboard.kit import charts, loaders, ui
from moestab.metrics import keys

PAIR_TITLES = {
    "old_new": "old → new (trainer, free routing)",
    "rollout_old_free": "rollout → trainer (free pi_old)",
    "rollout_old": "rollout → trainer (pi_old as used)",
    "update_old": "update → old (the two sides of log w)",
}
METRICS = {
    "changed": "changed share of routed slots",
    "router_flip": "share of routers whose expert set changed",
    "jaccard_distance": "mean Jaccard distance of expert sets",
    "token_flip": "share of tokens with ≥ 1 changed layer",
}
UPDATE_ROUTES = {  # replay mode (RunInfo.replay) -> routes of pi_old in the ratio and of the update forward
    "off": "both route freely",
    "old": "both use pi_old's free routes (R2): update → old is 0 by construction",
    "rollout": "both use the rollout engine's routes (R3): update → old and rollout → trainer (as used) are 0",
    "rollout-gates": "both use the rollout engine's routes and gate weights (TRR): update → old and rollout → "
                     "trainer (as used) are 0",
    "base": "both use the frozen base's routes, as does the rollout (routing-constant): update → old and rollout → "
            "trainer (as used) are 0; rollout → trainer (free) is the policy's drift from the base",
}

ui.page_header(
    "Routing volatility",
    "Share of routing decisions (token × MoE layer) whose top-k expert set differs between two forward passes.",
)
st.info(
    "**Replayed vs free-running routes.** `routes_old_free` and `routes_new` are always the trainer's *free* "
    "routes (its own top-k, before and after the step's updates), so **old → new is always measured with "
    "free routing**: it shows how far the router drifts even when Routing Replay hides the drift from the "
    "loss. `routes_old` and `routes_update` are the routes that produced the two sides of log w: replayed "
    "under R2 (`--routing-replay old`), R3 (`rollout`) and TRR (`rollout-gates`). Rollout → trainer is shown "
    "on both sides: against the trainer's *free* pi_old (the gap routing creates) and against pi_old *as used* "
    "in the ratio (what the loss sees; 0 under R3 and TRR).",
    icon=":material/info:",
)
runs = ui.selected_runs()
if not runs:
    st.stop()
colors = {run.label: charts.color(i) for i, run in enumerate(runs)}

infos = {run.label: loaders.info(run.path, run.key).value for run in runs}
st.dataframe(
    pd.DataFrame(
        [
            {
                "run": run.label,
                "replay": info.replay_label if info else None,
                "pi_old in the ratio and the update forward": UPDATE_ROUTES[info.replay] if info else None,
                "old → new": "free routes before vs after the step",
            }
            for run in runs
            for info in [infos[run.label]]
        ]
    ),
    hide_index=True,
    width="stretch",
)

metric = st.selectbox(
    "Metric (step, minibatch and position views)", list(METRICS), format_func=lambda m: f"{m}: {METRICS[m]}"
)

# A share in percent, as every surface writes it (moestab.analysis.labels); the Jaccard distance is no share.
pattern = keys.ROUTE_CHANGE_KEYS.get(metric)
metric_in_percent = pattern is not None and is_percent(pattern.format(pair="old_new"))

METRIC_KEYS = tuple(pattern.format(pair=pair) for pair in PAIR_TITLES for pattern in keys.ROUTE_CHANGE_KEYS.values())
"""The metrics.jsonl keys this page draws (the others are not held)."""

# Per-token tables of each run and pair (None where the run has none yet).
tables: dict[tuple[str, str], dict] = {}
metrics_frames: dict[str, pd.DataFrame] = {}
reading = charts.placeholder("the routing charts: reading the runs' per-token tables")
for run in runs:
    loaded = loaders.metrics(run.path, run.key, METRIC_KEYS)
    if loaded.error is None and loaded.value is not None and len(loaded.value):
        metrics_frames[run.label] = loaded.value
    for pair in PAIR_TITLES:
        got = loaders.volatility(run.path, run.key, pair)
        if ui.report(run, got, f"routes ({pair})", missing="per-token tables"):
            tables[(run.label, pair)] = got.value
reading.empty()


def view(label: str, pair: str, name: str) -> pd.DataFrame | None:
    """View ``name`` of :data:`~moestab.dashboard.kit.loaders.VOLATILITY_VIEWS` of a run's pair (None without
    per-token tables)."""
    table = tables.get((label, pair))
    return None if table is None else table[name]


HEATMAPS = ("old_new", "rollout_old_free")
HEATMAP_VALUE = "% of routed slots changed"


def top_of(grids: dict[tuple[str, str], tuple[pd.DataFrame | None, str]]) -> float:
    """The colour scale's top for one view: the largest changed fraction of any run's heatmap (1 when all are 0)."""
    values = [grid["changed"].to_numpy(np.float64) for grid, _ in grids.values() if grid is not None]
    top = max((float(np.nanmax(v)) for v in values if np.isfinite(v).any()), default=0.0)
    return top if top > 0 else 1.0


def show_heatmaps(run_label: str, grids: dict[tuple[str, str], tuple[pd.DataFrame | None, str]], x: str, xlabel: str,
                  what: str, zoom: bool, vmax: float) -> None:
    """One run's old -> new beside rollout -> trainer (free): ``changed`` by layer and ``x``, colour scale 0 to vmax."""
    cells = st.columns(len(HEATMAPS))
    for cell, pair in zip(cells, HEATMAPS, strict=True):
        grid, source = grids[(run_label, pair)]
        with cell:
            if grid is None:
                st.caption(f"{PAIR_TITLES[pair]}: nothing recorded.")
                continue
            title = f"{run_label}: {PAIR_TITLES[pair]} ({source})"
            chart = charts.heatmap(grid, x, "layer", "changed", title=title, xlabel=xlabel, ylabel="MoE layer",
                                   legend=HEATMAP_VALUE, domain=(0.0, vmax), zoom=zoom, percent=True)
            charts.show(chart, grid, f"Heatmap of routing change {pair} by layer and {what} for {run_label}",
                        value="changed")


def step_frame(pair: str) -> pd.DataFrame:
    frames = {}
    for run in runs:
        curve, _ = routing_by_step(metrics_frames.get(run.label), view(run.label, pair, "step"), pair, metric)
        if curve is not None:
            frames[run.label] = curve
    return stack_runs(frames)


def view_frame(pair: str, name: str, column: str) -> pd.DataFrame:
    frames = {}
    for run in runs:
        table = view(run.label, pair, name)
        if table is not None and len(table):
            frames[run.label] = table[[column, metric]].rename(columns={metric: "value"})
    return stack_runs(frames)


def side_by_side(pairs: list[str], make, x: str, xlabel: str, what: str, **kwargs) -> None:
    cells = st.columns(len(pairs))
    slots = {}
    for cell, pair in zip(cells, pairs, strict=True):  # every slot first: the row keeps its layout while it is read
        with cell:
            slots[pair] = charts.placeholder(f"{PAIR_TITLES[pair]} {what}")
    for pair in pairs:
        data = make(pair)
        if not len(data):
            slots[pair].info(f"No {PAIR_TITLES[pair]} routes in the selected runs.", icon=":material/hourglass_empty:")
            continue
        title = f"{PAIR_TITLES[pair]} {what}"
        chart = charts.lines(data, x, "value", title=title, xlabel=xlabel, ylabel=METRICS[metric], colors=colors,
                             percent=metric_in_percent, **kwargs)
        charts.show(chart, data, title, value="value", into=slots[pair])


st.header("Over steps")
st.caption("metrics.jsonl (all response tokens) where it has the metric, else the recorded tokens.")
side_by_side(["old_new", "rollout_old_free", "rollout_old"], step_frame, "step", "step", "by step", integer_x=True)

st.header("Per minibatch")
st.caption(
    "Recorded tokens by the minibatch they were updated in. Update → old grows with the minibatch index "
    "when the policy drifts within a step (replay off); under R2, R3 and TRR it is 0, because both sides of "
    "log w replay the same routes."
)
side_by_side(
    ["update_old", "old_new"],
    lambda p: (lambda f: f.assign(minibatch=f["minibatch"] + 1) if len(f) else f)(
        view_frame(p, "minibatch", "minibatch")),  # 1-based, as README counts minibatches
    "minibatch",
    "minibatch (1 = the first update of the step, as README counts them)",
    "by minibatch",
    integer_x=True,
)

st.header("Per response position")
st.caption("Recorded tokens by 0-based position in the response (bins labelled by their first position).")
side_by_side(
    ["old_new", "rollout_old_free"],
    lambda p: view_frame(p, "position", "position_bin"),
    "position_bin",
    "token position in response (bin start)",
    "by position",
)

st.header("Per run: layer × step and layer × response position")
by_step = {
    (run.label, pair): changed_by_layer_step(metrics_frames.get(run.label), view(run.label, pair, "step_layer"), pair)
    for run in runs
    for pair in HEATMAPS
}
by_position = {}
for run in runs:
    for pair in HEATMAPS:
        table = view(run.label, pair, "position_layer")
        by_position[(run.label, pair)] = (None, "") if table is None or not len(table) else (
            table[["position_bin", "layer", "changed"]], TOKENS_SOURCE)
step_top, position_top = top_of(by_step), top_of(by_position)
st.caption(
    "Changed share of routed slots, old → new beside rollout → trainer (free pi_old), one expander per run. "
    f"One colour scale for every layer × step heatmap (0 to {format_value(step_top, True)}; metrics.jsonl, else the "
    f"recorded tokens) and one for every layer × position heatmap (0 to {format_value(position_top, True)}; recorded "
    "tokens, by 0-based "
    "position in the response, bins labelled by their first position)."
)
for run in runs:
    with st.expander(f"{run.label}: heatmaps", icon=":material/grid_on:"):
        st.markdown("**Layer × step**")
        show_heatmaps(run.label, by_step, "step", "step", "step", zoom=True, vmax=step_top)
        st.markdown("**Layer × response position**")
        show_heatmaps(run.label, by_position, "position_bin", "token position in response (bin start)", "position",
                      zoom=False, vmax=position_top)
