"""The routing-change kernels' parts against plain second implementations: the overlap histogram and token counts
(:func:`aggregate_intersections`, whose dense and sparse paths are taken by the mix of overlaps) and the check for a
decision that names an expert twice (:func:`repeated_experts`)."""

from __future__ import annotations

import numpy as np
import pytest

from moestab.metrics.routes import INVALID, aggregate_intersections, repeated_experts


def naive_aggregate(inter: np.ndarray, group: np.ndarray, n_groups: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The histogram ``[groups, layers, k + 2]`` and token counts ``[groups, 4]``, one decision at a time."""
    tokens, layers = inter.shape
    hist = np.zeros((n_groups, layers, k + 2), np.int64)
    totals = np.zeros((n_groups, 4), np.int64)
    for t in range(tokens):
        recorded = flipped = 0
        for layer in range(layers):
            value = int(inter[t, layer])
            hist[group[t], layer, k + 1 if value == INVALID else value] += 1
            recorded += value != INVALID
            flipped += value < k
        totals[group[t]] += [recorded > 0, flipped > 0, recorded, flipped]
    return hist, totals


# Shares of overlaps k, k - 1, lower and unrecorded: mostly unchanged (sparse path), mostly one swap (dense counts
# of k - 1), mostly reordered or several swaps (every decision visited), and a mix with many unrecorded.
MIXES = {"unchanged": (0.9, 0.06, 0.02, 0.02), "one swap": (0.15, 0.8, 0.03, 0.02),
         "several swaps": (0.1, 0.1, 0.75, 0.05), "unrecorded": (0.3, 0.3, 0.1, 0.3)}


@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("k", [1, 2, 8])
def test_aggregate_matches_one_decision_at_a_time(mix, k):
    rng = np.random.default_rng(k)
    tokens, layers, n_groups = 500, 3, 4
    same, swap, lower, unrecorded = MIXES[mix]
    kind = rng.choice(4, size=(tokens, layers), p=[same, swap, lower, unrecorded])
    inter = np.where(kind == 0, k, np.where(kind == 1, max(k - 1, 0), rng.integers(0, max(k - 1, 1), (tokens, layers))))
    inter = np.where(kind == 3, INVALID, inter).astype(np.uint8)
    for group in (np.sort(rng.integers(0, n_groups, tokens)), rng.integers(0, n_groups, tokens),
                  np.zeros(tokens, np.intp)):
        groups = int(group.max()) + 1
        hist, totals = aggregate_intersections(inter, group, groups, k)
        expected_hist, expected_totals = naive_aggregate(inter, group, groups, k)
        np.testing.assert_array_equal(hist, expected_hist)
        np.testing.assert_array_equal(totals, expected_totals)


def naive_repeated(routes: np.ndarray) -> np.ndarray:
    return np.array([[len(set(d[d >= 0].tolist())) < int((d >= 0).sum()) for d in token] for token in routes])


@pytest.mark.parametrize("experts", [8, 128, 300])  # uint8 compares below 255 experts, int16 above
def test_repeated_experts_matches_sets(experts):
    rng = np.random.default_rng(experts)
    routes = np.argsort(rng.random((400, 3, experts)), axis=2)[:, :, :4].astype(np.int16)  # distinct
    twice = rng.random((400, 3)) < 0.1
    routes[twice, 3] = routes[twice, 1]  # an expert named twice
    routes[rng.random((400, 3)) < 0.1] = -1  # not recorded: no repeat
    half = rng.random((400, 3)) < 0.1
    routes[half, :2] = -1  # two slots not recorded: still no repeat among them
    for block in (1, 33, 100_000):
        np.testing.assert_array_equal(repeated_experts(routes, block=block), naive_repeated(routes))
    assert naive_repeated(routes).any() and not naive_repeated(routes).all()
