"""moestab.probes.views and the probe folder reader on hand-made tables: chart data, stacking, damaged folders."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from moestab.probes import ProbeError, ProbeResult, read_probe_folder, write_probe_folder
from moestab.probes.plots import plot_probe
from moestab.probes.views import (
    charts_for,
    describe,
    flip_rate_by_margin,
    router_flip_by_layer,
    saturation_grid,
    saturation_top1_grid,
    stack_tables,
    table_names,
)

SUITE = {"name": "general", "source": "docstrings", "count": 3, "sha256": "ab" * 32}


def result(probe: str, **tables: pd.DataFrame) -> ProbeResult:
    return ProbeResult(probe, ["a=/m/a", "b=/m/b"], SUITE, {"dtype": "float32", "batch_size": 4}, tables)


def test_flip_rate_by_margin_is_drawn_at_the_bin_middle_one_line_per_comparison():
    by_margin = pd.DataFrame({"bin": [0, 1, 0, 1], "margin_low": [0.0, 0.1, 0.0, 0.5],
                              "margin_high": [0.1, 0.3, 0.5, 1.5], "routers": [10, 10, 4, 4],
                              "flipped": [5, 1, 2, 0], "flip_rate": [0.5, 0.1, 0.5, 0.0],
                              "comparison": ["bf16", "bf16", "batch", "batch"]})
    curves = flip_rate_by_margin(result("numerics", by_margin=by_margin))
    assert list(curves["series"]) == ["bf16", "bf16", "batch", "batch"]
    np.testing.assert_allclose(curves["x"], [0.05, 0.2, 0.25, 1.0])  # (0+0.1)/2, (0.1+0.3)/2, (0+0.5)/2, (0.5+1.5)/2
    np.testing.assert_allclose(curves["y"], [0.5, 0.1, 0.5, 0.0])
    # compare has no comparison column: one line named after the probe
    single = flip_rate_by_margin(result("compare", by_margin=by_margin.drop(columns="comparison")))
    assert set(single["series"]) == {"compare"}
    layers = router_flip_by_layer(result("compare", by_layer=pd.DataFrame({"layer": [3, 7], "changed": [0.1, 0.2],
                                                                            "router_flip": [0.2, 0.4]})))
    assert list(layers["x"]) == [3, 7] and list(layers["y"]) == [0.2, 0.4]


def test_saturation_grid_keeps_checkpoint_order_and_a_checkpoint_given_twice():
    table = pd.DataFrame({"checkpoint": ["run@9", "run@9", "a", "a", "run@9", "run@9"], "layer": [0, 1] * 3,
                          "tokens": 5, "saturation": [0.2, 0.4, 0.6, 0.8, 1.0, 1.0],
                          "saturation_top1": [0.1, 0.3, 0.5, 0.7, 1.0, 1.0]})
    grid = saturation_grid(result("saturation", saturation=table))
    assert list(grid.index) == ["run@9", "a", "run@9 (2)"] and list(grid.columns) == [0, 1]
    np.testing.assert_allclose(grid.to_numpy(), [[0.2, 0.4], [0.6, 0.8], [1.0, 1.0]])
    np.testing.assert_allclose(saturation_top1_grid(result("saturation", saturation=table)).loc["a"], [0.5, 0.7])


@pytest.mark.parametrize(
    ("tables", "expected"),
    [
        ({}, "has no table 'by_margin'"),
        ({"by_margin": pd.DataFrame({"margin_low": [0.0], "flip_rate": [0.1]})}, "no column 'margin_high'"),
        ({"by_margin": pd.DataFrame({"margin_low": [0.0], "margin_high": ["x"], "flip_rate": [0.1]})},
         "'margin_high' of table 'by_margin' is not numeric"),
    ],
)
def test_a_table_the_chart_cannot_use_is_named(tables, expected):
    with pytest.raises(ProbeError, match=expected):
        flip_rate_by_margin(result("compare", **tables))


def test_charts_are_known_per_probe_and_others_get_none():
    assert [c.name for c in charts_for("compare")] == ["flip_rate_by_margin", "router_flip_by_layer"]
    assert [c.name for c in charts_for("numerics")] == ["flip_rate_by_margin", "router_flip_by_layer"]
    assert [c.table for c in charts_for("saturation")] == ["saturation", "saturation"]
    assert charts_for("no-such-probe") == ()


def test_describe_and_stack_tables():
    one = result("compare", summary=pd.DataFrame({"tokens": [10], "router_flip": [0.5]}))
    two = result("compare", summary=pd.DataFrame({"tokens": [20], "router_flip": [0.0]}),
                 extra=pd.DataFrame({"x": [1]}))
    row = describe(one)
    assert row["probe"] == "compare" and row["texts"] == 3 and row["sha256"] == "ab" * 32
    assert row["checkpoints"] == "a=/m/a; b=/m/b" and row["settings"] == "dtype=float32, batch_size=4"
    pd.testing.assert_frame_equal(stack_tables({"p1": one}, "summary"), one.tables["summary"])
    stacked = stack_tables({"p1": one, "p2": two}, "summary")
    assert list(stacked.columns) == ["folder", "tokens", "router_flip"]
    assert list(stacked["folder"]) == ["p1", "p2"] and list(stacked["tokens"]) == [10, 20]
    assert list(stack_tables({"p1": one, "p2": two}, "extra")["folder"]) == ["p2"]
    assert table_names([one, two]) == ["summary", "extra"]


def test_plots_are_drawn_from_the_views(tmp_path):
    by_margin = pd.DataFrame({"margin_low": [0.0, 0.1], "margin_high": [0.1, 0.3], "flip_rate": [0.5, 0.1]})
    by_layer = pd.DataFrame({"layer": [0, 1], "router_flip": [0.2, 0.4]})
    saturation = pd.DataFrame({"checkpoint": ["a", "a", "a", "a"], "layer": [0, 1, 0, 1],
                               "saturation": [0.5, 0.6, 1.0, 1.0], "saturation_top1": [0.5, 0.6, 1.0, 1.0]})
    written = plot_probe(result("compare", by_margin=by_margin, by_layer=by_layer), tmp_path)
    written += plot_probe(result("saturation", saturation=saturation), tmp_path)  # "a" against itself: two rows
    assert [p.name for p in written] == ["compare_flips.png", "saturation_heatmap.png"]
    assert all(p.stat().st_size > 0 for p in written)


def test_probe_folder_round_trip_keeps_an_empty_table(tmp_path):
    original = result("depth", summary=pd.DataFrame({"tokens": [3]}), nothing=pd.DataFrame())
    read = read_probe_folder(write_probe_folder(original, tmp_path / "p"))
    assert read.probe == "depth" and read.suite == SUITE and read.checkpoints == original.checkpoints
    pd.testing.assert_frame_equal(read.tables["summary"], original.tables["summary"])
    assert read.tables["nothing"].empty


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("not_json", r"probe\.json is not valid JSON"),
        ("not_object", r"probe\.json is not a JSON object"),
        ("no_suite", r"probe\.json lacks 'suite' \(dict\)"),
        ("missing_csv", r"summary\.csv is missing \(probe\.json lists it\)"),
        ("bad_csv", r"summary\.csv is not a readable CSV table"),
        ("bad_name", r"lists table '\.\./x', not a valid table name"),
    ],
)
def test_a_damaged_probe_folder_is_refused_with_the_file_named(tmp_path, damage, expected):
    folder = write_probe_folder(result("compare", summary=pd.DataFrame({"tokens": [3]})), tmp_path / "p")
    meta = json.loads((folder / "probe.json").read_text())
    if damage == "not_json":
        (folder / "probe.json").write_text('{"probe": "compare", "tab')
    elif damage == "not_object":
        (folder / "probe.json").write_text("[1, 2]")
    elif damage == "no_suite":
        (folder / "probe.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "suite"}))
    elif damage == "missing_csv":
        (folder / "summary.csv").unlink()
    elif damage == "bad_csv":
        (folder / "summary.csv").write_text("tokens,router_flip\n1,2\n1,2,3,4\n")  # a row with too many fields
    elif damage == "bad_name":
        (folder / "probe.json").write_text(json.dumps({**meta, "tables": ["../x"]}))
    with pytest.raises(ProbeError, match=expected):
        read_probe_folder(folder)
