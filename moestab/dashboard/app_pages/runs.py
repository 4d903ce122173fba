"""Runs: one row per run folder (what it is, how far it got, its stability summary); pick runs to compare."""

from functools import partial

import pandas as pd
import streamlit as st

from moestab.analysis.labels import format_value, is_percent
from moestab.analysis.summary import column_key
from moestab.dashboard.kit import loaders, ui

ui.page_header(
    "Runs",
    "Every run folder under the runs folder. Choose the runs to compare; the other pages overlay them.",
)
ctx = ui.context()

if ctx.problem:
    st.warning(f"{ctx.problem}. Choose another folder in the sidebar.", icon=":material/folder_off:")
    st.stop()
if not ctx.runs:
    st.info(
        f"No runs in `{ctx.root}` yet. Start one with `moestab train --out {ctx.root}/NAME`; "
        "it appears here on Refresh (or with auto-refresh on).",
        icon=":material/folder_open:",
    )
    st.stop()

def _capture(failed_steps: float | None) -> str | None:
    """The captured routes' health at a glance: ``ok``, or how many steps failed a route-integrity check."""
    if failed_steps is None or pd.isna(failed_steps):
        return None  # written before the checks
    return "ok" if failed_steps == 0 else f"{int(failed_steps)} steps failed"


PAGE_ROWS = 1000
"""Rows of the table drawn at once (a runs folder of 10,000 runs is paged)."""
LISTED = 10
"""Failed or damaged runs named one by one below the table (the rest counted)."""

READING = "runs_reading"  # session state: the folder this session's Runs page is still reading

budget = ui.READ_MORE_S if st.session_state.get(READING) == str(ctx.root) else ui.READ_BUDGET_S
read = loaders.overviews(ctx.keys(), budget_s=budget)
st.session_state[READING] = str(ctx.root) if read.pending else None
if read.note:
    st.caption(f"Note: {read.note}.")
if read.pending:
    done = len(ctx.runs) - len(read.pending)
    st.progress(done / len(ctx.runs), text=f"Still reading the runs: {done:,} of {len(ctx.runs):,} read. The table "
                "fills in as they are read (each run is read once, then kept in the run index of your cache).")

rows, problems = [], []
for run in ctx.runs:
    loaded = read.rows.get(run.path)
    if loaded is None:
        rows.append({"run": run.label, "status": "not read yet"})
        continue
    row = loaded.value
    if row is None:
        rows.append({"run": run.label, "status": "unreadable", "problem": loaded.error})
        problems.append((run, loaded))
        continue
    steps = "-" if row["steps"] is None else str(row["steps"])
    if row["planned_steps"] is not None:
        steps += f" / {row['planned_steps']}"
    covered = None if row["first_step"] is None else (row["first_step"], row["last_step"])
    rows.append(
        {
            "run": run.label,
            "status": row["status"],
            "algo": row["algo"],
            "replay": row["replay"],
            "model": row["model"],
            "steps": steps,
            "means_over": None if covered is None else f"{covered[0]}–{covered[1]}",
            "final_accuracy": row["final_accuracy"],
            "warm_start_accuracy": row["warm_start_accuracy"],
            "old_new_changed": row["old_new_changed"],
            "rollout_old_free_router_flip": row["rollout_old_free_router_flip"],
            "rollout_old_k3": row["rollout_old_k3"],
            "rollout_old_free_k3": row["rollout_old_free_k3"],
            "clip_token_frac_later": row["clip_token_frac_later"],
            "capture": _capture(row["capture_failed_steps"]),
            "updated": row["updated"],
            "problem": row["damage"] or row["error"] or ("; ".join(loaded.skipped) if loaded.skipped else None),
        }
    )
    if loaded.skipped:
        problems.append((run, loaded))

COLUMNS = [
    "run", "status", "algo", "replay", "model", "steps", "means_over", "final_accuracy", "warm_start_accuracy",
    "old_new_changed", "rollout_old_free_router_flip", "rollout_old_k3", "rollout_old_free_k3",
    "clip_token_frac_later", "capture", "updated", "problem",
]  # fmt: skip
table = pd.DataFrame(rows).reindex(columns=COLUMNS)
spans = table["means_over"].dropna().unique()
if len(spans) > 1:
    differing = [f"{run} {span}" for run, span in zip(table["run"], table["means_over"], strict=True) if span]
    st.warning(
        "The runs' means cover different steps (column *means over*: " + ui.some_of(differing, shown=8)
        + "), so they are not comparable as they stand. The Compare page averages every run over the same steps "
        "(`moestab analyze --steps FIRST:LAST` too).",
        icon=":material/warning:",
    )
if len(table) > PAGE_ROWS:
    name_cell, page_cell = st.columns([3, 1])
    with name_cell:
        part = st.text_input("Show runs whose name contains", key="runs_filter",
                             help="Part of a run folder's path (case-insensitive)")
    if part:
        table = table[table["run"].str.contains(part, case=False, regex=False)]
    pages = max(1, -(-len(table) // PAGE_ROWS))
    with page_cell:
        page = st.number_input(f"Page (of {pages})", 1, pages, 1, key="runs_page")
    st.caption(f"{len(table):,} runs, {PAGE_ROWS:,} a page; the table sorts within its page.")
    table = table.iloc[(page - 1) * PAGE_ROWS: page * PAGE_ROWS]
# Numbers stay numbers (the table sorts by them); what a cell shows is format_value's text: percent for shares, a
# value at float precision (k3 ~ 1e-13 under R3) as 0, a missing one blank.
PERCENT = {column: is_percent(key) for column in COLUMNS if (key := column_key(column)) is not None}
shown = table.style.format({column: partial(format_value, percent=percent) for column, percent in PERCENT.items()})
st.dataframe(
    shown,
    hide_index=True,
    width="stretch",
    column_config={
        "run": st.column_config.TextColumn("run", help="Folder, relative to the runs folder", pinned=True),
        "status": st.column_config.TextColumn(
            "status", help="finished / running / failed / interrupted / stopped (its process died: resumable) / "
            "damaged (its metrics.jsonl steps repeat or go back: two writers mixed it)"
        ),
        "steps": st.column_config.TextColumn("steps", help="Last completed step / planned steps"),
        "means_over": st.column_config.TextColumn(
            "means over", help="The steps the means of this row cover (metrics.jsonl's first to last step)"
        ),
        "final_accuracy": st.column_config.NumberColumn(
            "final acc.", help="Eval accuracy after training (last eval of unfinished runs)"
        ),
        "warm_start_accuracy": st.column_config.NumberColumn("start acc."),
        "old_new_changed": st.column_config.NumberColumn(
            "old→new changed", help="Routing change pi_old -> pi_new, % of routed slots, mean over the steps of "
            "*means over*"
        ),
        "rollout_old_free_router_flip": st.column_config.NumberColumn(
            "rollout→trainer routers flipped",
            help="% of (token, layer) routers whose experts differ between the rollout engine and the trainer's "
            "free routing under pi_old (the gap routing creates), mean over the steps of *means over*",
        ),
        "rollout_old_k3": st.column_config.NumberColumn(
            "mismatch k3 (as used)",
            help="Rollout vs pi_old as used in the ratio (what the loss sees; R3 / TRR lower it), nats per token; "
            "0 (at float precision) below 1e-9",
        ),
        "rollout_old_free_k3": st.column_config.NumberColumn(
            "mismatch k3 (free)", help="Rollout vs the trainer's free pi_old, nats per token"
        ),
        "clip_token_frac_later": st.column_config.NumberColumn(
            "clipped tokens (mb 2..n)",
            help="Token-weighted clipped fraction over minibatches 2..n (GSPO Fig. 2), % of tokens, mean over the "
            "steps of *means over*",
        ),
        "capture": st.column_config.TextColumn(
            "captured routes",
            help="Route integrity of the rollout's routes (routes/integrity/*): ok, or how many steps failed a check "
            "(coverage, ids, a constant layer, agreement with the trainer's routing); blank for runs written "
            "before the checks. The run's warnings say which layer and check.",
        ),
        "updated": st.column_config.TextColumn("updated (UTC)"),
        "problem": st.column_config.TextColumn("problem", width="large"),
    },
)

for run, loaded in problems[:LISTED]:
    ui.report(run, loaded, "run")
if len(problems) > LISTED:
    st.warning(f"{len(problems) - LISTED} more runs have unreadable parts: their *problem* cell says which.",
               icon=":material/warning:")

read_rows = [(run, read.rows[run.path].value) for run in ctx.runs
             if run.path in read.rows and read.rows[run.path].value is not None]
failed = [(run, row) for run, row in read_rows if row["status"] == "failed"]
damaged = [(run, row) for run, row in read_rows if row["damage"]]
for run, row in failed[:LISTED]:
    st.warning(f"**{run.label}** failed: {row['error'] or 'no message recorded'}", icon=":material/cancel:")
for run, row in damaged[:LISTED]:
    st.error(f"**{run.label}** is damaged: {row['damage']}", icon=":material/report:")
more = max(0, len(failed) - LISTED) + max(0, len(damaged) - LISTED)
if more:
    st.caption(f"{more} more failed or damaged runs: their *status* and *problem* cells say why.")


def _keep_selection() -> None:
    st.session_state[ui.SELECTED] = list(st.session_state["moestab_select_widget"])


labels = {run.path: run.label for run in ctx.runs}
st.multiselect(
    "Runs to compare",
    options=list(labels),
    default=[path for path in st.session_state.get(ui.SELECTED, []) if path in labels],
    format_func=labels.get,
    key="moestab_select_widget",
    on_change=_keep_selection,
    help="Used by every other page. Unreadable runs can be chosen too: their pages say what is wrong.",
)

if read.pending or (read.computed and ctx.many):
    st.rerun()  # read the next runs (the table drawn above stays until the next one replaces it); once all are read,
    # once more so that the sidebar, drawn before this page read its last runs, counts them too
