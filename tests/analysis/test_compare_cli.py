"""``moestab compare`` (moestab.analysis.comparison): group means +- se over seeds and paired differences with 95%
intervals from the command line, against a plain recomputation from metrics.jsonl; how a run was measured does not
split a condition; text, JSON, CSV and the Markdown report."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from moestab.metrics import keys
from moestab.run_folder import schema
from tests.support.runs import write_run

KEY = keys.ROUTING_CHANGED.format(pair="old_new")


def _runs(root):
    """GRPO and GSPO on seeds 0-2, the GRPO ones measured every step, the GSPO ones every 4th (no condition)."""
    paths = {}
    for algo in ("grpo", "gspo"):
        for seed in range(3):
            run = write_run(root / algo, f"seed-{seed}", steps=4, seed=seed + (10 if algo == "gspo" else 0))
            info = json.loads((run.path / schema.RUN_JSON).read_text())
            info["config"].update(algo=algo, seed=seed, measure_every=1 if algo == "grpo" else 4)
            (run.path / schema.RUN_JSON).write_text(json.dumps(info))
            paths[(algo, seed)] = run.path
    return paths


def _window_mean(path, key, first, last):
    lines = [json.loads(x) for x in (path / schema.METRICS_JSONL).read_text().splitlines()]
    return statistics.fmean(line[key] for line in lines if first <= line["step"] <= last and line.get(key) is not None)


def test_groups_and_paired_differences_match_a_plain_recomputation(tmp_path, cli_main, capsys):
    paths = _runs(tmp_path / "runs")
    assert cli_main(["compare", str(tmp_path / "runs"), "--steps", "2:4", "--metric", KEY, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fields"] == ["algo"] and out["window"] == [2, 4] and out["baseline"] == "algo=grpo"
    means = {k: _window_mean(p, KEY, 2, 4) for k, p in paths.items()}
    for group in out["groups"]:
        algo = group["group"].removeprefix("algo=")
        values = [means[(algo, s)] for s in range(3)]
        assert group["mean"] == pytest.approx(statistics.fmean(values), rel=1e-12)
        assert group["se"] == pytest.approx(statistics.stdev(values) / math.sqrt(3), rel=1e-12)
    (diff,) = out["differences"]
    d = [means[("gspo", s)] - means[("grpo", s)] for s in range(3)]
    half = 4.302652729749464 * statistics.stdev(d) / math.sqrt(3)  # t_{0.975, 2}
    assert diff["pairs"] == 3 and diff["mean"] == pytest.approx(statistics.fmean(d), rel=1e-12)
    assert (diff["low"], diff["high"]) == pytest.approx((statistics.fmean(d) - half, statistics.fmean(d) + half),
                                                        rel=1e-8)


def test_the_text_states_the_window_the_grouping_and_shares_in_percent(tmp_path, cli_main, capsys):
    _runs(tmp_path / "runs")
    assert cli_main(["compare", str(tmp_path / "runs"), "--metric", KEY]) == 0
    text = capsys.readouterr().out
    assert text.startswith("steps 1-4; groups by algo; baseline: algo=grpo")
    assert "Routing change old → new (% of routed slots)" in text
    assert "algo=gspo - algo=grpo: " in text and " pp (95% CI " in text and "3 seed pairs" in text


def test_csv_the_report_and_what_cannot_be_compared(tmp_path, cli_main, capsys):
    pytest.importorskip("matplotlib")
    _runs(tmp_path / "runs")
    report = tmp_path / "report"
    assert cli_main(["compare", str(tmp_path / "runs"), "--csv", str(tmp_path / "c.csv"), "--report",
                     str(report)]) == 0
    assert "kind" in (tmp_path / "c.csv").read_text().splitlines()[0]
    md = (report / "report.md").read_text()
    assert "## Routing change old → new" in md and "(baseline)" in md
    assert (report / (KEY.replace("/", "_") + ".png")).stat().st_size > 1000
    assert cli_main(["compare", str(tmp_path / "runs"), "--baseline", "algo=dapo"]) == 1
    assert "no group 'algo=dapo'" in capsys.readouterr().err
    assert cli_main(["compare", str(tmp_path / "runs"), "--by", "lr"]) == 1
    assert "no config field ['lr']" in capsys.readouterr().err
