"""The paired t-interval (the controlled experiment's report, the dashboard's Compare page): hand-worked, and against
closed forms / scipy; its power and minimum detectable difference against a simulation of the test."""

from __future__ import annotations

import math

import numpy as np
import pytest

from moestab.metrics.paired import min_detectable_difference, paired_interval, paired_power, t_quantile


def _closed_form_quantile(p: float, df: int) -> float:
    """Student's t quantile in closed form (df 1, 2, 4): an implementation independent of the integral."""
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    a = 4 * p * (1 - p)  # df 4
    return 2 * math.sqrt(math.cos(math.acos(math.sqrt(a)) / 3) / math.sqrt(a) - 1)


@pytest.mark.parametrize("df", [1, 2, 4])
@pytest.mark.parametrize("p", [0.975, 0.9, 0.6])
def test_t_quantile_matches_closed_forms(p, df):
    assert t_quantile(p, df) == pytest.approx(_closed_form_quantile(p, df), rel=1e-8)


def test_t_quantile_matches_scipy_where_installed():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 3, 4, 9, 29):
        assert t_quantile(0.975, df) == pytest.approx(stats.t.ppf(0.975, df), rel=1e-8)


def test_paired_interval_hand_worked():
    # a - b = [1, 2, 3, 4, 5] - [0, 0, 0, 0, 0]: mean 3; squared deviations 4+1+0+1+4 = 10, sd = sqrt(10/4) = 1.5811;
    # t(0.975, 4) = 2.7764451; half-width 2.7764451 * 1.5811388 / sqrt(5) = 1.9632; CI [1.0368, 4.9632].
    ci = paired_interval([1, 2, 3, 4, 5], [0, 0, 0, 0, 0])
    assert (ci.n, ci.mean) == (5, 3.0)
    assert ci.sd == pytest.approx(math.sqrt(2.5), rel=1e-12)
    assert (ci.low, ci.high) == pytest.approx((3 - 1.963243, 3 + 1.963243), abs=1e-6)


def test_paired_interval_against_numpy_and_pairing():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=5), rng.normal(size=5)
    d = a - b
    half = _closed_form_quantile(0.975, 4) * d.std(ddof=1) / math.sqrt(5)
    ci = paired_interval(a.tolist(), b.tolist())
    assert (ci.mean, ci.low, ci.high) == pytest.approx((d.mean(), d.mean() - half, d.mean() + half), rel=1e-8)
    # Pairing matters: the unpaired order gives another interval (a test that could fail on a pairing bug).
    assert paired_interval(a.tolist(), b[::-1].tolist()).sd != pytest.approx(ci.sd)


def test_one_pair_has_no_interval():
    ci = paired_interval([0.5], [0.25])
    assert ci.mean == 0.25 and math.isnan(ci.low) and math.isnan(ci.high)
    with pytest.raises(ValueError, match="differ in length"):
        paired_interval([1, 2], [1])


def _simulated_power(difference: float, sd: float, n: int, reps: int, seed: int) -> tuple[float, float]:
    """The two-sided 5% paired t-test run on ``reps`` simulated samples of ``n`` normal differences (critical value
    from the closed form): its rejection rate and that rate's standard error."""
    d = np.random.default_rng(seed).normal(difference, sd, size=(reps, n))  # [reps, n]
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(n))  # [reps]
    rate = float((np.abs(t) > _closed_form_quantile(0.975, n - 1)).mean())
    return rate, math.sqrt(rate * (1 - rate) / reps)


@pytest.mark.parametrize("n", [2, 5, 30])
def test_power_at_no_difference_is_the_level(n):
    # With no true difference the test rejects with probability alpha: the integral over S against the t quantile.
    assert paired_power(0.0, 1.0, n) == pytest.approx(0.05, abs=1e-8)
    assert paired_power(0.0, 3.0, n, alpha=0.2) == pytest.approx(0.2, abs=1e-8)


@pytest.mark.parametrize(("difference", "sd", "n"), [(0.03, 0.045, 5), (1.0, 1.0, 3), (0.5, 2.0, 5)])
def test_power_matches_a_simulation_of_the_test(difference, sd, n):
    simulated, se = _simulated_power(difference, sd, n, reps=400_000, seed=1)
    assert paired_power(difference, sd, n) == pytest.approx(simulated, abs=5 * se)


def test_min_detectable_difference_is_detected_with_the_power_asked():
    # n = 5, sd 0.045 (the controlled experiment's R2 arm, in accuracy): the simulated test detects the MDE 80% of
    # the time. The usual approximation (t_0.975 + t_0.8) * sd / sqrt(n) = (2.7764 + 0.9410) * 0.045 / 2.2361 = 0.0748
    # ignores the noncentral t's skew and falls a little short of it.
    mde = min_detectable_difference(0.045, 5)
    simulated, se = _simulated_power(mde, 0.045, 5, reps=400_000, seed=2)
    assert simulated == pytest.approx(0.8, abs=5 * se)
    assert 0.0748 < mde < 0.08
    assert min_detectable_difference(0.09, 5) == pytest.approx(2 * mde, rel=1e-9)  # in the sd's units
    assert min_detectable_difference(0.045, 20) < mde / 2  # more pairs, smaller effects detected


def test_power_refuses_designs_it_cannot_compute():
    with pytest.raises(ValueError, match="n must be >= 2 pairs, got 1"):
        paired_power(0.1, 1.0, 1)
    with pytest.raises(ValueError, match="sd must be > 0, got 0"):
        min_detectable_difference(0.0, 5)
    with pytest.raises(ValueError, match=r"power must be in \(alpha, 1\)"):
        min_detectable_difference(1.0, 5, power=0.01)
