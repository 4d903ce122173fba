"""The powered experiment (moestab.experiments.powered): the design's runs, the registration's refusals, Holm and the
paired p-value against second implementations, and the manifest check, end to end at a tiny size."""

from __future__ import annotations

import math

import pytest

from moestab.experiments import powered
from moestab.experiments.registration import RegistrationError, block
from tests.support.train import REWARD

TINY = (("prompts_per_step", 4), ("group_size", 4), ("minibatches", 2), ("save_every", 1),
        ("warm_start_max_steps", 0), ("progress", False))


def _design(tmp_path, **overrides) -> powered.Design:
    values = {"model": "embedded:layers=1,hidden=32", "lr": 1e-3, "aux": 0.01,
              "task": f"arithmetic:reward={REWARD}:always_zero", "seeds": (2000, 2001), "edge_seeds": (2000,),
              "edge_factors": (2.0,), "steps": 2, "eval_every": 1, "eval_size": 8, "extra": TINY,
              "cache_dir": str(tmp_path / "cache"), **overrides}
    return powered.Design(**values)


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
    manifest = powered.manifest(runs, tmp_path / "runs")
    assert powered.manifest_problems(manifest, design, registered_at) == []
    assert powered.manifest_problems(manifest, design, "2999-01-01T00:00:00")  # runs older than a registration
    tampered = manifest.copy()
    tampered.loc[0, "metrics_sha256"] = "abc"
    assert any("is not a sha256" in p for p in powered.manifest_problems(tampered, design, registered_at))
    dropped = manifest.iloc[1:]
    assert any(p.startswith("missing:") for p in powered.manifest_problems(dropped, design, registered_at))


def test_the_committed_registration_is_the_design_of_the_passing_setting():
    import importlib.util
    from pathlib import Path

    from moestab.experiments.registration import check_registered

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("powered_experiment", root / "scripts" / "powered_experiment.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    check_registered(root / "docs" / "powered.md", powered.registration(script.design_of("fine8-lr5e-4", None)))
