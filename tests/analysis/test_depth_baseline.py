"""The independent-layer baseline of token flip, 1 - (1 - p)^L (moestab.analysis.depth)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from moestab.analysis.depth import depth_baseline, independent_token_flip
from moestab.analysis.synthetic import synthetic_routes
from moestab.metrics.routes import intersection_sizes, route_change


def test_hand_worked_independent_token_flip():
    # p = 0.5, L = 2: 1 - 0.5^2 = 0.75; p = 0.1, L = 3: 1 - 0.9^3 = 1 - 0.729 = 0.271; L = 1 is p itself; L = 0: 0
    got = independent_token_flip(np.array([0.5, 0.1, 0.2, 0.3]), np.array([2, 3, 1, 0]))
    np.testing.assert_allclose(got, [0.75, 0.271, 0.2, 0.0], rtol=1e-14, atol=0)
    # R3's 10% of routers reach 94% of tokens at about 27 independent layers: 1 - 0.9^27 = 0.9418...
    assert independent_token_flip(0.1, 27) == pytest.approx(0.94185, abs=1e-5)
    assert independent_token_flip(0.0, 16) == 0.0 and independent_token_flip(1.0, 4) == 1.0
    assert independent_token_flip(1.0, 0) == 0.0  # no layer, no flip (1 - 0^0)
    assert np.isnan(independent_token_flip(np.nan, 4))


def test_bad_rates_and_depths_are_refused():
    with pytest.raises(ValueError, match=r"router_flip must lie in \[0, 1\]"):
        independent_token_flip(1.5, 2)
    with pytest.raises(ValueError, match="layers must be >= 0"):
        independent_token_flip(0.1, -1)


def test_independent_flips_measure_the_baseline_and_cascades_exceed_it():
    # Second implementation: synthetic routes whose decisions flip independently with p = 0.05, measured with the
    # trainer's own route_change. 20,000 tokens x 8 layers: the token flip's sd is sqrt(q (1 - q) / 20,000) ~ 0.003.
    a, b = synthetic_routes(20_000, 8, 2, 8, flip=0.05, seed=1)
    rates = route_change(intersection_sizes(a, b), 2)
    p, measured = float(rates["router_flip"][0]), float(rates["token_flip"][0])
    assert 0.04 < p < 0.06
    assert measured == pytest.approx(float(independent_token_flip(p, 8)), abs=0.012)  # 4 sd
    # A cascade: a flip in layer 0 also flips every later layer. The same flips fall on the same tokens: the router
    # flip rate rises (~0.05 + 0.95 * 0.05 * 7/8 ~ 0.09), the token flip does not (~0.34), so the token flip falls
    # far below the baseline at the new rate (1 - 0.91^8 ~ 0.53).
    cascade = b.copy()
    first = (a[:, 0] != b[:, 0]).any(axis=1)  # [tokens] flipped in layer 0
    later = a[first, 1:]  # [flipped tokens, 7, 2] the unchanged routes of layers 1..7
    outside = np.zeros(later.shape[:2], np.int16)  # [flipped tokens, 7] expert 0, 1 or 2: one is not in the set
    for candidate in (1, 2):
        taken = (later == outside[..., None]).any(axis=2)
        outside[taken] = candidate
    cascade[first, 1:, -1] = outside
    rates = route_change(intersection_sizes(a, cascade), 2)
    p_c = float(rates["router_flip"][0])
    assert p_c > p + 0.02
    assert float(rates["token_flip"][0]) < float(independent_token_flip(p_c, 8)) - 0.05


def test_depth_baseline_adds_prediction_and_excess_per_pair():
    table = pd.DataFrame({"depth": [2, 4], "old_new_router_flip": [0.5, 0.0], "old_new_token_flip": [0.6, 0.0]})
    out = depth_baseline(table)
    # depth 2: 1 - 0.5^2 = 0.75, excess 0.6 / 0.75 = 0.8; depth 4 at p = 0: baseline 0, excess NaN (nothing to compare)
    assert out.old_new_token_flip_independent.tolist() == [0.75, 0.0]
    assert out.old_new_token_flip_excess.iloc[0] == pytest.approx(0.8)
    assert np.isnan(out.old_new_token_flip_excess.iloc[1])
    assert list(table.columns) == ["depth", "old_new_router_flip", "old_new_token_flip"]  # input left as it was
    with pytest.raises(KeyError, match="rollout_old_router_flip"):
        depth_baseline(table, ("rollout_old",))
