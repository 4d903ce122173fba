"""Probes: the probe folders under the runs folder (`moestab probe ... --out DIR`); pick one, or several of the
same probe to overlay: what was probed, the summary, the charts of known probes and every table."""

import streamlit as st

from moestab.dashboard.kit import charts, probes, ui
from moestab.probes.views import charts_for, stack_tables, table_names

ui.page_header(
    "Probes",
    "Probe folders (`moestab probe NAME ... --out DIR`) anywhere under the runs folder: what was probed on which "
    "checkpoints and texts, the summary, charts and tables. Folders of the same probe can be overlaid.",
)
ctx = ui.context()
if ctx.problem:
    st.warning(f"{ctx.problem}. Choose another folder in the sidebar.", icon=":material/folder_off:")
    st.stop()
refs = probes.discover(ctx.root)
if not refs:
    st.info(probes.EMPTY.format(root=ctx.root), icon=":material/science:")
    st.stop()

listing, readable, problems = probes.listing(refs)
st.dataframe(listing.reindex(columns=["folder", "probe", "checkpoints", "texts", "tables", "problem"]),
             hide_index=True, width="stretch")
for ref, loaded in problems:
    probes.report(ref, loaded, "probe folder")
if not readable:
    st.stop()

by_probe = probes.by_probe(refs, readable)
probe = st.selectbox("Probe", list(by_probe), format_func=lambda p: f"{p} ({len(by_probe[p])} folder(s))",
                     key="moestab_probe")
folders = {ref.path: ref for ref in by_probe[probe]}
chosen = st.multiselect("Folders (several are overlaid)", list(folders), default=list(folders)[:1],
                        format_func=lambda path: folders[path].label, key=f"moestab_probe_folders_{probe}")
if not chosen:
    st.info("Choose at least one probe folder.")
    st.stop()
chosen_refs = {folders[path].label: folders[path] for path in chosen}
results = {label: readable[ref.path] for label, ref in chosen_refs.items()}

st.header("What was probed")
st.dataframe(probes.metadata(results), hide_index=True, width="stretch")
for label, result in results.items():
    with st.expander(f"probe.json of {label}"):
        st.json(probes.as_json(result))

names = table_names(list(results.values()))
if "summary" in names:
    st.header("Summary")
    st.dataframe(stack_tables(results, "summary"), hide_index=True, width="stretch")

known = charts_for(probe)
drawn = probes.draw(known, chosen_refs, results)
if drawn:
    st.header("Charts")
    for cell, (chart, data, name) in zip(ui.grid(len(drawn), per_row=2), drawn, strict=True):
        with cell:
            charts.show(chart, data, name)

charted = {chart.table for chart in known}
others = [name for name in names if name != "summary"]
if others:
    st.header("Tables")
    for name in others:
        with st.expander(name, expanded=name not in charted):
            st.dataframe(stack_tables(results, name), hide_index=True, width="stretch")
