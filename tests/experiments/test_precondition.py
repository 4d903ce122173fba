"""The precondition search (moestab.experiments.precondition): the order, the stop rule, the budget and the
registration's refusals, on tiny runs."""

from __future__ import annotations

import pytest

from moestab.experiments import precondition as pre
from moestab.experiments.registration import RegistrationError
from moestab.experiments.stability import run_stability
from tests.support.train import REWARD

# Every reward 0: advantages are 0, the policy moves by weight decay only, so the control is stable on every seed.
TINY = {"prompts_per_step": 4, "group_size": 4, "minibatches": 2, "eval_size": 8, "save_every": 1,
        "warm_start_max_steps": 0, "progress": False, "steps": 2, "eval_every": 1, "threads": 1}
ZERO = f"arithmetic:reward={REWARD}:always_zero"


def _settings() -> tuple[pre.Setting, ...]:
    return (pre.Setting("first", "embedded:layers=1,hidden=32", 1e-3, task=ZERO, step_seconds=0.5),
            pre.Setting("second", "embedded:layers=1,hidden=32", 2e-3, task=ZERO, step_seconds=0.5))


def _extra(tmp_path) -> dict:
    return {**pre.base_fields(cache_dir=str(tmp_path / "cache")), **TINY}


def test_the_search_stops_at_the_first_setting_that_passes_and_records_it(tmp_path):
    rows = pre.search(_settings(), tmp_path / "runs", seeds=(800,), extra=_extra(tmp_path), threshold=0.0,
                      log=lambda line: None)
    assert [r["setting"] for r in rows] == ["first"] and rows[0]["passes"]
    assert not (tmp_path / "runs" / "second").exists()
    moe = tmp_path / "runs" / "first" / "moe_grpo_off" / "seed-800"
    assert rows[0]["vol_by_seed"] == [run_stability(moe)["vol"]] and rows[0]["control_stable"] == [True]
    assert len(rows[0]["vol_by_layer"]) == 1 and rows[0]["core_hours"] > 0
    # Resumed: nothing runs again, the same row comes back (a table of the search so far).
    again = pre.search(_settings(), tmp_path / "runs", seeds=(800,), extra=_extra(tmp_path), threshold=0.0, dry=True)
    assert again == rows


def test_a_setting_that_fails_the_check_is_recorded_and_the_next_one_tried(tmp_path):
    rows = pre.search(_settings(), tmp_path / "runs", seeds=(800,), extra=_extra(tmp_path), threshold=1.0,
                      log=lambda line: None)
    assert [r["setting"] for r in rows] == ["first", "second"]
    assert not any(r["passes"] for r in rows)  # the control is stable, but no run changes all of its experts


def test_a_setting_beyond_the_budget_is_not_started(tmp_path):
    said = []
    rows = pre.search(_settings(), tmp_path / "runs", seeds=(800,), extra=_extra(tmp_path), budget=1e-6,
                      log=said.append)
    assert rows == [] and not (tmp_path / "runs").exists()
    assert "first: not tried" in said[0] and "exceed the budget" in said[0]


def test_the_run_refuses_a_missing_or_changed_registration(tmp_path):
    doc = tmp_path / "precondition.md"
    with pytest.raises(RegistrationError, match="no registration"):
        pre.check_registration(doc, _settings())
    import json

    doc.write_text("# plan\n\n```json\n" + json.dumps(pre.registration(_settings()), indent=1) + "\n```\n")
    pre.check_registration(doc, _settings())
    with pytest.raises(RegistrationError, match="another design"):
        pre.check_registration(doc, _settings()[:1])


def test_the_committed_registration_is_the_search_that_runs():
    from pathlib import Path

    pre.check_registration(Path(__file__).resolve().parents[2] / "docs" / "precondition.md", pre.SETTINGS)
    names = [s.name for s in pre.SETTINGS]
    assert len(set(names)) == len(names)  # each setting has its own run folder
