"""What the Probes page shares: the probe folders under the runs folder, their listing, messages and figures.

Probe folders (``moestab probe NAME ... --out DIR``) are found anywhere under the dashboard's runs folder
(:func:`moestab.probes.folder.find_probe_folders`): beside the runs (``runs/probes/NAME``) or inside a run folder.
What is drawn is shaped by :mod:`moestab.probes.views`; a probe it has no chart for is shown as its tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import streamlit as st
from matplotlib.figure import Figure

from moestab.probes.folder import ProbeResult, find_probe_folders
from moestab.probes.views import Chart, describe

from . import figures, loaders

EMPTY = "No probe folders in `{root}` yet. Make one with `moestab probe compare A B --out DIR`, DIR anywhere under " \
        "this folder (e.g. `{root}/probes/NAME`); it appears here on the next redraw (or Refresh)."
"""What the page says when the runs folder holds no probe folder (``root``: the runs folder)."""

LINESTYLES = ("-", "--", ":", "-.")


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


def line_series(frames: Mapping[str, pd.DataFrame]) -> list[figures.Series]:
    """Lines of a ``lines`` chart over folders (label -> frame): one colour per folder, one line style per series
    within it; labelled by series, prefixed by the folder when there are several."""
    out = []
    for i, (label, frame) in enumerate(frames.items()):
        for j, (name, rows) in enumerate(frame.groupby("series", sort=False)):
            shown = f"{label}: {name}" if len(frames) > 1 else str(name)
            out.append(figures.Series(shown, rows["x"].to_numpy(), rows["y"].to_numpy(float), figures.color(i),
                                      linestyle=LINESTYLES[j % len(LINESTYLES)]))
    return out


def chart_figures(chart: Chart, frames: Mapping[str, pd.DataFrame]) -> list[tuple[Figure, str]]:
    """``chart`` drawn from each folder's frame (label -> frame), with the accessible name of each figure: one
    figure overlaying the folders for lines, one heatmap per folder."""
    if not frames:
        return []
    if chart.kind == "lines":
        series = line_series(frames)
        positive = all(len(s.x) and (s.x > 0).all() for s in series)
        fig = figures.lines(series, chart.title, chart.xlabel, chart.ylabel, logx=chart.log_x and positive,
                            integer_x=chart.integer_x)
        return [(fig, f"{chart.title} ({', '.join(frames)})")]
    out = []
    for label, grid in frames.items():
        vmin, vmax = chart.limits if chart.limits else (None, None)
        height = max(2.6, 1.4 + 0.3 * grid.shape[0])
        fig = figures.heatmap(grid, f"{chart.title}: {label}", chart.xlabel, chart.ylabel, chart.value,
                              vmin=vmin, vmax=vmax, height=height)
        out.append((fig, f"{chart.title}: {label}"))
    return out


def draw(charts: Sequence[Chart], refs: Mapping[str, ProbeRef], results: Mapping[str, ProbeResult]
         ) -> list[tuple[Figure, str]]:
    """Every chart of the chosen folders (label -> ref, label -> result) as (figure, accessible name); a folder whose
    table a chart cannot use gets an error box and is left out of that chart."""
    drawn = []
    for chart in charts:
        frames = {}
        for label, result in results.items():
            got = chart_data(result, chart)
            if report(refs[label], got, f"{chart.title.lower()} chart"):
                frames[label] = got.value
        drawn.extend(chart_figures(chart, frames))
    return drawn
