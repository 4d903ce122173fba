"""The Training page marks a run's collapse warnings and its collapse onset on every curve (issue 57): a vertical
rule per mark in the run's colour, in the chart's one frame and so in its CSV."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from moestab.analysis.dashboard_data import collapse_marks
from moestab.metrics import keys
from moestab.run_folder import schema
from tests.support.dashboard import assert_clean, assert_interactive_with_csv, chart_named, marks, open_page

TRAINING_PAGE = "app_pages/training.py"


def _rewrite(run: Path, start: float) -> None:
    """gspo-off's metrics.jsonl with a warning at step 3 and eval accuracy falling for good from step 4."""
    lines = [json.loads(line) for line in (run / schema.METRICS_JSONL).read_text().splitlines()]
    evals = {2: start, 4: start - 0.2, 6: start - 0.2}
    for line in lines:
        line[keys.COLLAPSE_WARNING] = int(line[keys.STEP] == 3)
        if line[keys.STEP] in evals:
            line[keys.EVAL_ACCURACY] = evals[line[keys.STEP]]
    (run / schema.METRICS_JSONL).write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_the_marks_of_a_run_are_its_warnings_and_its_onset() -> None:
    m = pd.DataFrame({keys.STEP: [1, 2, 3, 4], keys.COLLAPSE_WARNING: [float("nan"), 0, 1, 0],
                      keys.EVAL_ACCURACY: [float("nan"), 0.5, float("nan"), 0.3]})
    got = collapse_marks(m, start=0.5)
    assert got.to_dict("records") == [{"step": 3, "mark": "warning"}, {"step": 4, "mark": "collapse onset"}]
    assert collapse_marks(m, start=None).mark.tolist() == ["warning"]  # no start: no onset


@pytest.mark.slow
def test_the_training_page_draws_the_marks_on_each_curve(make_app, runs_copy: Path, downloads: dict) -> None:
    start = json.loads((runs_copy / "gspo-off" / "run.json").read_text())["warm_start"]["accuracy"]
    _rewrite(runs_copy / "gspo-off", start)
    at = open_page(make_app(runs_copy), TRAINING_PAGE)
    assert_clean(at)
    assert_interactive_with_csv(at, downloads)
    chart = chart_named(at, "Reward (mean over the rollout batch)")
    assert "rule" in marks(chart.spec)
    drawn = chart.data.dropna(subset=["mark"])
    assert sorted(zip(drawn.run, drawn.step, drawn["mark"], strict=True)) == [
        ("gspo-off", 3, "warning"), ("gspo-off", 4, "collapse onset")]
    assert "collapse warnings (dashed" in " ".join(c.value for c in at.caption)
