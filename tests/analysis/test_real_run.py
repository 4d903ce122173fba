"""Analyzers on a run produced by `moestab train`, against values computed independently from its raw tables."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from moestab.analysis.mismatch import run_mismatch
from moestab.analysis.summary import summarize_runs
from moestab.analysis.volatility import run_volatility, volatility_table
from moestab.run_folder import schema
from moestab.train import train
from tests.support.tables import token_frame
from tests.support.train import tiny_config


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("real-run")
    train(tiny_config(root / "run", root / "cache", steps=3), log=lambda s: None)
    return root / "run"


def raw_tokens(run_dir) -> pd.DataFrame:
    return pd.concat(token_frame(p) for p in sorted((run_dir / schema.TOKENS_DIR).glob("*.parquet")))


def changed_by_sets(a_rows, b_rows, top_k: int) -> float:
    """1 - mean |E_a ∩ E_b| / k over every (token, layer), with Python sets."""
    overlaps = []
    for a, b in zip(a_rows, b_rows, strict=True):
        a, b = np.asarray(a).reshape(-1, top_k), np.asarray(b).reshape(-1, top_k)
        overlaps += [len(set(x) & set(y)) / top_k for x, y in zip(a.tolist(), b.tolist(), strict=True)]
    return 1 - sum(overlaps) / len(overlaps)


def test_volatility_by_step_matches_raw_tables_and_the_trainers_metrics(run_dir):
    tokens = raw_tokens(run_dir)
    metrics = [json.loads(line) for line in (run_dir / schema.METRICS_JSONL).read_text().splitlines()]
    table = volatility_table(run_volatility(run_dir, "old_new"), by=["step"]).set_index("step")
    for m in metrics:
        step_tokens = tokens[tokens.step == m["step"]]
        expected = changed_by_sets(step_tokens.routes_old, step_tokens.routes_new, top_k=2)
        assert table.loc[m["step"], "changed"] == pytest.approx(expected, abs=1e-12)
        assert m["routing/old_new/changed"] == pytest.approx(expected, abs=1e-12)
    # the steps must not all be trivially zero for this test to mean something
    assert any(m["routing/old_new/changed"] > 0 for m in metrics)


def test_volatility_by_minibatch_matches_raw_tables(run_dir):
    tokens = raw_tokens(run_dir)
    table = volatility_table(run_volatility(run_dir, "update_old"), by=["step", "minibatch"])
    for row in table.itertuples():
        sel = tokens[(tokens.step == row.step) & (tokens.minibatch == row.minibatch)]
        assert row.changed == pytest.approx(changed_by_sets(sel.routes_update, sel.routes_old, 2), abs=1e-12)


@pytest.mark.parametrize(("pair", "column"), [("rollout_old", "logp_old"), ("rollout_old_free", "logp_old_free")])
def test_mismatch_matches_raw_tables_and_the_trainers_metrics(run_dir, pair, column):
    tokens = raw_tokens(run_dir)
    _, overall, _ = run_mismatch(run_dir, pair)
    d = tokens[column].to_numpy(np.float64) - tokens.logp_rollout.to_numpy(np.float64)
    assert overall["k3"] == pytest.approx(np.mean(np.exp(d) - 1 - d), abs=1e-12)
    assert overall["k1"] == pytest.approx(np.mean(-d), abs=1e-12)
    assert overall["f2"] == pytest.approx(np.mean(np.abs(d) > math.log(2)), abs=1e-12)
    metrics = [json.loads(line) for line in (run_dir / schema.METRICS_JSONL).read_text().splitlines()]
    for m in metrics:  # the trainer logged the same numbers for each step (every sequence is recorded)
        step = tokens[tokens.step == m["step"]]
        d = step[column].to_numpy(np.float64) - step.logp_rollout.to_numpy(np.float64)
        # float32 token tables vs the trainer's float32 tensors: the same values, summed in float64
        assert m[f"mismatch/{pair}/k1"] == pytest.approx(np.mean(-d), abs=1e-9)


def test_summary_reports_the_runs_own_numbers(run_dir):
    row = summarize_runs([run_dir]).iloc[0]
    info = json.loads((run_dir / schema.RUN_JSON).read_text())
    assert row["status"] == "finished" and row["steps"] == 3
    assert row["final_accuracy"] == pytest.approx(info["final"]["accuracy"])
    assert row["warm_start_accuracy"] == pytest.approx(info["warm_start"]["accuracy"])
    tokens = raw_tokens(run_dir)
    later = tokens[tokens.minibatch > 0]
    per_step = later.groupby("step")["clipped"].mean()  # token-weighted, minibatches 2..n, per step
    assert row["clip_token_frac_later"] == pytest.approx(per_step.mean(), abs=1e-12)


def test_checkpoint_saturation_against_itself_is_one_and_against_the_start_is_not_above(run_dir):
    from moestab.probes.checkpoints import Checkpoint
    from moestab.probes.saturation import saturation
    from moestab.probes.suites import load_suite

    final = Checkpoint("final", run_dir / schema.checkpoint_dir(3))
    start = Checkpoint("start", run_dir / schema.checkpoint_dir(0))
    table = saturation([final, start], load_suite("task:arithmetic", 8).texts, reference=0)
    self_rows = table[table.checkpoint == "final"].filter(like="saturation")  # top-k and top-1 columns
    assert self_rows.shape == (4, 2)  # 4 MoE layers
    assert (self_rows.to_numpy() == 1.0).all()
    other = table[table.checkpoint == "start"].filter(like="saturation").to_numpy()
    assert ((other >= 0) & (other <= 1)).all() and (other < 1).any()  # 3 RL steps moved some routes
