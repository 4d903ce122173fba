"""Claim 6's reading: Var(log s) against the independent-token prediction Var(log w) / |y| (moestab.analysis.ratios)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from moestab.analysis.ratios import independence_ratio, log_log_slope, product_log_var


def test_hand_worked_product_and_independence_ratio():
    # |y| = 5, Var(log s) = 0.08, Var(log w) = 0.4: product 25 * 0.08 = 2.0; ratio 5 * 0.08 / 0.4 = 1.0
    # |y| = 10, Var(log s) = 0.06, Var(log w) = 0.3: product 100 * 0.06 = 6.0; ratio 10 * 0.06 / 0.3 = 2.0
    np.testing.assert_allclose(product_log_var([0.08, 0.06], [5, 10]), [2.0, 6.0], rtol=1e-14)
    np.testing.assert_allclose(independence_ratio([0.08, 0.06], [0.4, 0.3], [5, 10]), [1.0, 2.0], rtol=1e-14)
    assert math.isnan(independence_ratio(0.1, 0.0, 5))  # no token variance: nothing to compare with


def test_independence_ratio_reads_correlation_not_the_per_token_variance():
    # Second implementation: responses of |y| tokens with log w_t = a * z_seq + b * e_t (z, e standard normal):
    # Var(log w) = a^2 + b^2 and Var(log s) = a^2 + b^2 / |y|, so |y| Var(log s) / Var(log w) = (|y| a^2 + b^2) /
    # (a^2 + b^2). Independent tokens (a = 0): 1 at every |y|, whatever b. A shared part (a > 0): above 1.
    gen = np.random.default_rng(0)
    for tokens, a, b, expected in ((5, 0.0, 0.5, 1.0), (33, 0.0, 0.2, 1.0), (9, 0.1, 0.3, (9 * 0.01 + 0.09) / 0.1)):
        log_w = a * gen.standard_normal((40_000, 1)) + b * gen.standard_normal((40_000, tokens))  # [seqs, |y|]
        ratio = independence_ratio(log_w.mean(axis=1).var(), log_w.var(), tokens)
        assert ratio == pytest.approx(expected, rel=0.03)
    # Different per-token variances across lengths bend the log-log slope of Var(log s) away from -1 although
    # every length is independent: the slope misreads, the per-length ratio does not.
    lengths, token_vars = np.array([5, 9, 17, 33]), np.array([0.28, 0.31, 0.38, 0.21])
    seq_vars = token_vars / lengths  # exactly independent
    assert log_log_slope(lengths, seq_vars) < -1.05
    np.testing.assert_allclose(independence_ratio(seq_vars, token_vars, lengths), 1.0, rtol=1e-14)


def test_hand_worked_log_log_slope():
    # y = 3 x^-1.5 exactly: slope -1.5; y = x^2: 2
    assert log_log_slope([1, 4, 16], [3.0, 3 / 8, 3 / 64]) == pytest.approx(-1.5, abs=1e-12)
    assert log_log_slope([2.0, 3.0], [4.0, 9.0]) == pytest.approx(2.0, abs=1e-12)
    assert math.isnan(log_log_slope([5, 5], [1.0, 2.0]))  # one distinct length: no slope
    with pytest.raises(ValueError, match="positive"):
        log_log_slope([1, 2], [0.0, 1.0])
