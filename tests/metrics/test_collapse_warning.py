"""The collapse warning's rule (moestab.metrics.collapse_warning) against a second implementation in pandas, and its
firing, refractory period, missing steps and replay."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from moestab.metrics.collapse_warning import MAD_TO_SD, SIGNALS, CollapseWatch, WarningRule, warnings_over

VOL, REWARD = SIGNALS["vol"].key, SIGNALS["reward"].key


def _series(seed: int, steps: int = 60) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    vol = 0.04 + 0.004 * rng.standard_normal(steps)
    vol[40:] += np.linspace(0, 0.05, steps - 40)  # drifts up from step 41
    reward = 0.5 + 0.03 * rng.standard_normal(steps)
    return pd.DataFrame({"step": np.arange(1, steps + 1), VOL: vol, REWARD: reward})


def _reference_scores(frame: pd.DataFrame, rule: WarningRule) -> pd.Series:
    """The score by pandas: EWM (no adjustment) of each signal, z against the first B values' median and MAD."""
    total = pd.Series(rule.intercept, index=frame.index, dtype=float)
    for name, weight in zip(rule.signals, rule.weights, strict=True):
        s = SIGNALS[name]
        values = frame[s.key]
        early = values.iloc[: rule.baseline_steps]
        median = early.median()
        scale = max(MAD_TO_SD * (early - median).abs().median(), rule.relative_floor * abs(median), 1e-12)
        mean = values.ewm(alpha=rule.smoothing, adjust=False).mean()
        z = (s.direction * (mean - median) / scale).clip(-rule.z_clip, rule.z_clip)
        total += weight * z
    total.iloc[: rule.baseline_steps - 1] = math.nan
    return total


@pytest.mark.parametrize("seed", range(3))
def test_the_score_equals_a_pandas_computation(seed: int) -> None:
    frame = _series(seed)
    rule = WarningRule(signals=("vol", "reward"), weights=(0.7, -0.4), intercept=-1.5, threshold=1e9)
    watch = CollapseWatch(rule)
    got = []
    for row in frame.to_dict("records"):
        watch.update(int(row["step"]), row)
        got.append(math.nan if watch.score is None else watch.score)
    np.testing.assert_allclose(got, _reference_scores(frame, rule), rtol=1e-12, atol=1e-12)


def test_a_rising_signal_fires_once_per_refractory_period_and_names_itself() -> None:
    frame = _series(0)
    rule = WarningRule(signals=("vol",), weights=(1.0,), threshold=3.0, refractory=10)
    scores = _reference_scores(frame, rule)
    fired = [w.step for w in warnings_over(rule, ((int(r["step"]), r) for r in frame.to_dict("records")))]
    above = frame.step[scores > 3.0].tolist()
    assert fired and fired[0] == above[0] > 40  # the first step over the threshold, after the drift starts
    expected, last = [], None
    for step in above:  # the refractory period, by hand
        if last is None or step - last >= 10:
            expected.append(step)
            last = step
    assert fired == expected
    warning = warnings_over(rule, ((int(r["step"]), r) for r in frame.to_dict("records")))[0]
    assert warning.signal == "vol" and "step" in warning.message(rule) and VOL in warning.message(rule)


def test_a_falling_signal_warns_only_in_its_direction() -> None:
    steps = np.arange(1, 41)
    reward = np.where(steps > 20, 0.2, 0.5) + 0.01 * np.sin(steps)
    rows = [(int(s), {REWARD: float(r)}) for s, r in zip(steps, reward, strict=True)]
    falls = WarningRule(signals=("reward",), weights=(1.0,), threshold=3.0)
    assert warnings_over(falls, rows) and warnings_over(falls, rows)[0].step > 20
    rising = [(s, {REWARD: 1.0 - m[REWARD]}) for s, m in rows]  # the same jump upwards: no warning
    assert warnings_over(falls, rising) == []


def test_missing_steps_leave_the_state_and_the_baseline_waits_for_values() -> None:
    rule = WarningRule(signals=("vol",), weights=(1.0,), threshold=2.0, baseline_steps=4)
    watch = CollapseWatch(rule)
    for step, value in enumerate([0.1, None, 0.1, float("nan"), 0.11], start=1):
        watch.update(step, {} if value is None else {VOL: value})
        assert watch.score is None  # four finite values are needed first
    watch.update(6, {VOL: 0.1})
    assert watch.score is not None
    before = watch.score
    watch.update(7, {})  # an unmeasured step: the score stays
    assert watch.score == before


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"signals": ("nope",), "weights": (1.0,)}, "unknown signal"),
    ({"signals": ("vol", "reward"), "weights": (1.0,)}, "one weight per signal"),
    ({"signals": ("vol",), "weights": (1.0,), "baseline_steps": 1}, "baseline_steps"),
])
def test_a_bad_rule_is_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WarningRule(threshold=1.0, **kwargs)


def test_a_per_layer_signal_is_read_as_its_mean_over_layers() -> None:
    rule = WarningRule(signals=("load_entropy",), weights=(1.0,), threshold=1e9, baseline_steps=2)
    watch = CollapseWatch(rule)
    key = SIGNALS["load_entropy"].key
    for step, layers in enumerate([[2.0, 4.0], [3.0, None, 3.0], [1.0, 1.0]], start=1):
        watch.update(step, {key: layers})
    # baseline: means 3.0 and 3.0 (median 3, scale 0.1 * 3); smoothed mean 0.3 * 1 + 0.7 * 3 = 2.4; falls: +2.0
    assert watch.score == pytest.approx((3.0 - 2.4) / 0.3)


@pytest.mark.parametrize("bad", [[[1.0, 2.0]], 10**400, "0.5", True, None, float("inf")])
def test_a_value_that_is_not_a_finite_number_leaves_the_signal_as_it_was(bad: object) -> None:
    rule = WarningRule(signals=("load_entropy",), weights=(1.0,), threshold=1e9, baseline_steps=2)
    watch = CollapseWatch(rule)
    key = SIGNALS["load_entropy"].key
    watch.update(1, {key: 1.0})
    watch.update(2, {key: bad})  # untrusted input: skipped, never raised
    assert watch.score is None and not watch.has_baseline("load_entropy")
