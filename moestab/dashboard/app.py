"""moestab dashboard: compare run folders side by side (docs/dashboard.md).

Start with ``moestab dashboard [RUNS_DIR]``, or from a source checkout ``streamlit run dashboard/app.py --
[RUNS_DIR]`` (that file runs :func:`main`); the folder defaults to ``$MOESTAB_RUNS``, else ``runs``. One file per
page in ``app_pages/`` (not ``pages/``: a ``pages/`` folder beside the entry file switches Streamlit to its legacy
multipage mode for sessions that open a page URL before any session has run this file). Pages are named by absolute
path, so the app runs the same from this file and from the checkout's ``dashboard/app.py``. Every number comes from
``moestab.analysis`` (the Probes page: ``moestab.probes``); run and probe folders are only read.
"""

from pathlib import Path

import streamlit as st

from moestab.dashboard.kit import ui

HERE = Path(__file__).resolve().parent


def main() -> None:
    st.set_page_config(page_title="moestab dashboard", page_icon=":material/hub:", layout="wide")
    page = st.navigation(pages())
    ui.sidebar()
    page.run()


PAGES = (  # file in app_pages/, title, icon, URL path ("" for the default page, which opens first)
    ("compare.py", "Compare", "compare_arrows", ""),
    ("runs.py", "Runs", "table", "runs"),
    ("training.py", "Training", "show_chart", "training"),
    ("volatility.py", "Routing volatility", "shuffle", "volatility"),
    ("ratios.py", "Ratios", "percent", "ratios"),
    ("attribution.py", "Attribution", "call_split", "attribution"),
    ("experts.py", "Experts", "grid_view", "experts"),
    ("probes.py", "Probes", "science", "probes"),
)


def pages() -> list:
    """The pages of :data:`PAGES`, in the order of the navigation menu."""
    return [st.Page(HERE / "app_pages" / file, title=title, icon=f":material/{icon}:", default=not url_path,
                    **({"url_path": url_path} if url_path else {}))
            for file, title, icon, url_path in PAGES]


if __name__ == "__main__":  # Streamlit runs its entry script as __main__
    main()
