"""Routing's share of the ratio (moestab.metrics.routing_share): tiny cases worked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from moestab.metrics import keys
from moestab.metrics.routing_share import (
    ROUTING_SHARE_STATS,
    routing_share,
    routing_share_by_minibatch,
    variance_share,
)

FREE = np.array([0.1, -0.1, 0.3, -0.3])  # mean 0; Var = (0.01 + 0.01 + 0.09 + 0.09) / 4 = 0.05
REPLAYED = np.array([0.1, -0.1, 0.1, -0.1])  # mean 0; Var = 4 * 0.01 / 4 = 0.01
CLIPPED_FREE = np.array([False, False, True, True])  # the two tokens at |log w| = 0.3
CLIPPED_REPLAYED = np.zeros(4, bool)


def test_a_hand_worked_step():
    out = routing_share(FREE, REPLAYED, CLIPPED_FREE, CLIPPED_REPLAYED)
    assert list(out) == list(ROUTING_SHARE_STATS)
    assert out["log_var_free"] == pytest.approx(0.05, rel=1e-12)
    assert out["log_var_replayed"] == pytest.approx(0.01, rel=1e-12)
    assert out["var_share"] == pytest.approx(0.8, rel=1e-12)  # 1 - 0.01 / 0.05: replay removes four fifths
    assert out["clip_frac_free"] == 0.5  # 2 of 4 tokens
    assert out["clip_frac_replayed"] == 0.0
    assert out["abs_log_w_free"] == pytest.approx(0.2, rel=1e-12)  # (0.1 + 0.1 + 0.3 + 0.3) / 4
    assert out["abs_log_w_replayed"] == pytest.approx(0.1, rel=1e-12)  # 4 * 0.1 / 4


def test_the_share_is_zero_when_routing_changed_nothing():
    out = routing_share(FREE, FREE.copy(), CLIPPED_FREE, CLIPPED_FREE.copy())  # replay gave the free numbers
    assert out["var_share"] == 0.0  # 1 - 0.05 / 0.05, exactly
    assert out["log_var_free"] == out["log_var_replayed"] > 0
    zeros = np.zeros(3)  # e.g. one minibatch: the update's weights are pi_old's, log w = 0 either way
    assert routing_share(zeros, zeros, np.zeros(3, bool), np.zeros(3, bool))["var_share"] == 0.0


def test_variance_share_edges():
    assert variance_share(0.01, 0.05) == pytest.approx(-4.0, rel=1e-12)  # 1 - 0.05 / 0.01: replay raised it
    assert variance_share(0.0, 0.0) == 0.0  # nothing to explain
    assert math.isnan(variance_share(0.0, 0.01))  # nothing to take a share of
    assert math.isnan(variance_share(float("nan"), 0.01))


def test_no_token_gives_nan_and_bad_shapes_are_refused():
    empty = np.zeros(0)
    out = routing_share(empty, empty, empty.astype(bool), empty.astype(bool))
    assert all(math.isnan(v) for v in out.values())
    with pytest.raises(ValueError, match=r"\[tokens\] of one length"):
        routing_share(FREE, REPLAYED[:3], CLIPPED_FREE, CLIPPED_REPLAYED)


def test_per_minibatch():
    minibatch = np.array([0, 0, 1, 1])
    out = routing_share_by_minibatch(FREE, REPLAYED, CLIPPED_FREE, CLIPPED_REPLAYED, minibatch, 3)
    # minibatch 0: free = replayed = [0.1, -0.1], Var 0.01 each -> share 0
    # minibatch 1: free [0.3, -0.3] Var 0.09, replayed [0.1, -0.1] Var 0.01 -> share 1 - 1/9 = 8/9
    # minibatch 2: no token -> NaN
    assert out["var_share"][:2] == pytest.approx([0.0, 8 / 9], rel=1e-12)
    assert out["log_var_free"][:2] == pytest.approx([0.01, 0.09], rel=1e-12)
    assert out["clip_frac_free"][:2] == [0.0, 1.0]
    assert all(math.isnan(values[2]) for values in out.values())


def test_every_statistic_has_a_step_key_and_a_per_minibatch_key():
    assert list(keys.ROUTING_SHARE_KEYS) == list(ROUTING_SHARE_STATS)
    for stat, key in keys.ROUTING_SHARE_KEYS.items():
        assert keys.KEYS[key].when == (keys.ROUTING_SHARE,)
        assert keys.ROUTING_SHARE_BY_MINIBATCH.format(stat=stat) in keys.KEYS
    # only steps measured with --routing-share write them
    assert not any(k.startswith("routing_share/") for k in keys.written_keys(keys.MOESTAB_TRAIN))
