from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from moestab.analysis import mismatch as M
from moestab.analysis import ratios as R
from moestab.run_folder import schema
from moestab.run_folder.reader import load_tokens


def tiny_tokens() -> pd.DataFrame:
    # Two sequences of step 1: seq 0 has 2 tokens, seq 1 has 3 tokens; one sequence of step 2.
    return pd.DataFrame(
        {
            "step": [1, 1, 1, 1, 1, 2],
            "seq": [0, 0, 1, 1, 1, 0],
            "minibatch": [0, 0, 1, 1, 1, 1],
            "log_w": [0.1, 0.3, -0.3, 0.0, 0.6, 1.0],
            "clipped": [False, True, False, False, False, False],
            "response_length": [2, 2, 3, 3, 3, 1],
            "reward": [1.0, 1.0, 0.0, 0.0, 0.0, 1.0],
        }
    )


def test_sequence_log_s_is_mean_log_w():
    seqs = R.sequence_log_s(tiny_tokens())
    # log s = mean of log w: (0.1+0.3)/2 = 0.2, (-0.3+0+0.6)/3 = 0.1, 1.0
    assert seqs["log_s"].tolist() == pytest.approx([0.2, 0.1, 1.0])
    assert seqs["tokens"].tolist() == [2, 3, 1] and seqs["clipped"].tolist() == [True, False, False]


def test_clip_fractions():
    overall = R.clip_fractions(tiny_tokens(), by=[]).iloc[0]
    # 1 of 6 tokens clipped; 1 of 3 sequences (step 1 seq 0) has a clipped token
    assert overall["token_frac"] == pytest.approx(1 / 6) and overall["seq_frac"] == pytest.approx(1 / 3)
    # minibatches 2..n: step 1 seq 1 (3 tokens) and step 2 seq 0 (1 token), none clipped
    assert overall["token_frac_later"] == 0.0 and overall["seq_frac_later"] == 0.0
    by_step = R.clip_fractions(tiny_tokens())
    assert by_step["step"].tolist() == [1, 2]
    assert by_step["token_frac"].tolist() == pytest.approx([0.2, 0.0])
    assert by_step["seq_frac"].tolist() == pytest.approx([0.5, 0.0])
    assert by_step["sequences"].tolist() == [2, 1]


def test_clip_fractions_later_minibatches_are_not_diluted_by_the_first():
    # Step of 4 sequences x 2 tokens in 4 minibatches; mb 0 never clips (ratio 1); sequence 3 (mb 3)
    # is clipped as a whole (sequence-level loss): 2 of 8 tokens overall, 2 of the 6 later tokens.
    tokens = pd.DataFrame({"step": [1] * 8, "seq": [0, 0, 1, 1, 2, 2, 3, 3], "minibatch": [0, 0, 1, 1, 2, 2, 3, 3],
                           "clipped": [False] * 6 + [True, True]})
    row = R.clip_fractions(tokens).iloc[0]
    assert row["token_frac"] == pytest.approx(2 / 8) and row["token_frac_later"] == pytest.approx(2 / 6)
    assert row["seq_frac"] == pytest.approx(1 / 4) and row["seq_frac_later"] == pytest.approx(1 / 3)


def test_variance_by_length():
    table = R.variance_by_length(tiny_tokens(), edges=(1, 2, 3)).set_index("length_bin")
    # length 2: log w {0.1, 0.3} var 0.01; length 3: {-0.3, 0, 0.6} mean 0.1, var (0.16+0.01+0.25)/3 = 0.14
    assert table.loc[2, "var_log_w"] == pytest.approx(0.01)
    assert table.loc[3, "var_log_w"] == pytest.approx(0.14)
    assert table.loc[1, "var_log_s"] == 0.0 and table.loc[3, "sequences"] == 1


def test_quantiles_and_histograms():
    tokens = tiny_tokens()
    q = R.ratio_quantiles(tokens, quantiles=(0.5,)).set_index("quantity")
    assert q.loc["log_w", "q0.5"] == pytest.approx(np.median(tokens["log_w"]))
    assert q.loc["log_s", "count"] == 3 and q.loc["log_s", "mean"] == pytest.approx((0.2 + 0.1 + 1.0) / 3)
    hist = R.ratio_histograms(tokens, bins=4)
    assert hist.groupby("quantity")["count"].sum().to_dict() == {"log_s": 3, "log_w": 6}
    fixed = R.histogram(np.array([-5.0, -0.5, 0.5, 0.6, 5.0, np.nan]), bins=2, limit=1.0)
    assert fixed["count"].tolist() == [2, 3]  # outside values land in the end bins, NaN is dropped


def test_ratios_on_run_match_raw_arrays(fake_run):
    tokens = load_tokens(fake_run.path)
    seqs = R.sequence_log_s(tokens)
    for step, cols in fake_run.tokens.items():
        for seq in np.unique(cols[schema.COL_SEQ]):
            select = cols[schema.COL_SEQ] == seq
            expected = float(np.mean(cols[schema.COL_LOG_W][select].astype(np.float64)))
            got = seqs[(seqs["step"] == step) & (seqs["seq"] == seq)]["log_s"].item()
            assert got == pytest.approx(expected, rel=1e-6)


def test_mismatch_hand_worked():
    old = np.array([-1.0, -2.0, -1.0, -3.0])
    rollout = np.array([-1.0, -1.0, -1.5, -3.0 + math.log(3)])
    # d = [0, -1, 0.5, -ln 3]
    d = old - rollout
    stats = M.mismatch_stats(old, rollout, sequence=np.array([0, 0, 1, 1]))
    assert stats["k1"] == pytest.approx(np.mean(-d))
    assert stats["k3"] == pytest.approx(np.mean([math.exp(x) - 1 - x for x in d]))
    assert stats["f2"] == pytest.approx(0.5)  # |-1| and |-ln 3| exceed ln 2 = 0.69
    assert stats["mean_d"] == pytest.approx(d.mean()) and stats["std_d"] == pytest.approx(d.std())
    # chi2: sequences sum d = -1 and 0.5 - ln 3
    expected = (math.exp(-2) + math.exp(2 * (0.5 - math.log(3)))) / 2 - 1
    assert stats["chi2_seq"] == pytest.approx(expected)
    assert stats["sequences"] == 2 and stats["tokens"] == 4


def test_mismatch_is_zero_without_mismatch():
    x = np.array([-1.0, -0.5])
    stats = M.mismatch_stats(x, x)
    assert stats["k1"] == 0 and stats["k3"] == 0 and stats["f2"] == 0 and math.isnan(stats["chi2_seq"])


@pytest.mark.parametrize(("pair", "trainer"), [("rollout_old", "logp_old"), ("rollout_old_free", "logp_old_free")])
def test_run_mismatch_matches_raw_arrays(fake_run, pair, trainer):
    by_step, overall, routing = M.run_mismatch(fake_run.path, pair)
    for step, cols in fake_run.tokens.items():
        d = cols[trainer].astype(np.float64) - cols[schema.COL_LOGP_ROLLOUT]
        row = by_step.set_index("step").loc[step]
        assert row["k3"] == pytest.approx(np.mean(np.exp(d) - 1 - d), rel=1e-6)
        sums = [d[cols[schema.COL_SEQ] == s].sum() for s in np.unique(cols[schema.COL_SEQ])]
        assert row["chi2_seq"] == pytest.approx(np.mean(np.exp(2 * np.array(sums))) - 1, rel=1e-6)
    assert overall["tokens"] == sum(len(c[schema.COL_SEQ]) for c in fake_run.tokens.values())
    assert overall["sequences"] == 3 * 8
    # Routing mismatch by layer: some layer-0 rollout routes hold -1 and are left out.
    assert routing["layer"].tolist() == [0, 2, 3]
    assert routing.loc[0, "unrecorded"] > 0 and routing.loc[1, "unrecorded"] == 0
    other = schema.ROUTE_PAIRS[pair][1]
    rollout = np.concatenate([c[schema.COL_ROUTES_ROLLOUT] for c in fake_run.tokens.values()])[:, 1]  # layer 2
    trainer_routes = np.concatenate([c[other] for c in fake_run.tokens.values()])[:, 1]
    flips = [set(a) != set(b) for a, b in zip(rollout.tolist(), trainer_routes.tolist(), strict=True)]
    assert routing.loc[1, "router_flip"] == pytest.approx(np.mean(flips), abs=1e-12)


def test_unknown_mismatch_pair_lists_the_valid_ones(fake_run):
    with pytest.raises(ValueError, match="rollout_old_free"):
        M.run_mismatch(fake_run.path, "old_new")
