"""moestab dashboard: compare run folders side by side (docs/dashboard.md).

Start with ``moestab dashboard [RUNS_DIR]`` or ``streamlit run dashboard/app.py -- [RUNS_DIR]``
(default ``$MOESTAB_RUNS``, else ``runs``). One file per page in ``dashboard/app_pages/`` (not
``pages/``: a ``pages/`` folder beside the entry file switches Streamlit to its legacy multipage mode
for sessions that open a page URL before any session has run this file). Every number comes from
``moestab.analysis`` (the Probes page: ``moestab.probes``); run and probe folders are only read.
"""

import streamlit as st
from dashkit import ui

st.set_page_config(page_title="moestab dashboard", page_icon=":material/hub:", layout="wide")

PAGES = [
    st.Page("app_pages/compare.py", title="Compare", icon=":material/compare_arrows:", default=True),
    st.Page("app_pages/runs.py", title="Runs", icon=":material/table:", url_path="runs"),
    st.Page("app_pages/training.py", title="Training", icon=":material/show_chart:", url_path="training"),
    st.Page("app_pages/volatility.py", title="Routing volatility", icon=":material/shuffle:", url_path="volatility"),
    st.Page("app_pages/ratios.py", title="Ratios", icon=":material/percent:", url_path="ratios"),
    st.Page("app_pages/attribution.py", title="Attribution", icon=":material/call_split:", url_path="attribution"),
    st.Page("app_pages/experts.py", title="Experts", icon=":material/grid_view:", url_path="experts"),
    st.Page("app_pages/probes.py", title="Probes", icon=":material/science:", url_path="probes"),
]

page = st.navigation(PAGES)
ui.sidebar()
page.run()
