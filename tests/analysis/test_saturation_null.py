"""Saturation of every checkpoint pair and the proximity null of claim 11 (moestab.analysis.saturation)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from moestab.analysis.saturation import pairwise_saturation, proximity_null, rises, router_saturation
from moestab.analysis.synthetic import synthetic_routes


def test_hand_worked_pairs():
    # 2 tokens, 1 layer, top-2; three checkpoints at steps 20, 0, 10 (given out of order).
    s0 = np.array([[[0, 1]], [[2, 3]]], np.int16)
    s10 = np.array([[[0, 4]], [[2, 3]]], np.int16)  # vs s0: token 0 keeps 1 of 2, token 1 both: (1/2 + 1) / 2 = 0.75
    s20 = np.array([[[5, 4]], [[3, 2]]], np.int16)  # vs s0: 0 and 2 of 2 -> 0.5; vs s10: 1/2 and 2/2 -> 0.75
    table = pairwise_saturation([s20, s0, s10], [20, 0, 10], layers=[3])
    assert table[["step_a", "step_b", "distance"]].values.tolist() == [[0, 10, 10], [0, 20, 20], [10, 20, 10]]
    assert table.saturation.tolist() == [0.75, 0.5, 0.75]
    # top-1 (slot 0): s0/s10 agree on both tokens; s0/s20 on neither (5 vs 0, 3 vs 2); s10/s20 on neither
    assert table.saturation_top1.tolist() == [1.0, 0.0, 0.0]
    assert (table.layer == 3).all() and (table.tokens == 2).all()


def test_pairs_are_router_saturation_and_never_a_checkpoint_with_itself():
    routes = [synthetic_routes(200, 3, 2, 8, flip=f, seed=s)[1] for f, s in ((0.1, 0), (0.3, 1), (0.2, 2))]
    table = pairwise_saturation(routes, [0, 5, 9])
    assert len(table) == 3 * 3  # 3 pairs x 3 layers; no (s, s) pair
    assert (table.step_a < table.step_b).all()
    direct = router_saturation(routes[0], routes[2])  # steps 0 and 9
    np.testing.assert_array_equal(table[(table.step_a == 0) & (table.step_b == 9)].saturation, direct.saturation)
    assert table.saturation.lt(1).all()  # different route sets: the check can fail
    with pytest.raises(ValueError, match="steps must be distinct"):
        pairwise_saturation(routes, [0, 5, 5])
    with pytest.raises(ValueError, match="one step per route set"):
        pairwise_saturation(routes, [0, 5])


def pair_table(values: dict[tuple[int, int], float]) -> pd.DataFrame:
    return pd.DataFrame([{"step_a": a, "step_b": b, "saturation": v} for (a, b), v in values.items()])


def test_hand_worked_proximity_null():
    # Checkpoints 0, 10, 20, 30. Against the final (30): 0 -> 0.80, 10 -> 0.90, 20 -> 0.97.
    # Early pairs at the same distance: d = 20 is (0, 20) = 0.85, d = 10 is (0, 10) = 0.93.
    pairs = pair_table({(0, 10): 0.93, (0, 20): 0.85, (0, 30): 0.80, (10, 20): 0.95, (10, 30): 0.90,
                        (20, 30): 0.97})
    null = proximity_null(pairs)
    assert null.step.tolist() == [0, 10, 20] and null.distance.tolist() == [30, 20, 10]
    assert null.against_final.tolist() == [0.80, 0.90, 0.97]
    assert null["null"].tolist() == [0.80, 0.85, 0.93]  # step 0 is its own null: the same pair (0, 30)
    np.testing.assert_allclose(null.excess, [0.0, 0.05, 0.04], atol=1e-12)  # 0.90 - 0.85, 0.97 - 0.93
    # same distance, every pair: d = 10: (0.93 + 0.95 + 0.97) / 3 = 0.95; d = 20: (0.85 + 0.90) / 2 = 0.875
    np.testing.assert_allclose(null.same_distance_mean, [0.80, 0.875, 0.95], atol=1e-12)


def test_constant_drift_has_no_excess_and_settling_has_some():
    steps = [0, 10, 20, 30, 40]
    # Constant drift: saturation depends on the distance only, 1 - 0.01 per step apart. Rising against the final
    # checkpoint (0.6 -> 0.9) all the same: proximity alone.
    drift = pair_table({(a, b): 1 - 0.01 * (b - a) for i, a in enumerate(steps) for b in steps[i + 1:]})
    null = proximity_null(drift)
    assert null.against_final.is_monotonic_increasing and null.against_final.iloc[0] < null.against_final.iloc[-1]
    np.testing.assert_allclose(null.excess, 0.0, atol=1e-12)
    # Settling: each step moves routing half as much as the one before (steps 0-10 move 0.08, 10-20 0.04, ...);
    # saturation 1 - (movement between the two). Late pairs agree more than early pairs the same distance apart.
    moved = np.cumsum([0.0, 0.08, 0.04, 0.02, 0.01])  # [checkpoints] routing moved by each checkpoint
    settle = pair_table({(a, b): 1 - (moved[j] - moved[i]) for i, a in enumerate(steps)
                         for j, b in enumerate(steps) if j > i})
    null = proximity_null(settle).set_index("step")
    assert null.excess.loc[0] == 0.0
    assert null.excess.loc[30] == pytest.approx(0.08 - 0.01)  # (30, 40) vs (0, 10)
    assert (null.excess.loc[[10, 20, 30]] > 0).all()


def test_proximity_null_refuses_pairs_per_layer():
    pairs = pair_table({(0, 10): 0.9}).assign(layer=0)
    with pytest.raises(ValueError, match="average over layers first"):
        proximity_null(pd.concat([pairs, pairs.assign(layer=1)]))
    with pytest.raises(KeyError, match="saturation_top1"):
        proximity_null(pairs, value="saturation_top1")


def test_rises_count_transitions():
    # 0.90 -> 0.92 up, -> 0.91 down, -> 0.95 up: 2 of 3
    assert rises([0.90, 0.92, 0.91, 0.95]) == (2, 3)
    assert rises([0.9]) == (0, 0)
    # Adding the reference against itself (1.0) would add a rise that measures nothing: 3 of 4.
    assert rises([0.90, 0.92, 0.91, 0.95, 1.0]) == (3, 4)
