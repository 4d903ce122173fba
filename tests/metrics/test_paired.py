"""The paired t-interval (the controlled experiment's report, the dashboard's Compare page): hand-worked, and against
closed forms / scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from moestab.metrics.paired import paired_interval, t_quantile


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
