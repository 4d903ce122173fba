"""k1 against k3 on sampled tokens, with standard errors over sequences (moestab.metrics.mismatch)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from moestab.metrics.mismatch import estimator_agreement, mean_and_se


def test_hand_worked_mean_and_se():
    # values 1, 2, 3, 6 (N = 4), mean 3.
    # Per token: sample variance ((-2)^2 + (-1)^2 + 0 + 3^2) / 3 = 14 / 3; SE = sqrt(14 / 3 / 4) = sqrt(7 / 6).
    mean, se = mean_and_se(np.array([1.0, 2.0, 3.0, 6.0]))
    assert mean == 3.0 and se == pytest.approx(math.sqrt(7 / 6), rel=1e-14)
    # Clusters {1, 2} and {3, 6}: S = 3, 9; n = 2, 2; S - n * mean = -3, 3; C = 2:
    # SE = sqrt(2 / 1 * (9 + 9)) / 4 = 6 / 4 = 1.5 (wider: the clusters' tokens move together).
    mean, se = mean_and_se(np.array([1.0, 2.0, 3.0, 6.0]), np.array(["a", "a", "b", "b"]))
    assert mean == 3.0 and se == pytest.approx(1.5, rel=1e-14)
    assert math.isnan(mean_and_se(np.array([1.0, 2.0]), np.array([0, 0]))[1])  # one cluster: no SE
    assert all(math.isnan(v) for v in mean_and_se(np.array([])))


def test_hand_worked_agreement():
    # d = log pi - log mu = (ln 2, -ln 2) in one sequence, 0 in another.
    # k1 terms: -ln 2, ln 2, 0 -> k1 = 0. k3 terms: (2 - 1 - ln 2), (1/2 - 1 + ln 2), 0 -> k3 = (1/2) / 3 = 1/6.
    # k1 - k3 per token = 1 - e^d: -1, 1/2, 0 -> mean -1/6 (= 0 - 1/6).
    mu = np.log(np.array([0.25, 0.5, 0.3]))
    pi = mu + np.array([math.log(2), -math.log(2), 0.0])
    check = estimator_agreement(pi, mu, sequence=np.array([7, 7, 9]))
    assert check["k1"] == pytest.approx(0.0, abs=1e-15) and check["k3"] == pytest.approx(1 / 6, rel=1e-12)
    assert check["k1_minus_k3"] == pytest.approx(-1 / 6, rel=1e-12)
    # clusters of 1 - e^d: S = -1/2 (n 2), 0 (n 1); S - n m = -1/2 + 1/3 = -1/6, 1/6; SE = sqrt(2 (2 / 36)) / 3 = 1/9
    assert check["k1_minus_k3_se"] == pytest.approx(1 / 9, rel=1e-12)
    assert check["min_k3_term"] == 0.0 and check["tokens"] == 3.0 and check["sequences"] == 2.0
    assert math.isnan(estimator_agreement(pi, mu)["sequences"])


def test_k1_and_k3_agree_on_samples_and_not_on_other_tokens():
    # Second implementation: a categorical mu over 6 outcomes and a nearby pi; tokens drawn from mu make
    # E[1 - pi/mu] = 0, so k1 - k3 sits within a few SEs of 0 and both are near the exact KL(mu || pi).
    gen = np.random.default_rng(3)
    mu = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    pi = mu * np.exp(0.3 * gen.standard_normal(6))
    pi /= pi.sum()
    exact = float(np.sum(mu * np.log(mu / pi)))
    drawn = gen.choice(6, size=200_000, p=mu)
    check = estimator_agreement(np.log(pi[drawn]), np.log(mu[drawn]))
    assert abs(check["k1_minus_k3"]) < 4 * check["k1_minus_k3_se"]
    assert check["k1"] == pytest.approx(exact, abs=4 * check["k1_se"]) and check["k3"] == pytest.approx(
        exact, abs=4 * check["k3_se"])
    # Tokens not drawn from mu (uniform, as teacher-forced text would be): k1 - k3 is far from 0 in SEs.
    forced = gen.choice(6, size=200_000)
    other = estimator_agreement(np.log(pi[forced]), np.log(mu[forced]))
    assert abs(other["k1_minus_k3"]) > 10 * other["k1_minus_k3_se"]


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="one length"):
        estimator_agreement(np.zeros(3), np.zeros(2))
    with pytest.raises(ValueError, match="sequence must be"):
        estimator_agreement(np.zeros(3), np.zeros(3), sequence=np.zeros(2))
