"""Issue 52's experiment (moestab.experiments.drift): its design and registration, its statistics against second
implementations, the provenance check, and a tiny experiment end to end."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from moestab.experiments import drift, powered
from moestab.experiments.provenance import commit_problems, read_declarations
from moestab.experiments.registration import RegistrationError, block, registered_block

ROOT = Path(__file__).resolve().parents[2]


def _design(tmp_path, **overrides) -> drift.DriftDesign:
    """The notebooks' smoke design (every reward 0), with its own cache."""
    base = powered.smoke_design(tmp_path / "smoke", cache_dir=str(tmp_path / "cache"))
    return drift.DriftDesign(base, lr_match=7e-4, **overrides)


def _launcher():
    spec = importlib.util.spec_from_file_location("drift_experiment", ROOT / "scripts" / "drift_experiment.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_committed_registration_is_the_design_the_launcher_runs():
    design = _launcher().design_of(None)
    assert registered_block(ROOT / "docs" / "drift.md") == drift.registration(design)
    reg = drift.registration(design)
    assert reg["setting"]["seeds"] == list(range(2000, 2015)) and reg["setting"]["lr"] == 5e-4
    assert reg["arms"]["refresh_k33"] == {"stage": 2, "algo": "grpo", "routing_replay": "base",
                                          "base_refresh_every": 33, "model": "embedded:fine,layers=8", "lr": 5e-4}
    assert reg["arms"]["dense_gspo_off"]["model"] == "embedded:dense,layers=8"
    assert reg["arms"]["moe_grpo_lrmatch"]["lr"] == design.lr_match
    assert reg["runs"] == 12 * 15


def test_the_matched_lr_interpolates_the_routing_change_in_log_lr():
    """GSPO's change 3.0% sits a quarter of the way from GRPO's 2.0% at lr 1e-4 to 6.0% at 4e-4 (log2 span 2): half a
    doubling above 1e-4, so 1e-4 * 2 ** 0.5."""
    rows = [{"arm": "moe_grpo_off", "lr": 1e-4, "step": s, "vol": 0.02} for s in (10, 20)]
    rows += [{"arm": "moe_grpo_off", "lr": 4e-4, "step": s, "vol": 0.06} for s in (10, 20)]
    rows += [{"arm": "moe_gspo_off", "lr": 4e-4, "step": s, "vol": v} for s, v in ((10, 0.025), (20, 0.035))]
    rows += [{"arm": "moe_grpo_off", "lr": 4e-4, "step": 50, "vol": 0.9}]  # outside the window: ignored
    matched = drift.matching_lr(pd.DataFrame(rows), lr=4e-4, lower=1e-4)
    assert matched == float(f"{1e-4 * 2 ** 0.5:.2g}")
    committed = drift.matching_lr(pd.read_csv(ROOT / "docs" / "powered_results" / "curves.csv"))
    assert 2.5e-4 < committed < 5e-4  # GSPO's change at 5e-4 lies between GRPO's at 2.5e-4 and at 5e-4


def test_the_trend_is_each_seeds_least_squares_slope_over_the_dose_levels():
    rng = np.random.default_rng(0)
    values = rng.normal(size=(5, 4))
    table = pd.DataFrame([{"seed": s, "arm": arm, "mean_eval_acc": values[s, code]}
                          for s in range(5) for arm, code in drift.DOSE])
    slopes = drift.trend_slopes(table, "mean_eval_acc")
    expected = [np.polyfit([0, 1, 2, 3], values[s], 1)[0] for s in range(5)]
    assert np.allclose(slopes, expected, rtol=1e-12, atol=1e-12)


def test_mcnemar_is_the_exact_binomial_test_of_the_discordant_pairs():
    arm = [1, 1, 1, 1, 0, 0, 1, 0]
    ref = [0, 0, 0, 1, 0, 1, 0, 0]  # discordant: 4 arm-only, 1 reference-only
    assert drift.mcnemar_p(arm, ref) == pytest.approx(2 * (1 + 5) / 32)  # 2 P(X <= 1), X ~ Bin(5, 1/2)
    assert drift.mcnemar_p([1, 0], [1, 0]) == 1.0


def test_contrasts_pair_by_seed_and_correct_the_primary_ones(tmp_path):
    design = _design(tmp_path)
    rows = []
    for seed in range(6):
        for arm in drift.ARMS:
            shift = {"refresh_k10": 0.05, "refresh_k33": 0.08, "constant_grpo": 0.1}.get(arm, 0.0)
            rows.append({"arm": arm, "seed": seed, "mean_eval_acc": 0.4 + shift + 0.01 * ((seed * 7 + len(arm)) % 5),
                         "collapse": float(arm == drift.BASELINE and seed < 4)})
    table = pd.DataFrame(rows)
    out = drift.contrasts(table, design, 2).set_index(["contrast", "outcome"])
    k10 = out.loc[("refresh_k10 - moe_grpo_off", "mean_eval_acc")]
    d = (table[table.arm == "refresh_k10"].set_index("seed")["mean_eval_acc"]
         - table[table.arm == drift.BASELINE].set_index("seed")["mean_eval_acc"])
    assert k10["mean_diff"] == pytest.approx(d.mean()) and k10["n"] == 6
    assert out.loc[("refresh_k10 - moe_grpo_off", "collapse"), "p"] == pytest.approx(drift.mcnemar_p([0] * 6,
                                                                                                    [1] * 4 + [0] * 2))
    primary = out[out["primary"]].xs("mean_eval_acc", level="outcome")
    assert list(primary["p_holm"]) == pytest.approx(powered.holm(list(primary["p"])))
    assert out[~out["primary"]]["p_holm"].isna().all()
    assert out.loc[("trend", "mean_eval_acc"), "mean_diff"] > 0  # the outcome rises with the window


def test_an_undefined_p_keeps_the_holm_family_at_its_registered_size(tmp_path):
    """Amendment 1: no run of the dose arms collapses, so every seed's collapse slope is 0 and the trend's p is
    undefined; the collapse family is still adjusted over its 4 registered contrasts, the undefined one at 1."""
    design = _design(tmp_path)
    rows = [{"arm": arm, "seed": seed, "mean_eval_acc": 0.5 + 0.01 * ((seed + len(arm)) % 3),
             "collapse": float(arm in (drift.BASELINE, "moe_grpo_lb") and seed < 3)}
            for seed in range(6) for arm in drift.ARMS]
    out = drift.contrasts(pd.DataFrame(rows), design, 2)
    family = out[out["primary"] & (out["outcome"] == "collapse")].set_index("contrast")
    assert len(family) == 4 and math.isnan(family.loc["trend", "p"]) and family.loc["trend", "p_holm"] == 1.0
    defined = family.drop(index="trend")
    assert list(defined["p_holm"]) == pytest.approx(powered.holm([*defined["p"], 1.0])[:3])
    assert family["min_detectable"].isna().all()  # a t-test's detectable difference means nothing for McNemar


def test_the_amended_contrasts_against_their_definitions(tmp_path):
    """The trend without K = infinity is the per-seed slope over K = 1, 10, 33; an interaction is per seed
    (a - b) - (c - d); the amended rows are unadjusted, and the free outcomes get every contrast too."""
    design = _design(tmp_path)
    rng = np.random.default_rng(1)
    table = pd.DataFrame([{"arm": arm, "seed": seed, "mean_eval_acc": rng.normal(0.5, 0.05),
                           "collapse": float(rng.random() < 0.3), "free_eval_acc": rng.normal(0.5, 0.05),
                           "free_collapse": 0.0} for seed in range(7) for arm in drift.ARMS])
    wide = table.pivot(index="seed", columns="arm", values="free_eval_acc")
    two = drift.contrasts(table, design, 2).set_index(["contrast", "outcome"])
    finite = two.loc[("trend_finite", "free_eval_acc")]
    dose = ["refresh_k1", "refresh_k10", "refresh_k33"]
    slopes = [np.polyfit([0, 1, 2], wide.loc[s, dose], 1)[0] for s in wide.index]
    assert finite["mean_diff"] == pytest.approx(np.mean(slopes), abs=1e-12) and finite["kind"] == "amended"
    assert math.isnan(finite["p_holm"]) and not finite["registered_outcome"]
    three = drift.contrasts(table, design, 3).set_index(["contrast", "outcome"])
    held = three.loc[("interaction_held", "free_eval_acc")]
    per_seed = ((wide["constant_gspo"] - wide["constant_grpo"]) - (wide["moe_gspo_off"] - wide["moe_grpo_off"]))
    assert held["mean_diff"] == pytest.approx(per_seed.mean(), abs=1e-12) and held["n"] == 7
    assert held["sd"] == pytest.approx(per_seed.std(), abs=1e-12)
    primary = three[three["primary"]].xs("free_eval_acc", level="outcome")
    assert list(primary["p_holm"]) == pytest.approx(powered.holm(list(primary["p"])))  # its own family
    assert three.loc[("moe_grpo_lrmatch - moe_gspo_off", "free_eval_acc"), "kind"] == "amended"


def test_as_good_as_needs_the_interval_inside_the_registered_detectable_difference(tmp_path):
    design = _design(tmp_path)
    margin = design.min_detectable(2)
    assert drift.equivalent({"ci_low": -margin / 2, "ci_high": margin / 2}, design, 2)
    assert not drift.equivalent({"ci_low": -margin * 1.5, "ci_high": margin / 2}, design, 2)  # 0 inside: not enough


def test_the_free_outcomes_take_the_mean_and_the_last_free_evaluation():
    evals = pd.DataFrame([{"arm": "a", "seed": 1, "step": s, "free": v} for s, v in ((20, 0.5), (40, 0.3), (60, 0.2))]
                         + [{"arm": "a", "seed": 2, "step": s, "free": 0.45} for s in (20, 40, 60)])
    table = pd.DataFrame([{"arm": "a", "seed": 1, "start_acc": 0.45}, {"arm": "a", "seed": 2, "start_acc": 0.45},
                          {"arm": "b", "seed": 1, "start_acc": 0.45}])
    out = drift.with_free_outcomes(table, evals).set_index(["arm", "seed"])
    assert out.loc[("a", 1), "free_eval_acc"] == pytest.approx(1 / 3) and out.loc[("a", 1), "free_collapse"] == 1.0
    assert out.loc[("a", 2), "free_collapse"] == 0.0  # 0.45 is not more than 10 points below 0.45
    assert math.isnan(out.loc[("b", 1), "free_eval_acc"]) and math.isnan(out.loc[("b", 1), "free_collapse"])


def test_the_lr_match_check_pairs_the_early_routing_change_by_seed():
    rows = [{"arm": arm, "seed": seed, "step": step, "old_new": base + 0.001 * seed + (0.5 if step > 40 else 0)}
            for arm, base in (("moe_grpo_lrmatch", 0.04), ("moe_gspo_off", 0.037)) for seed in range(4)
            for step in (1, 20, 40, 60)]
    check = drift.lr_match_check(pd.DataFrame(rows))
    assert check["n"] == 4 and check["mean_diff"] == pytest.approx(0.003) and check["lrmatch"] == pytest.approx(0.0415)


def test_provenance_refuses_mixed_commits_unless_declared_and_dirty_or_unknown_code():
    clean = pd.DataFrame({"run": ["a/1", "a/2"], "commit": ["c1" * 20, "c1" * 20], "dirty": [False, False]})
    assert commit_problems(clean) == []
    mixed = clean.assign(commit=["c1" * 20, "c2" * 20])
    assert any("mix commits" in p for p in commit_problems(mixed))
    declared = pd.DataFrame([{"commit_a": "c2" * 20, "commit_b": "c1" * 20, "run_a": "x", "run_b": "y",
                              "checked": "2026-11-29"}])
    assert commit_problems(mixed, declared) == []
    assert any("modified tree" in p for p in commit_problems(clean.assign(dirty=[False, True])))
    assert any("no commit on record" in p for p in commit_problems(clean.assign(commit=[None, "c1" * 20])))


@pytest.mark.slow
def test_same_run_declares_two_identical_runs_and_refuses_to_declare_without_a_commit(tmp_path):
    from moestab.train import train
    from tests.support.train import tiny_config

    a, b = tmp_path / "a", tmp_path / "b"
    for run in (a, b):
        train(tiny_config(run, tmp_path / "cache", steps=1), log=lambda s: None)
    declarations = tmp_path / "same_code.csv"
    script = [sys.executable, str(ROOT / "scripts" / "same_run.py"), str(a), str(b), "--declare", str(declarations)]
    done = subprocess.run(script, capture_output=True, text=True, cwd=ROOT)
    clean = not subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
    if clean:  # the runs carry this checkout's clean commit
        assert done.returncode == 0, done.stdout + done.stderr
        table = read_declarations(declarations)
        assert len(table) == 1 and table.loc[0, "commit_a"] == table.loc[0, "commit_b"]
    else:  # a modified tree: its commit does not name the code, so nothing is declared
        assert done.returncode == 1 and "no clean commit" in done.stdout and not declarations.exists()


@pytest.mark.slow
def test_a_tiny_experiment_runs_reports_and_evaluates_its_checkpoints(tmp_path, monkeypatch):
    design = _design(tmp_path)
    doc = tmp_path / "drift.md"
    with pytest.raises(RegistrationError, match="no registration"):
        drift.run_experiment(design, tmp_path / "runs", doc)
    doc.write_text(block(drift.registration(design)) + "\n")
    drift.run_experiment(design, tmp_path / "runs", doc, log=lambda line: None)
    runs = drift.all_runs(design, tmp_path / "runs")
    assert [r.run_dir.parent.name for r in runs[:3]] == ["moe_grpo_off", "moe_grpo_r3", "constant_grpo"]
    assert {r.config.lr for r in runs if r.run_dir.parent.name == "moe_grpo_lrmatch"} == {7e-4}
    written = drift.write_results(design, tmp_path / "runs", tmp_path / "results",
                                  ROOT / "docs" / "powered_results" / "outcomes.csv")
    assert [p.name for p in written] == list(drift.RESULT_FILES)
    contrasts = pd.read_csv(tmp_path / "results" / "contrasts.csv")
    assert set(contrasts["stage"]) == {2, 3} and (contrasts["n"] == 2).all()
    evals = pd.read_csv(tmp_path / "results" / "checkpoint_evals.csv").set_index(["arm", "seed"])
    assert len(evals) == 3 * 2
    # Each run's own routing reproduces the accuracy it recorded at its end.
    assert (evals.loc["constant_grpo", "base"] == evals.loc["constant_grpo", "recorded"]).all()
    assert (evals.loc["moe_grpo_off", "free"] == evals.loc["moe_grpo_off", "recorded"]).all()
    free = pd.read_csv(tmp_path / "results" / "free_evals.csv").set_index(["arm", "seed", "step"])
    steps = drift.free_eval_steps(runs[0].config)
    assert steps == list(range(design.powered.steps + 1))[1:] and len(free) == len(runs) * len(steps)
    assert (free.xs("constant_grpo", level="arm")["source"] == "evaluated").all()
    assert (free.xs(drift.BASELINE, level="arm")["free"] == free.xs(drift.BASELINE, level="arm")["recorded"]).all()
    held = free.xs("constant_grpo", level="arm").xs(2, level="step")["free"]
    assert (held == evals.loc["constant_grpo", "free"]).all()  # the same checkpoint evaluated by the stage-1 path
    baseline_run = next(r for r in runs if r.run_dir.parent.name == drift.BASELINE)
    assert drift.checkpoint_accuracy(baseline_run.run_dir, "free", 2) == free.loc[(drift.BASELINE, 2000, 2), "free"]
    outcomes = pd.read_csv(tmp_path / "results" / "outcomes.csv")
    assert outcomes["free_eval_acc"].notna().all()
    monkeypatch.setattr(drift, "checkpoint_accuracy", lambda *a, **k: pytest.fail("evaluated again"))
    drift.write_results(design, tmp_path / "runs", tmp_path / "results",
                        ROOT / "docs" / "powered_results" / "outcomes.csv")  # every evaluation reused
    assert pd.read_csv(tmp_path / "results" / "free_evals.csv").equals(free.reset_index())
    curves = pd.read_csv(tmp_path / "results" / "step_curves.csv")
    assert len(curves) == len(runs) * design.powered.steps
    assert (curves[curves["arm"] == "constant_grpo"]["base_distance"] == 0).all()
    assert curves[curves["arm"] == drift.BASELINE]["single_update"].notna().all()
    assert curves[curves["arm"] == "moe_grpo_r3"]["single_update"].isna().all()  # replayed updates choose no routes
    assert math.isfinite(curves["load_entropy"].iloc[0])
    manifest = pd.read_csv(tmp_path / "results" / "manifest.csv")
    assert len(manifest) == len(runs) and manifest["commit"].notna().all()
    problems = commit_problems(manifest)  # one commit; clean unless this checkout has uncommitted changes
    assert all("modified tree" in p for p in problems) and (problems == []) == (not manifest["dirty"].any())
    mixed = manifest.assign(commit=["a" * 40] + ["b" * 40] * (len(manifest) - 1), dirty=False)
    assert any("mix commits" in p for p in commit_problems(mixed))
    rebuilt = pd.read_csv(tmp_path / "results" / "replication.csv")  # the committed runs of the same arm, seed, lr
    assert {"final_acc", "final_acc_committed", "same_final"} <= set(rebuilt.columns)
