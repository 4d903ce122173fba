"""Routing volatility: how often routers change their experts, by layer x step, over steps, by
minibatch and by response position; old->new and rollout->trainer side by side."""

import numpy as np
import pandas as pd
import streamlit as st
from dashkit import figures, loaders, ui

from moestab.analysis.experts import metrics_per_layer

PAIR_TITLES = {
    "old_new": "old → new (trainer, free routing)",
    "rollout_old_free": "rollout → trainer (free pi_old)",
    "rollout_old": "rollout → trainer (pi_old as used)",
    "update_old": "update → old (the two sides of log w)",
}
METRICS = {
    "changed": "changed fraction of routed slots",
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
colors = {run.label: figures.color(i) for i, run in enumerate(runs)}

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

# Per-token tables of each run and pair (None where the run has none yet).
tables: dict[tuple[str, str], dict] = {}
metrics_frames: dict[str, pd.DataFrame] = {}
for run in runs:
    loaded = loaders.metrics(run.path, run.key)
    if loaded.error is None and loaded.value is not None and len(loaded.value):
        metrics_frames[run.label] = loaded.value
    for pair in PAIR_TITLES:
        got = loaders.volatility(run.path, run.key, pair)
        if ui.report(run, got, f"routes ({pair})", missing="per-token tables"):
            tables[(run.label, pair)] = got.value


def layer_step_grid(label: str, pair: str) -> tuple[pd.DataFrame | None, str]:
    """Changed fraction by layer x step: metrics.jsonl (all tokens) if it has it, else the per-token tables."""
    frame = metrics_frames.get(label)
    if frame is not None:
        tidy = metrics_per_layer(frame, f"routing/{pair}/changed_by_layer").dropna()
        if len(tidy):
            return tidy.pivot_table(index="layer", columns="step", values="value"), "all tokens"
    table = tables.get((label, pair))
    if table is not None and len(table["step_layer"]):
        return table["step_layer"].pivot_table(index="layer", columns="step", values="changed"), "recorded tokens"
    return None, ""


st.header("Layer × step")
HEATMAPS = ("old_new", "rollout_old_free")
grids = {(run.label, pair): layer_step_grid(run.label, pair) for run in runs for pair in HEATMAPS}
finite = [g.to_numpy(np.float64) for g, _ in grids.values() if g is not None and g.size]
top = max((float(np.nanmax(v)) for v in finite if np.isfinite(v).any()), default=0.0)
vmax = top if top > 0 else 1.0
st.caption(f"Changed fraction of routed slots; one colour scale for every heatmap (0 to {vmax:.3g}).")
for run in runs:
    st.subheader(run.label)
    cells = st.columns(len(HEATMAPS))
    for cell, pair in zip(cells, HEATMAPS, strict=True):
        grid, source = grids[(run.label, pair)]
        with cell:
            if grid is None:
                st.caption(f"{PAIR_TITLES[pair]}: nothing recorded.")
                continue
            fig = figures.heatmap(
                grid,
                f"{run.label}: {PAIR_TITLES[pair]} ({source})",
                "step",
                "MoE layer",
                "changed fraction of slots",
                vmin=0.0,
                vmax=vmax,
            )
            figures.show(fig, alt=f"Heatmap of routing change {pair} by layer and step for {run.label}")


def step_series(pair: str) -> list[figures.Series]:
    out = []
    for run in runs:
        frame = metrics_frames.get(run.label)
        key = f"routing/{pair}/{metric}"
        if frame is not None and key in frame:
            x, y = frame["step"].to_numpy(), pd.to_numeric(frame[key], errors="coerce").to_numpy(float)
        elif (run.label, pair) in tables:
            part = tables[(run.label, pair)]["step"]
            x, y = part["step"].to_numpy(), part[metric].to_numpy(float)
        else:
            continue
        out.append(figures.Series(run.label, x, y, colors[run.label]))
    return out


def view_series(pair: str, view: str, column: str) -> list[figures.Series]:
    out = []
    for run in runs:
        table = tables.get((run.label, pair))
        if table is not None and len(table[view]):
            part = table[view]
            out.append(
                figures.Series(run.label, part[column].to_numpy(), part[metric].to_numpy(float), colors[run.label])
            )
    return out


def side_by_side(pairs: list[str], make, xlabel: str, what: str, **kwargs) -> None:
    cells = st.columns(len(pairs))
    for cell, pair in zip(cells, pairs, strict=True):
        series = make(pair)
        with cell:
            if not series:
                st.info(f"No {PAIR_TITLES[pair]} routes in the selected runs.", icon=":material/hourglass_empty:")
                continue
            title = f"{PAIR_TITLES[pair]} {what}"
            figures.show(figures.lines(series, title, xlabel, METRICS[metric], **kwargs), alt=title)


st.header("Over steps")
st.caption("metrics.jsonl (all response tokens) where it has the metric, else the recorded tokens.")
side_by_side(["old_new", "rollout_old_free", "rollout_old"], step_series, "step", "by step", integer_x=True)

st.header("Per minibatch")
st.caption(
    "Recorded tokens by the minibatch they were updated in. Update → old grows with the minibatch index "
    "when the policy drifts within a step (replay off); under R2, R3 and TRR it is 0, because both sides of "
    "log w replay the same routes."
)
side_by_side(
    ["update_old", "old_new"],
    lambda p: view_series(p, "minibatch", "minibatch"),
    "minibatch index (update order within the step)",
    "by minibatch",
    integer_x=True,
)

st.header("Per response position")
st.caption("Recorded tokens by 0-based position in the response (bins labelled by their first position).")
side_by_side(
    ["old_new", "rollout_old_free"],
    lambda p: view_series(p, "position", "position_bin"),
    "token position in response (bin start)",
    "by position",
)
