from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from moestab.analysis import volatility as V
from moestab.analysis.synthetic import synthetic_routes
from tests.support.naive import decision_overlaps, volatility_metrics

METRICS = ["changed", "router_flip", "jaccard_distance", "token_flip", "routers_flipped_per_token"]


def routes(*rows: list[list[int]]) -> np.ndarray:
    """Tokens given as lists of per-layer expert lists -> int16 [tokens, layers, top_k]."""
    return np.array(rows, dtype=np.int16)


def test_identical_routes_are_zero():
    a = routes([[0, 1, 2, 3], [4, 5, 6, 7]], [[1, 2, 3, 4], [0, 2, 4, 6]])
    got = V.route_volatility(a, a.copy())
    assert all(got[m] == 0 for m in METRICS)
    assert got["routers"] == 4 and got["tokens"] == 2


def test_disjoint_routes_are_one():
    a = routes([[0, 1], [2, 3]], [[4, 5], [6, 7]])
    b = routes([[2, 3], [0, 1]], [[6, 7], [4, 5]])
    got = V.route_volatility(a, b)
    assert got["changed"] == 1 and got["router_flip"] == 1 and got["jaccard_distance"] == 1
    assert got["token_flip"] == 1
    assert got["routers_flipped_per_token"] == 2  # both layers of each token


@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
def test_one_flipped_slot_is_one_over_k(k):
    a = np.arange(k, dtype=np.int16)[None, None, :]  # one token, one layer: experts 0..k-1
    b = a.copy()
    b[0, 0, k - 1] = 100  # one slot replaced by an expert outside the set
    got = V.route_volatility(a, b)
    assert got["changed"] == pytest.approx(1 / k)
    assert got["router_flip"] == 1 and got["token_flip"] == 1
    # Jaccard: |∩| = k-1, |∪| = k+1.
    assert got["jaccard_distance"] == pytest.approx(1 - (k - 1) / (k + 1))


def test_permuted_slots_are_not_a_change():
    a = routes([[3, 1, 7, 5]], [[0, 2, 4, 6]])
    b = routes([[5, 7, 1, 3]], [[6, 0, 4, 2]])
    got = V.route_volatility(a, b)
    assert all(got[m] == 0 for m in METRICS)


def test_hand_worked_mixture():
    # 2 tokens x 2 layers, top-2.
    # token 0: layer 0 {0,1} vs {1,0} -> overlap 2; layer 1 {2,3} vs {2,4} -> overlap 1 (flip)
    # token 1: layer 0 {0,1} vs {5,6} -> overlap 0 (flip); layer 1 has a -1 -> unrecorded
    a = routes([[0, 1], [2, 3]], [[0, 1], [2, -1]])
    b = routes([[1, 0], [2, 4]], [[5, 6], [2, 3]])
    got = V.route_volatility(a, b)
    # changed = 1 - (2 + 1 + 0) / (2 * 3) = 0.5; router_flip = 2/3
    assert got["changed"] == pytest.approx(0.5)
    assert got["router_flip"] == pytest.approx(2 / 3)
    # jaccard similarities 1, 1/3, 0 -> distance 1 - (4/3)/3 = 5/9
    assert got["jaccard_distance"] == pytest.approx(5 / 9)
    assert got["token_flip"] == 1.0  # both tokens have a flip
    assert got["routers_flipped_per_token"] == pytest.approx(1.0)  # (1 + 1) / 2
    assert got["routers"] == 3 and got["unrecorded"] == 1
    by_layer = V.volatility_by_layer(a, b, layers=[5, 9])
    assert list(by_layer["layer"]) == [5, 9]
    # layer 0: overlaps 2 and 0 -> 1 - 2/4 = 0.5; layer 1: overlap 1 (token 1 unrecorded) -> 1 - 1/2
    assert by_layer["changed"].tolist() == pytest.approx([0.5, 0.5])
    assert by_layer["routers"].tolist() == [2, 1]


def test_nothing_recorded_gives_nan():
    a = np.full((2, 1, 2), -1, np.int16)
    got = V.route_volatility(a, a)
    assert math.isnan(got["changed"]) and math.isnan(got["token_flip"])
    assert got["unrecorded"] == 2 and got["tokens"] == 0


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 12])
def test_intersection_sizes_match_python_sets(k):
    rng = np.random.default_rng(k)
    experts = 24
    a = np.argsort(rng.random((60, 4, experts)), axis=2)[:, :, :k].astype(np.int16)
    b = a.copy()
    u = rng.random((60, 4))
    b[u < 0.3] = np.argsort(rng.random(((u < 0.3).sum(), experts)), axis=1)[:, :k]
    reorder = (u >= 0.3) & (u < 0.5)
    b[reorder] = b[reorder][:, ::-1]
    for t, layer in zip(*np.nonzero((u >= 0.5) & (u < 0.6)), strict=True):  # one slot, any position
        outside = [e for e in range(experts) if e not in set(b[t, layer].tolist())]
        b[t, layer, rng.integers(k)] = rng.choice(outside)
    for t, layer in zip(*np.nonzero((u >= 0.6) & (u < 0.7)), strict=True):  # two slots trade places
        i, j = rng.choice(k, 2, replace=False) if k > 1 else (0, 0)
        b[t, layer, [i, j]] = b[t, layer, [j, i]]
    a[rng.random((60, 4)) < 0.05, 0] = -1
    b[rng.random((60, 4)) < 0.05, -1] = -1
    expected = np.array([[V.INVALID if v is None else v for v in row] for row in decision_overlaps(a, b)])
    for block, threads in [(1, 1), (7, 2), (1000, 1), (64, 3)]:
        got = V.intersection_sizes(a, b, block=block, threads=threads)
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("flip", [0.05, 0.9])  # few changes (sparse path) / most changed (dense path)
def test_counts_by_keys_match_python_sets(flip):
    rng = np.random.default_rng(3)
    a, b = synthetic_routes(200, 5, 4, 16, flip=flip, reorder=0.2, seed=4)
    a = a.copy()
    a[rng.random((200, 5)) < 0.1, 1] = -1
    step = rng.integers(1, 4, 200)
    minibatch = rng.integers(0, 2, 200)
    counts = V.volatility_counts(a, b, {"step": step, "minibatch": minibatch}, layers=[1, 3, 5, 7, 9])
    for by in (["step"], ["minibatch"], ["step", "minibatch"]):
        table = V.volatility_table(counts, by=by)
        for _, row in table.iterrows():
            select = np.ones(200, bool)
            for key in by:
                select &= {"step": step, "minibatch": minibatch}[key] == row[key]
            expected = volatility_metrics(a, b, list(np.flatnonzero(select)))
            for metric in METRICS:
                assert row[metric] == pytest.approx(expected[metric], rel=1e-12), (by, metric)
            assert row["routers"] == expected["routers"] and row["tokens"] == expected["tokens"]
    by_layer = V.volatility_table(counts, by=["layer"])
    assert list(by_layer["layer"]) == [1, 3, 5, 7, 9]
    for i, row in by_layer.iterrows():
        expected = volatility_metrics(a[:, i : i + 1], b[:, i : i + 1])
        assert row["changed"] == pytest.approx(expected["changed"])
        assert "token_flip" not in row  # token-level metrics are not per layer


@pytest.mark.parametrize("flip", [0.05, 0.9])
def test_whole_table_without_keys_matches_python_sets(flip):
    a, b = synthetic_routes(150, 3, 2, 8, flip=flip, reorder=0.3, seed=7)
    b = b.copy()
    b[:5, 2] = -1
    got = V.route_volatility(a, b)
    expected = volatility_metrics(a, b)
    for metric in METRICS:
        assert got[metric] == pytest.approx(expected[metric], rel=1e-12)
    assert got["unrecorded"] == 5


def test_accumulator_over_batches_equals_whole():
    a, b = synthetic_routes(400, 3, 4, 16, flip=0.3, seed=9)
    steps = np.repeat([3, 1, 2, 5], 100)
    whole = V.counts_from_intersections(V.intersection_sizes(a, b), 4, {"step": steps}, layers=[2, 4, 6])
    acc = V.VolatilityAccumulator(4, ["step"], layers=[2, 4, 6])
    for start in range(0, 400, 90):  # batches see different, overlapping sets of steps
        acc.add(V.intersection_sizes(a[start : start + 90], b[start : start + 90]), {"step": steps[start : start + 90]})
    got = acc.result()
    pd.testing.assert_frame_equal(got.decisions, whole.decisions)
    pd.testing.assert_frame_equal(got.tokens, whole.tokens)
    assert got.tokens["step"].tolist() == [1, 2, 3, 5]
    with pytest.raises(ValueError, match="keys"):
        acc.add(V.intersection_sizes(a, b), {"minibatch": steps})
    with pytest.raises(ValueError, match="exceed top_k"):
        acc.add(np.full((1, 3), 7, np.uint8), {"step": np.ones(1)})


def test_merge_counts_equals_whole():
    a, b = synthetic_routes(300, 3, 2, 8, flip=0.3, seed=1)
    keys = {"step": np.repeat([1, 2, 3], 100)}
    whole = V.volatility_counts(a, b, keys)
    parts = [
        V.volatility_counts(a[s : s + 70], b[s : s + 70], {"step": keys["step"][s : s + 70]}) for s in range(0, 300, 70)
    ]
    merged = V.merge_counts(parts)
    for by in ([], ["step"], ["layer"], ["step", "layer"]):
        pd.testing.assert_frame_equal(V.volatility_table(merged, by), V.volatility_table(whole, by), check_dtype=False)


def test_synthetic_routes_have_the_requested_change():
    a, b = synthetic_routes(2000, 4, 8, 128, flip=0.1, reorder=0.05, seed=0)
    got = V.route_volatility(a, b)
    # Each flip changes 1 of 8 slots: changed ~ 0.1 / 8, router_flip ~ 0.1.
    assert got["router_flip"] == pytest.approx(0.1, abs=0.01)
    assert got["changed"] == pytest.approx(0.1 / 8, abs=0.0015)
    assert all(len(set(row)) == 8 for row in a.reshape(-1, 8)[:500].tolist())


def test_bad_input_is_rejected():
    a = np.zeros((2, 3, 2), np.int16)
    with pytest.raises(ValueError, match=r"\[tokens, layers, top_k\]"):
        V.intersection_sizes(a[0], a[0])
    with pytest.raises(ValueError, match="differ in shape"):
        V.intersection_sizes(a, a[:1])
    with pytest.raises(TypeError, match="integer"):
        V.intersection_sizes(a.astype(float), a)
    with pytest.raises(ValueError, match=r"-1\.\.32767"):
        V.intersection_sizes(np.full((1, 1, 2), 40000), np.zeros((1, 1, 2), int))
    counts = V.volatility_counts(a, a, {"step": np.ones(2)})
    with pytest.raises(ValueError, match="valid"):
        V.volatility_table(counts, by=["minibatch"])
    with pytest.raises(ValueError, match="unknown route pair"):
        V.run_volatility("/nonexistent", pair="old_old")


def test_int64_input_is_accepted():
    a = np.array([[[0, 1]]], dtype=np.int64)
    b = np.array([[[1, 2]]], dtype=np.int64)
    assert V.route_volatility(a, b)["changed"] == pytest.approx(0.5)


def _stored(routes: np.ndarray) -> np.ndarray:
    """int16 routes as a uint8 route column stores them (-1 -> 255, "not recorded")."""
    return routes.astype(np.uint8)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 12])
def test_stored_uint8_ids_give_the_overlaps_of_python_sets(k):
    """The run folder's uint8 ids are compared as they are stored: the same overlaps as int16 and as Python sets,
    with whole decisions and single slots not recorded."""
    rng = np.random.default_rng(10 + k)
    a, b = synthetic_routes(300, 4, k, 24, flip=0.5, reorder=0.3, seed=k)
    a, b = a.copy(), b.copy()
    a[rng.random((300, 4)) < 0.05] = -1  # whole decisions
    b[rng.random((300, 4)) < 0.05, rng.integers(k)] = -1  # one slot
    expected = np.array([[V.INVALID if v is None else v for v in row] for row in decision_overlaps(a, b)])
    keys = {"step": rng.integers(0, 3, 300)}
    whole = V.VolatilityAccumulator(k, ["step"])
    whole.add_routes(a, b, keys)
    for block in (1, 7, 4096):
        got = np.empty(300 * 4, np.uint8)
        V.intersect_into(_stored(a), _stored(b), got, block)
        np.testing.assert_array_equal(got.reshape(300, 4), expected)
    for threads in (1, 2):
        stored = V.VolatilityAccumulator(k, ["step"])
        stored.add_routes(_stored(a), _stored(b), keys, threads=threads, stored=True)
        pd.testing.assert_frame_equal(stored.result().decisions, whole.result().decisions)
        pd.testing.assert_frame_equal(stored.result().tokens, whole.result().tokens)


def test_stored_routes_must_be_uint8_or_int16_of_one_shape():
    a = np.zeros((2, 3, 2), np.uint8)
    acc = V.VolatilityAccumulator(2)
    with pytest.raises(TypeError, match="uint8 or int16"):
        acc.add_routes(a.astype(np.int32), a.astype(np.int32), stored=True)
    with pytest.raises(ValueError, match="differ"):
        acc.add_routes(a, a.astype(np.int16), stored=True)
    with pytest.raises(ValueError, match=r"\[tokens, layers, top_k\]"):
        acc.add_routes(a[0], a[0], stored=True)


def test_a_decision_naming_an_expert_twice_is_refused_and_nothing_of_its_batch_added():
    """[1, 1, 2] against [2, 1, 1]: slot pairs match 5 times where top-3 allows 3 (a set overlap is not defined)."""
    a, b = routes([[1, 1, 2]]), routes([[2, 1, 1]])
    with pytest.raises(V.RepeatedExpertError, match="names an expert twice"):
        V.intersection_sizes(a, b)
    good_a, good_b = routes([[1, 2, 3]], [[4, 5, 6]]), routes([[1, 2, 7]], [[4, 5, 6]])
    acc = V.VolatilityAccumulator(3, ["step"])
    acc.add_routes(good_a, good_b, {"step": np.array([1, 1])})
    before = acc.result()
    for stored in (False, True):
        batch_a, batch_b = np.concatenate([good_a, a]), np.concatenate([good_b, b])
        if stored:
            batch_a, batch_b = batch_a.astype(np.uint8), batch_b.astype(np.uint8)
        with pytest.raises(V.RepeatedExpertError):
            acc.add_routes(batch_a, batch_b, {"step": np.array([1, 1, 2])}, stored=stored)
        pd.testing.assert_frame_equal(acc.result().decisions, before.decisions)  # no group 2, no counts added
        pd.testing.assert_frame_equal(acc.result().tokens, before.tokens)
