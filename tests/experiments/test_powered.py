"""The powered experiment (moestab.experiments.powered): the design's runs, the registration's refusals, Holm and the
paired p-value against second implementations, and the manifest check, end to end at a tiny size."""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from moestab.experiments import powered
from moestab.experiments.registration import RegistrationError, block
from moestab.metrics import keys
from moestab.metrics.paired import min_detectable_difference
from moestab.run_folder.reader import load_metrics


def _design(tmp_path, **overrides) -> powered.Design:
    """The notebooks' smoke design (every reward 0), with its own cache."""
    return replace(powered.smoke_design(tmp_path / "smoke", cache_dir=str(tmp_path / "cache")), **overrides)


def test_holm_matches_the_step_down_rule_worked_by_hand():
    # sorted p 0.01, 0.02, 0.03, 0.04 -> 4 x 0.01, 3 x 0.02, 2 x 0.03, 1 x 0.04, made monotone
    assert powered.holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    assert powered.holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])


def test_the_paired_p_value_matches_students_t_in_closed_form():
    d = [1.0, 2.0, 3.0, 4.0]  # mean 2.5, sd sqrt(5/3), t = 2.5 / (sd / 2), df 3
    t = 2.5 / (math.sqrt(5 / 3) / 2)
    cdf = 0.5 + (t / math.sqrt(3) / (1 + t * t / 3) + math.atan(t / math.sqrt(3))) / math.pi  # df = 3
    assert powered.paired_p(d) == pytest.approx(2 * (1 - cdf), abs=1e-9)
    assert math.isnan(powered.paired_p([0.0, 0.0])) and math.isnan(powered.paired_p([1.0]))


def test_the_design_holds_each_arm_on_the_same_seeds_and_the_dense_control_at_the_same_depth(tmp_path):
    design = powered.Design(model="embedded:fine,layers=8", lr=5e-4, aux=0.01, task="arithmetic")
    assert design.arm_fields("dense_grpo_off")["model"] == "embedded:dense,layers=8"
    assert design.arm_fields("constant_grpo") == {"algo": "grpo", "routing_replay": "base",
                                                  "model": "embedded:fine,layers=8"}
    runs = powered.all_runs(design, tmp_path)
    assert len(runs) == len(powered.ARMS) * (len(design.seeds) + len(design.edge_factors) * len(design.edge_seeds))
    assert {r.config.lr for r in runs} == {2.5e-4, 5e-4, 1e-3}
    # The registered power: 15 seeds detect a 5-point difference at alpha 0.05 / 4 with power 0.8 (sd 5 points).
    assert 0.04 < design.min_detectable() <= 0.05


@pytest.mark.slow
def test_a_tiny_experiment_runs_reports_and_its_manifest_checks(tmp_path):
    design = _design(tmp_path)
    doc = tmp_path / "powered.md"
    with pytest.raises(RegistrationError, match="no registration"):
        powered.run_experiment(design, tmp_path / "runs", doc)
    registered_at = "2026-01-01T00:00:00"
    doc.write_text(f"registered {registered_at}\n\n" + block(powered.registration(design)) + "\n")
    with pytest.raises(RegistrationError, match="another design"):
        powered.run_experiment(_design(tmp_path, lr=2e-3), tmp_path / "runs", doc)
    powered.run_experiment(design, tmp_path / "runs", doc, log=lambda line: None)
    runs = powered.all_runs(design, tmp_path / "runs")
    table = powered.outcomes(runs)
    assert len(table) == len(runs) and set(table["arm"]) == set(powered.ARMS)
    contrasts = powered.contrasts(table[table["lr"] == design.lr])
    assert list(contrasts["arm"]) == [*powered.PRIMARY_CONTRASTS, *powered.SECONDARY_CONTRASTS]
    assert (contrasts["n"] == 2).all()
    rates = powered.collapse_rates(table)
    assert set(rates["lr"]) == {1e-3, 2e-3} and (rates["runs"] >= 1).all()
    curves = powered.curves(runs)  # eval every step: one row per run and step, windows of one step
    assert len(curves) == len(runs) * design.steps and set(curves["step"]) == {1, 2}
    one = curves[(curves["arm"] == "moe_grpo_off") & (curves["lr"] == design.lr) & (curves["seed"] == 2000)]
    metrics = load_metrics(runs[0].run_dir)
    assert one["eval_acc"].tolist() == metrics[keys.EVAL_ACCURACY].tolist()
    assert one["vol"].tolist() == metrics[keys.ROUTING_CHANGED.format(pair="old_new")].tolist()
    manifest = powered.manifest([r.run_dir for r in runs], tmp_path / "runs")
    assert powered.manifest_problems(manifest, design, registered_at) == []
    assert powered.manifest_problems(manifest, design, "2999-01-01T00:00:00")  # runs older than a registration
    tampered = manifest.copy()
    tampered.loc[0, "metrics_sha256"] = "abc"
    assert any("is not a sha256" in p for p in powered.manifest_problems(tampered, design, registered_at))
    dropped = manifest.iloc[1:]
    assert any(p.startswith("missing:") for p in powered.manifest_problems(dropped, design, registered_at))
    assert 0 < powered.run_hours(manifest) < 1
    written = powered.write_results(design, tmp_path / "runs", tmp_path / "results")
    assert [p.name for p in written] == list(powered.RESULT_FILES)
    pd.testing.assert_frame_equal(pd.read_csv(written[-1]), manifest)
    pd.testing.assert_frame_equal(pd.read_csv(written[1]), contrasts)


def test_curves_average_each_window_of_steps_up_to_its_evaluation(tmp_path, monkeypatch):
    rows = [{keys.STEP: s, keys.REWARD_MEAN: float(s), keys.ROUTING_CHANGED.format(pair="old_new"): s / 100,
             keys.EVAL_ACCURACY: s / 10 if s % 3 == 0 else math.nan} for s in range(1, 7)]
    monkeypatch.setattr(powered, "load_metrics", lambda run: pd.DataFrame(rows))
    run = SimpleNamespace(run_dir=tmp_path / "moe_grpo_off" / "seed-1", config=SimpleNamespace(lr=1e-3),
                          values={"seed": 1})
    table = powered.curves([run])
    assert table["step"].tolist() == [3, 6] and table["eval_acc"].tolist() == [0.3, 0.6]
    assert table["reward"].tolist() == [2.0, 5.0]  # steps 1-3 and 4-6
    assert table["vol"].tolist() == pytest.approx([0.02, 0.05])


def test_contrasts_report_the_realized_sd_and_the_difference_it_could_detect():
    diffs = [0.01 * ((7 * i) % 11 - 5) for i in range(15)]  # paired differences arm - baseline, seed by seed
    base = [{"arm": powered.BASELINE, "seed": i, "final_acc": 0.5} for i in range(15)]
    arms = [{"arm": a, "seed": i, "final_acc": 0.5 + diffs[i]} for a in powered.ARMS if a != powered.BASELINE
            for i in range(15)]
    table = powered.contrasts(pd.DataFrame(base + arms)).set_index("arm")
    sd = statistics.stdev(diffs)
    assert table.loc["moe_grpo_r2", "sd"] == pytest.approx(sd, rel=1e-9)
    # primary contrasts at the registration's level alpha / 4, the secondary one at alpha
    assert table.loc["moe_grpo_r2", "min_detectable"] == pytest.approx(
        min_detectable_difference(sd, 15, 0.05 / 4, 0.8), rel=1e-9)
    assert table.loc["dense_grpo_off", "min_detectable"] == pytest.approx(
        min_detectable_difference(sd, 15, 0.05, 0.8), rel=1e-9)


ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "powered_results"


def _launcher():
    import importlib.util

    spec = importlib.util.spec_from_file_location("powered_experiment", ROOT / "scripts" / "powered_experiment.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_committed_registration_is_the_design_of_the_passing_setting():
    from moestab.experiments.registration import check_registered

    check_registered(ROOT / "docs" / "powered.md", powered.registration(_launcher().design_of("fine8-lr5e-4", None)))


def test_the_committed_manifest_is_every_run_of_the_design_created_after_its_registration():
    registered = re.search(r"^registered (\S+)$", (ROOT / "docs" / "powered.md").read_text(), re.M).group(1)
    table = pd.read_csv(RESULTS / "manifest.csv")
    design = _launcher().design_of("fine8-lr5e-4", None)
    assert len(table) == 150 and powered.manifest_problems(table, design, registered) == []
    # the check can fail on this table: a run dropped, or one dated before the registration
    assert powered.manifest_problems(table.iloc[1:], design, registered) == [f"missing: {table['run'][0]}"]
    early = table.copy()
    early.loc[0, "created"] = "2026-11-28T11:00:00+00:00"
    assert len(powered.manifest_problems(early, design, registered)) == 1


def test_the_committed_results_are_what_the_committed_outcomes_give():
    outcomes = pd.read_csv(RESULTS / "outcomes.csv")
    manifest = pd.read_csv(RESULTS / "manifest.csv")
    folder = {(r.run_dir.parent.name, r.config.lr, r.values["seed"]): r.run_dir.relative_to("out").as_posix()
              for r in powered.all_runs(_launcher().design_of("fine8-lr5e-4", None), "out")}  # the grid's own names
    runs = [folder[row] for row in outcomes[["arm", "lr", "seed"]].itertuples(index=False, name=None)]
    assert sorted(runs) == sorted(manifest["run"])  # one outcome row per run the manifest lists
    comparison = outcomes[outcomes["lr"] == 5e-4]
    pd.testing.assert_frame_equal(powered.contrasts(comparison), pd.read_csv(RESULTS / "contrasts.csv"),
                                  check_exact=False, rtol=1e-12)
    pd.testing.assert_frame_equal(powered.collapse_rates(outcomes), pd.read_csv(RESULTS / "collapse_rates.csv"),
                                  check_exact=False, rtol=1e-12)
    curves = pd.read_csv(RESULTS / "curves.csv")
    final = curves[curves["step"] == 100].set_index(["arm", "lr", "seed"])["eval_acc"]
    assert final.sort_index().tolist() == pytest.approx(
        outcomes.set_index(["arm", "lr", "seed"])["final_acc"].sort_index().tolist(), abs=1e-6)
