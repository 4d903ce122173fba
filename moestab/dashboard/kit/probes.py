"""What the Probes page shares: the probe folders under the runs folder, their listing, messages and charts.

Probe folders (``moestab probe NAME ... --out DIR``) are found anywhere under the dashboard's runs folder
(:func:`moestab.probes.folder.find_probe_folders`): beside the runs (``runs/probes/NAME``) or inside a run folder.
What is drawn is shaped by :mod:`moestab.probes.views`; a probe it has no chart for is shown as its tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import altair as alt
import pandas as pd
import streamlit as st

from moestab.analysis.dashboard_data import grid_frame, stack_runs
from moestab.probes.folder import ProbeResult, find_probe_folders
from moestab.probes.views import Chart, describe

from . import charts, loaders

EMPTY = "No probe folders in `{root}` yet. Make one with `moestab probe compare A B --out DIR`, DIR anywhere under " \
        "this folder (e.g. `{root}/probes/NAME`); it appears here on the next redraw (or Refresh)."
"""What the page says when the runs folder holds no probe folder (``root``: the runs folder)."""

ROW_HEIGHT = 28
"""Pixels per checkpoint row of a probe heatmap: the plot grows with the checkpoints a probe ran on."""


@dataclass(frozen=True)
class ProbeRef:
    """A probe folder as the page uses it."""

    path: str
    label: str
    """Its path relative to the runs folder (the name shown)."""
    key: loaders.Key
    """:func:`fingerprint`: part of the cache key, so changed files are re-read."""


def fingerprint(folder: str | Path) -> loaders.Key:
    """``(name, mtime_ns, size)`` of each file in ``folder`` (probe.json and its tables), sorted."""
    out = []
    for path in sorted(Path(folder).iterdir()):
        try:
            stat = path.stat()
        except OSError:
            continue
        if path.is_file():
            out.append((path.name, stat.st_mtime_ns, stat.st_size))
    return tuple(out)


def discover(root: Path) -> list[ProbeRef]:
    """The probe folders at or under ``root`` (none when ``root`` is missing), sorted by path."""
    if not root.is_dir():
        return []
    refs = []
    for folder in find_probe_folders(root):
        label = "." if folder == root else folder.relative_to(root).as_posix()
        refs.append(ProbeRef(str(folder), label, fingerprint(folder)))
    return refs


Problems = list[tuple[ProbeRef, loaders.Loaded]]
"""Unreadable probe folders and what their loader said."""


def listing(refs: Sequence[ProbeRef]) -> tuple[pd.DataFrame, dict[str, ProbeResult], Problems]:
    """Read every probe folder: the listing table (one row each: ``folder``, :func:`describe`'s columns,
    ``problem``), the readable results by path, and the unreadable folders with what their loader said."""
    rows, results, problems = [], {}, []
    for ref in refs:
        loaded = loaders.probe(ref.path, ref.key)
        if loaded.value is None:
            rows.append({"folder": ref.label, "probe": "unreadable", "problem": loaded.error})
            problems.append((ref, loaded))
            continue
        results[ref.path] = loaded.value
        rows.append({"folder": ref.label, **describe(loaded.value), "problem": None})
    return pd.DataFrame(rows), results, problems


def by_probe(refs: Sequence[ProbeRef], results: Mapping[str, ProbeResult]) -> dict[str, list[ProbeRef]]:
    """The readable folders (``results``: by path) grouped by the probe that wrote them, in ``refs`` order."""
    groups: dict[str, list[ProbeRef]] = {}
    for ref in refs:
        if ref.path in results:
            groups.setdefault(results[ref.path].probe, []).append(ref)
    return groups


def metadata(results: Mapping[str, ProbeResult]) -> pd.DataFrame:
    """:func:`describe` of each result, one row per folder (the mapping's keys)."""
    return pd.DataFrame([{"folder": label, **describe(result)} for label, result in results.items()])


def as_json(result: ProbeResult) -> dict[str, object]:
    """The metadata of probe.json (without the table list)."""
    return {"probe": result.probe, "checkpoints": result.checkpoints, "suite": result.suite,
            "settings": result.settings}


def report(ref: ProbeRef, loaded: loaders.Loaded, what: str) -> bool:
    """An error box when ``loaded`` failed (with the traceback of an unexpected error); True when it holds a value."""
    if loaded.error is None:
        return True
    st.error(f"**{ref.label}**: cannot read the {what}: {loaded.error}", icon=":material/error:")
    if loaded.trace:
        with st.expander("Details"):
            st.code(loaded.trace, language="text")
    return False


def chart_data(result: ProbeResult, chart: Chart) -> loaders.Loaded[pd.DataFrame]:
    """``chart``'s frame of ``result``, or why it cannot be drawn (a table without the columns the chart needs)."""
    return loaders.guarded(lambda skipped: chart.shape(result))


Drawn = tuple[alt.TopLevelMixin, pd.DataFrame, str]
"""A chart, the frame it draws (its CSV) and its accessible name."""


def drawn_charts(chart: Chart, frames: Mapping[str, pd.DataFrame]) -> list[Drawn]:
    """``chart`` drawn from each folder's frame (label -> frame): one chart overlaying the folders for lines (one
    colour per folder, one line style per series within it), one heatmap per folder."""
    if not frames:
        return []
    if chart.kind == "lines":
        data = stack_runs(frames, column="folder")
        colors = {label: charts.color(i) for i, label in enumerate(frames)}
        drawn = charts.lines(data, "x", "y", title=chart.title, xlabel=chart.xlabel, ylabel=chart.ylabel,
                             series="folder", colors=colors, dash="series",
                             log_x=chart.log_x and bool((data["x"] > 0).all()), integer_x=chart.integer_x)
        return [(drawn, data, f"{chart.title} ({', '.join(frames)})")]
    out = []
    low, high = chart.limits if chart.limits else (None, None)
    for label, grid in frames.items():
        data = grid_frame(grid, chart.name)
        row, column = data.columns[:2]
        drawn = charts.heatmap(data, column, row, chart.name, title=f"{chart.title}: {label}", xlabel=chart.xlabel,
                               ylabel=chart.ylabel, legend=chart.value, domain=(low, high),
                               y_order=list(grid.index)[::-1], row_height=ROW_HEIGHT)
        out.append((drawn, data, f"{chart.title}: {label}"))
    return out


def draw(known: Sequence[Chart], refs: Mapping[str, ProbeRef], results: Mapping[str, ProbeResult]) -> list[Drawn]:
    """Every chart of the chosen folders (label -> ref, label -> result); a folder whose table a chart cannot use
    gets an error box and is left out of that chart."""
    drawn = []
    for chart in known:
        frames = {}
        for label, result in results.items():
            got = chart_data(result, chart)
            if report(refs[label], got, f"{chart.title.lower()} chart"):
                frames[label] = got.value
        drawn.extend(drawn_charts(chart, frames))
    return drawn
