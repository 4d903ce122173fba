"""The Probes page under AppTest: real probe folders of tiny models, an overlay, an unknown probe, damaged folders
and the empty state. Probe folders live under the runs folder the dashboard is started with."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from moestab.cli import main
from moestab.probes import ProbeResult, read_probe_folder, write_probe_folder
from moestab.probes.views import flip_rate_by_margin, router_flip_by_layer, saturation_top1_grid
from tests.support.dashboard import (
    PROBES_PAGE,
    assert_clean,
    assert_interactive_with_csv,
    chart_alts,
    chart_named,
    texts,
)
from tests.support.probes import probe, save_family


@pytest.fixture(scope="module")
def probe_root(tmp_path_factory) -> Path:
    """A runs folder with real probe folders of two tiny Mixtral models (6 suite texts, 48 tokens each):
    ``probes/compare-ab`` (a vs b), ``probes/compare-aa`` (a against itself: nothing flips), ``probes/numerics``
    and ``sweep/run-1/probes/saturation`` (deeper down, as inside a run's folder)."""
    models, root = tmp_path_factory.mktemp("models"), tmp_path_factory.mktemp("runs")
    a, b = save_family(models / "a", "mixtral", seed=0), save_family(models / "b", "mixtral", seed=1)
    for folder, name, paths in (("probes/compare-ab", "compare", [a, b]), ("probes/compare-aa", "compare", [a, a]),
                                ("probes/numerics", "numerics", [a]),
                                ("sweep/run-1/probes/saturation", "saturation", [a, b])):
        write_probe_folder(probe(name, paths, count=6, max_tokens=48), root / folder)
    return root


@pytest.fixture(scope="module")
def run_saturation(trained_runs: Path, tmp_path_factory) -> Path:
    """A runs folder holding what README's `moestab probe saturation RUN ... --out` makes of a run: the probe folder
    ``probes/saturation`` of a trained run's checkpoints (``gspo-off@0``, ``gspo-off@6``)."""
    root = tmp_path_factory.mktemp("saturation-runs")
    assert main(["probe", "saturation", str(trained_runs / "gspo-off"), "--suite", "task:arithmetic", "--count", "8",
                 "--out", str(root / "probes" / "saturation"), "--no-progress"]) == 0
    return root


def rows_height(spec: dict, rows: int) -> float:
    """Pixels Vega-Lite gives the ``rows`` rows of a heatmap's spec, as Streamlit sends it.

    A height ``{"step": n}`` is ``n`` per row. A number is the rows' own under autosize ``fit-x`` or ``pad``, but
    under ``fit`` (what Streamlit sets when the chart sets none) it is the whole chart's, title, legend and axes
    included: the rows get what those leave, which only drawing tells (tests/dashboard/test_browser.py does), so 0.
    """
    height, autosize = spec.get("height"), spec.get("autosize", {})
    if isinstance(height, dict):
        return height["step"] * rows
    kind = autosize.get("type") if isinstance(autosize, dict) else autosize
    return float(height) if kind in ("fit-x", "pad") else 0.0


def open_probes(make_app, root: Path):
    at = make_app(root).run()
    return at.switch_page(PROBES_PAGE).run()


def choose(at, probe_name: str, root: Path | None = None, folders: list[str] | None = None):
    """Pick ``probe_name`` and (when given) the folders to show, by their path relative to ``root``."""
    at.selectbox(key="moestab_probe").set_value(probe_name).run()
    if folders is not None:
        widget = at.multiselect(key=f"moestab_probe_folders_{probe_name}")
        widget.set_value([str(root / folder) for folder in folders]).run()
    return at


def dataframe_after(at, header: str) -> pd.DataFrame:
    """The first table shown under the section ``header``."""
    heads = [h.value for h in at.header]
    assert header in heads, heads
    # Tables in page order: the listing, "What was probed", then "Summary" (when the probe has one).
    return at.dataframe[{"What was probed": 1, "Summary": 2}[header]].value


def test_probe_folders_are_listed_with_metadata_summary_and_charts(make_app, probe_root: Path, downloads) -> None:
    at = open_probes(make_app, probe_root)
    assert_clean(at)
    assert [t.value for t in at.title] == ["Probes"]
    listing = at.dataframe[0].value
    assert list(listing["folder"]) == ["probes/compare-aa", "probes/compare-ab", "probes/numerics",
                                       "sweep/run-1/probes/saturation"]
    assert list(listing["probe"]) == ["compare", "compare", "numerics", "saturation"]
    assert listing["problem"].isna().all()

    # compare, its first folder by default: metadata, the summary as saved, both charts.
    saved = read_probe_folder(probe_root / "probes/compare-aa")
    meta = dataframe_after(at, "What was probed").iloc[0]
    assert meta["probe"] == "compare" and meta["texts"] == 6 and meta["sha256"] == saved.suite["sha256"]
    assert len(meta["sha256"]) == 64 and "max_tokens=48" in meta["settings"]
    assert meta["checkpoints"] == "; ".join(saved.checkpoints)
    pd.testing.assert_frame_equal(dataframe_after(at, "Summary"), saved.tables["summary"])
    assert dataframe_after(at, "Summary")["router_flip"].iloc[0] == 0  # a checkpoint against itself
    assert chart_alts(at) == ["Router flip rate against router margin (probes/compare-aa)",
                              "Router flip rate by layer (probes/compare-aa)"]
    margin = chart_named(at, "Router flip rate against router margin").data
    expected = flip_rate_by_margin(saved).assign(folder="probes/compare-aa")[["folder", "series", "x", "y"]]
    pd.testing.assert_frame_equal(margin, expected, check_dtype=False)
    assert_interactive_with_csv(at, downloads)
    assert json.loads(at.json[0].value)["suite"] == saved.suite

    # numerics: one row and one line per comparison.
    choose(at, "numerics")
    assert_clean(at)
    summary = dataframe_after(at, "Summary")
    assert len(summary) == 2 and summary["comparison"].str.contains("bfloat16 vs float32").any()
    assert chart_alts(at) == ["Router flip rate against router margin (probes/numerics)",
                              "Router flip rate by layer (probes/numerics)"]

    # saturation: no summary table, a heatmap per saturation column, the table itself below.
    choose(at, "saturation")
    assert_clean(at)
    assert "Summary" not in [h.value for h in at.header]
    assert chart_alts(at) == ["Top-k router saturation vs the reference: sweep/run-1/probes/saturation",
                              "Top-1 router saturation vs the reference: sweep/run-1/probes/saturation"]
    assert_interactive_with_csv(at, downloads)
    top1 = chart_named(at, "Top-1 router saturation").data.pivot(index="checkpoint", columns="layer",
                                                                   values="saturation_top1")
    grid = saturation_top1_grid(read_probe_folder(probe_root / "sweep/run-1/probes/saturation"))
    pd.testing.assert_frame_equal(top1.loc[grid.index], grid, check_names=False)
    assert (top1.iloc[-1] == 1).all() and (top1.to_numpy() < 1).any()  # the reference row, and a model that differs
    assert [e.label for e in at.expander if e.label == "saturation"] == ["saturation"]


def test_several_folders_of_one_probe_are_overlaid(make_app, probe_root: Path) -> None:
    at = choose(open_probes(make_app, probe_root), "compare", probe_root, ["probes/compare-ab", "probes/compare-aa"])
    assert_clean(at)
    summary = dataframe_after(at, "Summary").set_index("folder")
    assert list(summary.index) == ["probes/compare-ab", "probes/compare-aa"]
    assert summary.loc["probes/compare-ab", "router_flip"] > 0
    assert summary.loc["probes/compare-aa", "router_flip"] == 0
    assert chart_alts(at) == [
        "Router flip rate against router margin (probes/compare-ab, probes/compare-aa)",
        "Router flip rate by layer (probes/compare-ab, probes/compare-aa)",
    ]  # one chart each, both folders on it
    (by_layer,) = [e.dataframe[0].value for e in at.expander if e.label == "by_layer"]
    assert set(by_layer["folder"]) == {"probes/compare-ab", "probes/compare-aa"}
    lines = chart_named(at, "Router flip rate by layer").data
    for folder in ("probes/compare-ab", "probes/compare-aa"):
        expected = router_flip_by_layer(read_probe_folder(probe_root / folder))
        got = lines[lines["folder"] == folder].drop(columns="folder").reset_index(drop=True)
        pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def test_an_unknown_probe_is_shown_as_its_tables(make_app, tmp_path: Path) -> None:
    tables = {"summary": pd.DataFrame({"tokens": [12], "depth_change": [0.25]}),
              "by_depth": pd.DataFrame({"depth": [0, 1, 2], "change": [0.1, 0.2, 0.4]})}
    write_probe_folder(ProbeResult("my-own-probe", ["a=/m/a"], {"name": "general", "count": 2, "sha256": "0" * 64},
                                   {"dtype": "float32"}, tables), tmp_path / "my-probe")
    at = open_probes(make_app, tmp_path)
    assert_clean(at)
    assert not chart_alts(at)
    pd.testing.assert_frame_equal(dataframe_after(at, "Summary"), tables["summary"])
    (shown,) = [e for e in at.expander if e.label == "by_depth"]
    pd.testing.assert_frame_equal(shown.dataframe[0].value, tables["by_depth"])


def test_damaged_probe_folders_show_an_error_and_the_others_still_render(make_app, probe_root: Path,
                                                                         tmp_path: Path) -> None:
    root = tmp_path / "runs"
    for name in ("good", "no-margin-bounds", "no-table"):
        shutil.copytree(probe_root / "probes/compare-ab", root / name)
    (root / "not-json").mkdir()
    (root / "not-json" / "probe.json").write_text('{"probe": "compare", "checkpo')
    (root / "no-table" / "by_margin.csv").unlink()
    by_margin = pd.read_csv(root / "no-margin-bounds" / "by_margin.csv")
    by_margin.drop(columns=["margin_low"]).to_csv(root / "no-margin-bounds" / "by_margin.csv", index=False)

    at = open_probes(make_app, root)
    assert not at.exception, texts(at.exception)
    listing = at.dataframe[0].value.set_index("folder")
    assert list(listing["probe"]) == ["compare", "compare", "unreadable", "unreadable"]
    assert "by_margin.csv is missing" in listing.loc["no-table", "problem"]
    assert "not-json/probe.json is not valid JSON" in listing.loc["not-json", "problem"]
    errors = texts(at.error)
    assert "**no-table**: cannot read the probe folder" in errors and "**not-json**" in errors
    assert "Details" not in [e.label for e in at.expander]  # expected errors: no traceback box

    # A folder that reads but whose table a chart cannot use: an error for that chart, the rest drawn.
    choose(at, "compare", root, ["good", "no-margin-bounds"])
    assert not at.exception, texts(at.exception)
    assert ("**no-margin-bounds**: cannot read the router flip rate against router margin chart: table 'by_margin' "
            "has no column 'margin_low'") in texts(at.error)
    assert chart_alts(at) == ["Router flip rate against router margin (good)",
                              "Router flip rate by layer (good, no-margin-bounds)"]
    assert len(dataframe_after(at, "Summary")) == 2


def test_no_probe_folder_says_how_to_make_one(make_app, tmp_path: Path) -> None:
    at = open_probes(make_app, tmp_path)
    assert_clean(at)
    assert "No probe folders in" in texts(at.info)
    assert "`moestab probe compare A B --out DIR`" in texts(at.info)
    assert not at.dataframe and not chart_alts(at)


def test_a_saturation_probe_of_a_run_draws_a_row_per_checkpoint(make_app, run_saturation: Path) -> None:
    # The default run's saturation heatmap drew one row of zero height: its height (60 px + 28 per checkpoint) was
    # the whole chart's under Streamlit's autosize, and the title and colour bar above the rows took all of it.
    at = open_probes(make_app, run_saturation)
    assert_clean(at)
    table = read_probe_folder(run_saturation / "probes" / "saturation").tables["saturation"]
    checkpoints, layers = ["gspo-off@0", "gspo-off@6"], sorted(table["layer"].unique())
    assert list(table["checkpoint"].unique()) == checkpoints and len(layers) >= 2
    for name in ("Top-k router saturation", "Top-1 router saturation"):
        chart = chart_named(at, name)
        assert len(chart.data) == len(checkpoints) * len(layers)
        assert chart.data.groupby("checkpoint")["layer"].apply(sorted).to_dict() == dict.fromkeys(checkpoints,
                                                                                                   layers)
        assert chart.spec["encoding"]["y"]["sort"] == checkpoints[::-1]  # every checkpoint a row, the last on top
        assert rows_height(chart.spec, len(checkpoints)) >= 20 * len(checkpoints), (name, chart.spec.get("height"),
                                                                                    chart.spec.get("autosize"))
