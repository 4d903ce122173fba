"""Shared pieces of the dashboard pages: cached analysis calls, charts, sidebar and run selection.

The pages only render what these modules get from ``moestab.analysis`` (the Probes page: ``moestab.probes``).
"""
