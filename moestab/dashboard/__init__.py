"""The Streamlit dashboard (docs/dashboard.md): ``app.py`` is its entry script, one file per page in ``app_pages/``
(widgets only), and ``kit/`` the pieces the pages share (cached analysis calls, charts, sidebar).

It ships in the wheel (``pip install 'moestab[dashboard]'``); ``moestab dashboard`` runs ``app.py`` with Streamlit.
Importing this package imports nothing: Streamlit is loaded only by the app itself.
"""
