"""Issue 57's study (moestab.experiments.collapse_study): onsets, hits and false alarms on hand-made runs, the logistic
fit against plain gradient descent, calibration, and the registration docs/collapse.md commits."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from moestab.experiments import collapse_study as study
from moestab.experiments.provenance import commit_problems
from moestab.experiments.registration import check_registered
from moestab.metrics.collapse_warning import DEFAULT_RULE, SIGNALS, WarningRule

SIGNALS_BY_KEY = {s.key: s for s in SIGNALS.values()}

ROOT = Path(__file__).resolve().parents[2]
VOL = SIGNALS["vol"].key


@pytest.mark.parametrize(("evals", "start", "onset"), [
    ([0.50, 0.52, 0.51, 0.49], 0.50, None),  # stable
    ([0.50, 0.30, 0.55, 0.52], 0.50, None),  # dipped, recovered: the final is what collapses
    ([0.50, 0.48, 0.42, 0.38], 0.50, 30),  # from step 30 on, more than 5 points below
    ([0.50, 0.30, 0.46, 0.38], 0.50, 40),  # 0.46 is within 5 points: the onset is after it
    ([0.30, 0.31, 0.32, 0.33], 0.50, 10),  # below from the first evaluation
])
def test_the_onset_is_where_the_run_stays_below(evals: list[float], start: float, onset: int | None) -> None:
    series = pd.Series(evals, index=[10, 20, 30, 40])
    assert study.onset_step(series, start) == onset


def _record(vol: np.ndarray, onset: int | None, split: str = "dev", seed: int = 0) -> study.RunRecord:
    steps = pd.DataFrame({"step": np.arange(1, len(vol) + 1), VOL: vol})
    run = study.StudyRun(Path(f"/runs/r{seed}"), split, "arm", seed)
    return study.RunRecord(run, steps, onset, 0.5, 0.3 if onset else 0.5)


def _flat(n: int = 100, level: float = 0.04, seed: int = 0) -> np.ndarray:
    return level + 0.002 * np.random.default_rng(seed).standard_normal(n)


def test_a_warning_before_the_onset_is_a_hit_with_its_lead_and_one_in_a_quiet_run_is_a_false_alarm() -> None:
    rule = WarningRule(signals=("vol",), weights=(1.0,), threshold=4.0)
    rising = _flat()
    rising[59:] += 0.05  # jumps at step 60
    hit = study.score_run(rule, _record(rising, onset=80))
    assert hit["hit"] and hit["lead"] == 80 - int(hit["warnings"].split()[0])
    assert hit["false_alarms"] == 0
    late = study.score_run(rule, _record(rising, onset=200))  # the jump is 140 steps before: outside the horizon
    assert not late["hit"] and math.isnan(late["lead"])
    quiet = study.score_run(rule, _record(rising, onset=None))
    assert quiet["false_alarms"] == len(quiet["warnings"].split()) >= 1
    table = pd.DataFrame([hit, late, quiet])
    s = study.summarize(table)
    assert (s["collapsed"], s["hits"], s["recall"]) == (2, 1, 0.5)
    assert s["false_alarms_per_100"] == pytest.approx(100 * quiet["false_alarms"] / quiet["watched_steps"])


def test_calibration_takes_the_lowest_threshold_within_the_false_alarm_rate() -> None:
    records = [_record(_flat(seed=s), None, seed=s) for s in range(4)]
    rising = _flat(seed=9)
    rising[59:] += 0.05
    records.append(_record(rising, onset=80, seed=9))
    rule = WarningRule(signals=("vol",), weights=(1.0,), threshold=0.0)
    chosen = study.calibrate(rule, records, 0.5)
    assert chosen is not None
    assert study.summarize(study.score_rule(chosen, records))["false_alarms_per_100"] <= 0.5
    lower = study.THRESHOLDS[study.THRESHOLDS.index(chosen.threshold) - 1]
    below = study.summarize(study.score_rule(WarningRule(("vol",), (1.0,), lower), records))
    assert below["false_alarms_per_100"] > 0.5


def test_the_logistic_fit_matches_gradient_descent() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((400, 3))
    y = (rng.random(400) < 1 / (1 + np.exp(-(0.5 + x @ np.array([1.5, -1.0, 0.0]))))).astype(float)
    intercept, weights = study.fit_logistic(x, y, l2=1.0)
    beta = np.zeros(4)  # the same penalised loss by plain gradient descent
    design = np.hstack([np.ones((400, 1)), x])
    for _ in range(20000):
        p = 1 / (1 + np.exp(-design @ beta))
        beta -= 0.002 * (design.T @ (p - y) + np.r_[0.0, beta[1:]])
    np.testing.assert_allclose(np.r_[intercept, weights], beta, atol=1e-6)


def test_docs_collapse_md_registers_the_study_the_launcher_runs() -> None:
    check_registered(ROOT / "docs" / "collapse.md", study.registration())


def _records_with_signals(seed: int, collapsed: bool) -> study.RunRecord:
    """100 steps of every signal as noise; a collapsed run's vol rises from step 50 (onset 80)."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"step": np.arange(1, 101)})
    for s in SIGNALS.values():
        frame[s.key] = 1.0 + 0.05 * rng.standard_normal(100)
    if collapsed:
        frame.loc[49:, VOL] += np.linspace(0, 1.0, 51)
    run = study.StudyRun(Path(f"/runs/s{seed}"), "dev", "arm", seed)
    return study.RunRecord(run, frame, 80 if collapsed else None, 0.5, 0.3 if collapsed else 0.5)


def test_the_chosen_candidate_is_the_one_that_sees_the_planted_signal() -> None:
    dev = [_records_with_signals(s, collapsed=s % 2 == 0) for s in range(8)]
    rules = study.candidates(dev)
    assert [r.name for r in rules] == [*SIGNALS, *study.MODELS]
    calibrated = [c for c in (study.calibrate(r, dev, study.FALSE_ALARMS_PER_100) for r in rules) if c]
    chosen = study.select(calibrated, dev)
    assert "vol" in chosen.signals
    s = study.summarize(study.score_rule(chosen, dev))
    assert s["recall"] == 1.0 and s["false_alarms_per_100"] <= study.FALSE_ALARMS_PER_100
    round_trip = study.rule_from_dict(study.rule_to_dict(chosen))
    assert round_trip == chosen


def test_the_default_rule_is_the_one_the_study_chose() -> None:
    chosen = json.loads((ROOT / "docs" / "collapse_results" / "chosen.json").read_text())["shipped"]
    assert study.rule_from_dict(chosen) == DEFAULT_RULE


def test_the_report_scores_each_held_out_set_and_all_together_and_recalibrates_on_dev_only() -> None:
    dev = [_records_with_signals(s, collapsed=s % 2 == 0) for s in range(8)]
    held = [replace(r, run=replace(r.run, split=split)) for r, split in
            zip([_records_with_signals(s, collapsed=s % 2 == 0) for s in range(20, 24)],
                ["held_seeds", "held_seeds", "held_setting", "held_setting"], strict=True)]
    table, per_run, choice = study.fit(dev)
    assert len(per_run) == len(dev) and set(table["rule"]) == {d["name"] for d in choice["calibrated"]}
    runs, by_split, curve = study.report(dev, held, choice)
    assert runs["path"].tolist() == [str(r.run.path) for r in held]
    assert by_split.groupby("split")["runs"].first().to_dict() == {"held_seeds": 2, "held_setting": 2, "held_out": 4}
    # the curve's thresholds come from the development runs alone: a quiet held-out run planted to fire (every signal
    # ramping up after its baseline; a rule's z-score ignores a scale) moves its false alarms, never a threshold
    ramp = np.r_[np.zeros(20), np.linspace(0.0, 3.0, 80)]
    loud = [r if r.onset is not None else
            replace(r, steps=r.steps.assign(**{k: r.steps[k] + ramp * SIGNALS_BY_KEY[k].direction
                                               for k in r.steps if k != "step"})) for r in held]
    louder = study.report(dev, loud, choice)
    assert louder[2]["threshold"].tolist() == curve["threshold"].tolist()
    assert louder[0]["false_alarms"].sum() > runs["false_alarms"].sum()  # the plant fires
    assert set(curve["false_alarms_per_100_dev"]) <= set(study.FA_GRID)


def test_the_committed_manifest_lists_every_own_run_of_one_clean_commit_after_the_registration() -> None:
    table = pd.read_csv(ROOT / "docs" / "collapse_results" / "manifest.csv")
    expected = {f"{arm}/seed-{s}" for arm, (_, _, seeds) in study.NEW_ARMS.items() for s in seeds}
    assert set(table["run"]) == expected and len(table) == len(expected)
    assert commit_problems(table) == []
    registered = re.search(r"^registered (\S+)$", (ROOT / "docs" / "collapse.md").read_text(), re.M).group(1)
    assert (table["created"] > registered).all()  # ISO-8601 strings of one zone compare in time order
