"""Findings that cannot drift (moestab.experiments.findings, scripts/findings.py): published notebook values read back,
the template rendered, and the committed docs/findings.md equal to the rendering of the committed notebooks."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest

from moestab.experiments import findings as F
from moestab.metrics.paired import min_detectable_difference, paired_power

ROOT = Path(__file__).resolve().parents[2]


def _notebook(path: Path, *bundles: dict) -> Path:
    """An executed notebook whose cells display ``bundles`` (as show_findings would), plus an ordinary output."""
    nb = nbformat.v4.new_notebook()
    plain = nbformat.v4.new_code_cell("1 + 1", outputs=[nbformat.v4.new_output("execute_result", {"text/plain": "2"})])
    nb.cells = [plain] + [nbformat.v4.new_code_cell("show_findings(...)", outputs=[
        nbformat.v4.new_output("display_data", bundle)]) for bundle in bundles]
    nbformat.write(nb, path)
    return path


def test_published_values_read_back(tmp_path):
    path = _notebook(tmp_path / "02_depth.ipynb", F.findings_bundle({"b": np.float32(0.5), "a": 3}),
                     F.findings_bundle({"c": "R2", "nan": math.nan}))
    assert F.read_findings(path) == {"b": 0.5, "a": 3, "c": "R2", "nan": None}  # numpy scalars and NaN made plain
    assert F.read_all([path]) == {"02": F.read_findings(path)}
    assert F.findings_bundle({"x": 1.5})["text/plain"] == "x = 1.5"


def test_bad_values_and_names_are_refused(tmp_path):
    with pytest.raises(F.FindingsError, match="publish numbers, strings or booleans"):
        F.findings_bundle({"x": [1, 2]})
    with pytest.raises(F.FindingsError, match="key 'a b' is not valid"):
        F.findings_bundle({"a b": 1})
    twice = _notebook(tmp_path / "03_x.ipynb", F.findings_bundle({"a": 1}), F.findings_bundle({"a": 2}))
    with pytest.raises(F.FindingsError, match="'a' is published twice"):
        F.read_findings(twice)
    with pytest.raises(F.FindingsError, match="starts with two digits"):
        F.notebook_id("notebooks/depth.ipynb")


def test_render_fills_formats_and_names_what_is_missing():
    values = {"01": {"acc": 0.4567, "n": 5, "none": None}, "02": {"r": 12.345}}
    # 0.4567 as a percent with one decimal is 45.7%; 12.345 with no spec takes 3 significant digits: 12.3.
    text = "acc {{01:acc:.1%}} over {{01:n}} seeds, ratio {{02:r}}x, {{ 01:none }}"
    assert F.render(text, values) == "acc 45.7% over 5 seeds, ratio 12.3x, n/a"
    with pytest.raises(F.FindingsError, match="notebook 03 published nothing; notebooks with findings: 01, 02"):
        F.render("{{03:acc}}", values)
    with pytest.raises(F.FindingsError, match="did not publish 'ac'; it published: acc, n, none"):
        F.render("{{01:ac}}", values)
    with pytest.raises(F.FindingsError, match="format spec 'd' does not apply"):
        F.render("{{02:r:d}}", values)
    with pytest.raises(F.FindingsError, match=r"placeholder \{\{1:acc\}\} is malformed"):
        F.render("{{1:acc}}", values)


def test_the_committed_findings_are_the_rendering_of_the_committed_notebooks():
    spec = importlib.util.spec_from_file_location("findings_script", ROOT / "scripts" / "findings.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert (ROOT / "docs" / "findings.md").read_text() == script.rendered(), (
        "docs/findings.md differs from the executed notebooks' published numbers: run python scripts/findings.py")


def test_the_controlled_experiments_detectable_differences_are_the_ones_quoted():
    # docs/findings.md quotes them by hand (scripts/controlled_power.py prints them): recomputed here from the
    # committed report, so a changed report or a changed computation fails until the text follows.
    paired = pd.read_csv(ROOT / "docs" / "controlled_results" / "paired.csv")
    rows = paired[paired.outcome == "final_acc"].set_index("arm")
    points = {arm: 100 * min_detectable_difference(row.sd_diff, int(row.n)) for arm, row in rows.iterrows()}
    dense_power = paired_power(0.10, rows.loc["dense_grpo_off", "sd_diff"], int(rows.loc["dense_grpo_off", "n"]))
    quoted = (f"is R2 {points['moe_grpo_r2']:.1f}, R3 {points['moe_grpo_r3']:.1f}, GSPO {points['moe_gspo_off']:.1f} "
              f"and frozen-router {points['frozen_grpo_off']:.1f} points, and {points['dense_grpo_off']:.1f} points "
              f"for the dense control, whose power for a 10-point difference is {dense_power:.0%}")
    moe = [points[arm] for arm in rows.index if arm != "dense_grpo_off"]
    text = " ".join((ROOT / "docs" / "findings.md").read_text().split())  # line breaks as spaces
    assert quoted in text
    assert f"effects below {min(moe):.1f}-{max(moe):.1f} points" in text
