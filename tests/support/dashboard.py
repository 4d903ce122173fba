"""The dashboard tests' shared names: the app's pages, opening one under AppTest, and what a run of it shows (its
Altair charts: accessible name, Vega-Lite spec, the frame drawn; the CSV files its download buttons serve)."""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa

REPO = Path(__file__).resolve().parents[2]
"""The checkout."""


APP = REPO / "moestab" / "dashboard" / "app.py"
"""The packaged entry script (what ``moestab dashboard`` runs); tests/dashboard/test_serve.py also runs the checkout's
``dashboard/app.py``, which runs this one."""


COMPARE_PAGE = "app_pages/compare.py"
"""The first page (the app opens on it)."""


PAGES = {  # page file -> title it shows
    COMPARE_PAGE: "Compare",
    "app_pages/runs.py": "Runs",
    "app_pages/training.py": "Training",
    "app_pages/volatility.py": "Routing volatility",
    "app_pages/ratios.py": "Ratios",
    "app_pages/attribution.py": "Attribution",
    "app_pages/experts.py": "Experts",
    "app_pages/probes.py": "Probes",
}



RUNS_PAGE = "app_pages/runs.py"


PROBES_PAGE = "app_pages/probes.py"  # reads probe folders, not runs (tests/dashboard/test_probes_page.py)


def open_page(at, page: str):
    """Run the app (it opens on the Compare page) and go to ``page``."""
    at.run()
    if page != COMPARE_PAGE:
        at.switch_page(page).run()
    return at


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def assert_clean(at) -> None:
    assert not at.exception, texts(at.exception)
    assert not at.error, texts(at.error)
    assert not at.warning, texts(at.warning)



@dataclass(frozen=True)
class Chart:
    """One ``st.altair_chart`` of a page."""

    alt: str
    spec: dict
    data: pd.DataFrame
    """The frame the chart draws (every layer of a dashboard chart draws the same one)."""


def charts_on(at) -> list[Chart]:
    """The Altair charts of the page, in page order."""
    out = []
    for element in at.get("vega_lite_chart"):
        proto = element.proto
        datasets = list(proto.datasets)
        assert len(datasets) == 1, f"{proto.alt}: {len(datasets)} datasets"
        data = pa.ipc.open_stream(datasets[0].data.data).read_pandas()
        out.append(Chart(proto.alt, json.loads(proto.spec), data))
    return out


def chart_alts(at) -> list[str]:
    """Accessible names of the charts on the page (every chart is shown with one)."""
    return [chart.alt for chart in charts_on(at)]


def chart_named(at, name: str) -> Chart:
    """The one chart whose accessible name contains ``name``."""
    found = [chart for chart in charts_on(at) if name in chart.alt]
    assert len(found) == 1, (name, [chart.alt for chart in charts_on(at)])
    return found[0]


def csv_name(alt: str) -> str:
    """The CSV file name the dashboard gives the chart named ``alt``."""
    from moestab.dashboard.kit.charts import slug

    return f"{slug(alt)}.csv"


def served_csv(served: dict[str, tuple[str | None, bytes]], alt: str) -> pd.DataFrame:
    """The CSV served for the chart named ``alt`` (``served``: the ``downloads`` fixture), read back."""
    name = csv_name(alt)
    files = {data for filename, data in served.values() if filename == name}
    assert len(files) == 1, (name, sorted(str(f) for f, _ in served.values()))
    return pd.read_csv(io.BytesIO(files.pop()))


def params(spec: dict) -> list[dict]:
    """Every selection parameter of a Vega-Lite spec and its layers."""
    return [*spec.get("params", []), *(p for layer in spec.get("layer", []) for p in params(layer))]


def marks(spec: dict) -> set[str]:
    """The mark types of a Vega-Lite spec and its layers."""
    mark = spec.get("mark")
    own = {mark["type"] if isinstance(mark, dict) else mark} if mark else set()
    return own.union(*(marks(layer) for layer in spec.get("layer", [])))


def has_tooltip(spec: dict) -> bool:
    """Whether a mark of the spec (or of one of its layers) shows a tooltip."""
    return "tooltip" in spec.get("encoding", {}) or any(has_tooltip(layer) for layer in spec.get("layer", []))


def assert_interactive_with_csv(at, served: dict[str, tuple[str | None, bytes]]) -> None:
    """Every chart of the page has tooltips; lines, histograms and bars a legend that keeps runs; lines, histograms
    and layer x step heatmaps zoom; and the CSV under each chart is the frame it draws."""
    shown = charts_on(at)
    assert [b.label for b in at.download_button] == ["CSV"] * len(shown)
    for chart in shown:
        binds = [p.get("bind") for p in params(chart.spec)]
        kind = "heatmap" if "rect" in marks(chart.spec) else "bars" if "bar" in marks(chart.spec) else "lines"
        assert has_tooltip(chart.spec), chart.alt
        assert ("legend" in binds) == (kind != "heatmap"), f"{chart.alt}: legend selection, binds {binds}"
        zooms = kind == "lines" or "by layer and step" in chart.alt  # other heatmaps have categorical axes
        assert ("scales" in binds) == zooms, f"{chart.alt}: zoom {zooms} expected, binds {binds}"
        pd.testing.assert_frame_equal(served_csv(served, chart.alt), chart.data, check_dtype=False)


T_975_DF1 = math.tan(math.pi * (0.975 - 0.5))
"""The 97.5% quantile of Student's t with 1 degree of freedom (the Cauchy distribution): tan(pi (p - 1/2)) = 12.706,
the interval's factor for two seeds, in closed form (independent of moestab.metrics.paired's numerical quantile)."""


def shown_number(text: str) -> float:
    """A value as the dashboard's tables write it, read back as a number (a share's percent or pp as a fraction;
    ``0 (at float precision)`` as 0)."""
    text = text.strip()
    if text == "0 (at float precision)":
        return 0.0
    for unit in (" pp", "%"):
        if text.endswith(unit):
            return float(text.removesuffix(unit)) / 100
    return float(text)
