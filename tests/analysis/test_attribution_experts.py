from __future__ import annotations

import math

import numpy as np
import pytest

from moestab.analysis import attribution as A
from moestab.analysis import experts as X
from moestab.analysis.synthetic import synthetic_routes
from moestab.run_folder import schema
from tests.support.naive import decision_overlaps


def test_flip_groups_and_explained_hand_worked():
    log_w = np.array([0.0, 0.1, -0.8, 0.9, 0.05, -0.2])
    clipped = np.array([False, False, True, True, False, True])
    flipped = np.array([False, False, True, True, True, False])
    groups = A.flip_groups(log_w, clipped, flipped).set_index("flipped")
    # not flipped: |log w| = 0, 0.1, 0.2 -> mean 0.1; flipped: 0.8, 0.9, 0.05 -> mean 0.5833
    assert groups.loc[False, "mean_abs_log_w"] == pytest.approx(0.1)
    assert groups.loc[True, "mean_abs_log_w"] == pytest.approx(1.75 / 3)
    assert groups.loc[True, "clip_frac"] == pytest.approx(2 / 3)
    assert groups.loc[False, "clip_frac"] == pytest.approx(1 / 3)
    assert groups.loc[True, "extreme_frac"] == pytest.approx(2 / 3)  # 0.8, 0.9 > ln 2
    assert groups.loc["all", "tokens"] == 6
    explained = A.explained_by_flips(log_w, clipped, flipped).set_index("event")
    # clipped tokens: 2, 3, 5 -> 2 of 3 flipped; base flip rate 3/6
    assert explained.loc["clipped", "flip_rate_in_event"] == pytest.approx(2 / 3)
    assert explained.loc["clipped", "base_flip_rate"] == pytest.approx(0.5)
    assert explained.loc["clipped", "lift"] == pytest.approx(4 / 3)
    # extreme tokens: 2, 3 -> both flipped
    assert explained.loc["extreme", "events"] == 2 and explained.loc["extreme", "flip_rate_in_event"] == 1.0
    assert explained.loc["extreme", "event_rate_flipped"] == pytest.approx(2 / 3)
    assert explained.loc["extreme", "event_rate_unflipped"] == 0.0


def test_flip_rate_by_margin_hand_worked():
    # 4 tokens x 1 layer; margins 0.1, 0.2, 3, 4; the two near-ties flipped.
    flipped = np.array([[True], [True], [False], [False]])
    recorded = np.ones((4, 1), bool)
    margin = np.array([[0.1], [0.2], [3.0], [4.0]])
    table = A.flip_rate_by_margin(flipped, recorded, margin, bins=2)
    assert table["flip_rate"].tolist() == [1.0, 0.0]
    assert table["routers"].tolist() == [2, 2]
    assert table["margin_low"].tolist() == pytest.approx([0.1, 1.6])


def test_flip_groups_by_minibatch_hand_worked():
    # Minibatch 0 holds the first update's tokens (log w = 0, never flipped); minibatch 1: flipped |log w| 0.4 and
    # 0.2 (mean 0.3), unflipped 0.1. Pooled, unflipped would average (0 + 0 + 0.1) / 3 = 0.033: a 9x contrast;
    # within minibatch 1 it is 0.3 / 0.1 = 3x.
    log_w = np.array([0.0, 0.0, 0.4, -0.2, 0.1])
    clipped = np.array([False, False, True, False, False])
    flipped = np.array([False, False, True, True, False])
    minibatch = np.array([0, 0, 1, 1, 1])
    table = A.flip_groups_by_minibatch(log_w, clipped, flipped, minibatch).set_index(["minibatch", "flipped"])
    assert table.loc[(0, False), "tokens"] == 2 and table.loc[(0, False), "mean_abs_log_w"] == 0.0
    assert table.loc[(0, True), "tokens"] == 0 and np.isnan(table.loc[(0, True), "mean_abs_log_w"])
    assert table.loc[(1, True), "mean_abs_log_w"] == pytest.approx(0.3)
    assert table.loc[(1, False), "mean_abs_log_w"] == pytest.approx(0.1)
    assert table.loc[(1, True), "clip_frac"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="shapes differ"):
        A.flip_groups_by_minibatch(log_w, clipped, flipped, minibatch[:2])


def test_run_attribution_matches_raw_arrays(fake_run):
    result = A.run_attribution(fake_run.path, "update_old", margin_bins=3)
    abs_w, clipped, flipped, minibatch = [], [], [], []
    margins, router_flipped = [], []
    for cols in fake_run.tokens.values():
        overlaps = decision_overlaps(cols[schema.COL_ROUTES_UPDATE], cols[schema.COL_ROUTES_OLD])
        for t, row in enumerate(overlaps):
            abs_w.append(abs(float(cols[schema.COL_LOG_W][t])))
            clipped.append(bool(cols[schema.COL_CLIPPED][t]))
            flipped.append(any(v < 2 for v in row))
            minibatch.append(int(cols[schema.COL_MINIBATCH][t]))
            for layer, v in enumerate(row):
                m = float(cols[schema.COL_MARGIN_OLD][t, layer])
                if not math.isnan(m):
                    margins.append(m)
                    router_flipped.append(v < 2)
    abs_w, clipped, flipped, minibatch = np.array(abs_w), np.array(clipped), np.array(flipped), np.array(minibatch)
    # groups / explained: minibatches 2..n only (the first one's log w is 0 by construction in a real run).
    later = minibatch > 0
    assert 0 < later.sum() < later.size  # both strata are present, so leaving one out is visible
    groups = result.groups.set_index("flipped")
    assert groups.loc["all", "tokens"] == later.sum()
    assert groups.loc[True, "tokens"] == (flipped & later).sum()
    assert groups.loc[True, "mean_abs_log_w"] == pytest.approx(abs_w[flipped & later].mean(), rel=1e-6)
    assert groups.loc[False, "clip_frac"] == pytest.approx(clipped[~flipped & later].mean())
    explained = result.explained.set_index("event")
    assert explained.loc["clipped", "flip_rate_in_event"] == pytest.approx(flipped[clipped & later].mean())
    by_mb = result.by_minibatch.set_index(["minibatch", "flipped"])
    for m in (0, 1):
        assert by_mb.loc[(m, "all"), "tokens"] == (minibatch == m).sum()
        assert by_mb.loc[(m, True), "mean_abs_log_w"] == pytest.approx(abs_w[flipped & (minibatch == m)].mean(),
                                                                      rel=1e-6)
    # Margin bins: the sample is every margin here (fewer than margin_sample), so edges are exact.
    margins, router_flipped = np.array(margins, np.float32).astype(np.float64), np.array(router_flipped)
    edges = np.quantile(margins, [0, 1 / 3, 2 / 3, 1])
    by_margin = result.by_margin
    assert by_margin["margin_low"].tolist() == pytest.approx(edges[:-1])
    for i, row in by_margin.iterrows():
        inside = (margins >= edges[i]) & ((margins < edges[i + 1]) | (i == 2) & (margins <= edges[i + 1]))
        assert row["routers"] == inside.sum()
        assert row["flip_rate"] == pytest.approx(router_flipped[inside].mean())
    # The fixture flips near-ties more often.
    assert by_margin["flip_rate"].iloc[0] > by_margin["flip_rate"].iloc[-1]


def test_expert_counts_and_load_stats():
    # 3 tokens x 2 layers, top-2, 4 experts. Layer 1 of token 2 holds a -1: left out.
    routes = np.array(
        [
            [[0, 1], [2, 3]],
            [[1, 0], [3, 2]],
            [[0, 2], [1, -1]],
        ],
        np.int16,
    )
    counts = X.expert_counts(routes, 4)
    assert counts.tolist() == [[3, 2, 1, 0], [0, 0, 2, 2]]
    stats = X.load_stats(counts, layers=[4, 7]).set_index("layer")
    p = np.array([3, 2, 1]) / 6
    assert stats.loc[4, "load_entropy"] == pytest.approx(-(p * np.log(p)).sum())
    assert stats.loc[7, "load_entropy"] == pytest.approx(math.log(2))
    assert stats.loc[4, "dead_experts"] == 1 and stats.loc[7, "dead_experts"] == 2
    assert stats.loc[4, "max_over_mean"] == pytest.approx(3 / 1.5)
    assert stats.loc[7, "slots"] == 4
    with pytest.raises(ValueError, match="num_experts"):
        X.expert_counts(routes, 3)


def test_uniform_load_has_entropy_ln_e():
    stats = X.load_stats(np.full((1, 16), 10))
    assert stats.loc[0, "load_entropy"] == pytest.approx(math.log(16))
    assert stats.loc[0, "load_entropy_norm"] == pytest.approx(1.0)


def test_expert_counts_match_naive():
    a, _ = synthetic_routes(500, 3, 4, 16, seed=3)
    counts = X.expert_counts(a, 16)
    for layer in range(3):
        naive = np.zeros(16, int)
        for t in range(500):
            for e in a[t, layer]:
                naive[e] += 1
        assert counts[layer].tolist() == naive.tolist()


def test_coactivation_matches_naive():
    a, _ = synthetic_routes(300, 2, 3, 8, seed=5)
    a[0, 1, 0] = -1
    for layer in range(2):
        pair = np.zeros((8, 8))
        single = np.zeros(8)
        for t in range(300):
            chosen = set(a[t, layer].tolist())
            if -1 in chosen:
                continue
            for i in chosen:
                single[i] += 1
                for j in chosen:
                    pair[i, j] += 1
        got = X.coactivation(a, 8, layer)
        with np.errstate(invalid="ignore"):
            np.testing.assert_allclose(got, pair / single[:, None])
        assert np.allclose(np.diag(got)[single > 0], 1.0)


def test_run_expert_counts_and_metrics_lists(fake_run):
    from moestab.run_folder.reader import load_metrics

    counts = X.run_expert_counts(fake_run.path)  # pi_old's free routes by default
    expected = sum(X.expert_counts(c[schema.COL_ROUTES_OLD_FREE], 8) for c in fake_run.tokens.values())
    assert counts.tolist() == expected.tolist()
    metrics = load_metrics(fake_run.path)
    load = X.metrics_load(metrics)
    assert len(load) == 3 * 3 * 8 and load["load"].eq(1 / 8).all()
    changed = X.metrics_per_layer(metrics, "routing/old_new/changed_by_layer")
    assert changed[changed["step"] == 2]["value"].tolist() == fake_run.metrics[1]["routing/old_new/changed_by_layer"]
