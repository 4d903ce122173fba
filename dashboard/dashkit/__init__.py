"""Shared pieces of the dashboard pages: cached analysis calls, charts, sidebar and run selection.

Importable as ``dashkit`` because Streamlit puts the entry script's folder (``dashboard/``) on
``sys.path``; the pages only render what these modules get from ``moestab.analysis``.
"""
