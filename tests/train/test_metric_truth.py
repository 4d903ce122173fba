"""What each metric means under every replay mode, checked on real training runs (issue: metric truth).

A rollout engine that disagrees with the trainer on a known share of routes (``DisagreeingRoutesEngine``:
10% of decisions take the (k+1)-th expert) plays the production inference engine. Under R3 the pi_old
used in the ratio replays the rollout's routes, so its mismatch with the rollout vanishes while the
trainer's free pi_old still disagrees; without replay the two are one and the same.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from moestab.analysis.attribution import run_attribution
from moestab.cli import main
from moestab.run_folder import schema
from moestab.train import train
from tests.support.engines import DisagreeingRoutesEngine
from tests.support.tables import token_frame
from tests.support.train import tiny_config


def run(tmp_path, cache_dir, replay: str, **overrides):
    config = tiny_config(tmp_path / replay, cache_dir, steps=2, routing_replay=replay, algo="grpo", **overrides)
    train(config, log=lambda s: None, rollout_engine=DisagreeingRoutesEngine)
    out = tmp_path / replay
    metrics = [json.loads(line) for line in (out / schema.METRICS_JSONL).read_text().splitlines()]
    tokens = pd.concat(token_frame(out / schema.tokens_file(s)) for s in (1, 2))
    return out, metrics, tokens


def k3(trainer: pd.Series, rollout: pd.Series) -> float:
    d = trainer.to_numpy(np.float64) - rollout.to_numpy(np.float64)
    return float(np.mean(np.exp(d) - 1 - d))


def router_flip(a: pd.Series, b: pd.Series) -> float:
    """Share of (token, layer) decisions whose expert sets differ, with Python sets (top_k = 2)."""
    flips = [set(x[i : i + 2]) != set(y[i : i + 2]) for x, y in zip(a, b, strict=True) for i in range(0, len(x), 2)]
    return float(np.mean(flips))


@pytest.fixture(scope="module")
def r3(tmp_path_factory, cache_dir):
    return run(tmp_path_factory.mktemp("truth"), cache_dir, "rollout")


@pytest.fixture(scope="module")
def off(tmp_path_factory, cache_dir):
    return run(tmp_path_factory.mktemp("truth"), cache_dir, "off")


def analyze_json(run_dir, capsys) -> dict:
    assert main(["analyze", str(run_dir), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    return row


def test_r3_removes_the_mismatch_of_the_ratios_pi_old_but_not_of_the_free_one(r3, capsys):
    out, metrics, tokens = r3
    # token tables: as used ~ 0 (same routes, same gates; only generate's KV-cache rounding), free > 0
    used, free = k3(tokens.logp_old, tokens.logp_rollout), k3(tokens.logp_old_free, tokens.logp_rollout)
    assert used < 1e-9 < 1e-5 < free
    assert router_flip(tokens.routes_rollout, tokens.routes_old) == 0.0
    assert router_flip(tokens.routes_rollout, tokens.routes_old_free) > 0.05  # ~10% swapped, plus knock-on
    for m in metrics:  # metrics.jsonl says the same, per step
        assert m["mismatch/rollout_old/k3"] < 1e-9 < 1e-5 < m["mismatch/rollout_old_free/k3"]
        assert m["routing/rollout_old/router_flip"] == 0.0 and m["routing/rollout_old_free/router_flip"] > 0.05
        step = tokens[tokens.step == m["step"]]
        assert m["mismatch/rollout_old_free/k3"] == pytest.approx(k3(step.logp_old_free, step.logp_rollout), rel=1e-4)
        assert m["routing/rollout_old_free/router_flip"] == pytest.approx(
            router_flip(step.routes_rollout, step.routes_old_free), abs=1e-12)
    row = analyze_json(out, capsys)  # and so does `moestab analyze --json`
    assert row["replay"] == "R3"
    assert row["rollout_old_k3"] < 1e-9 < 1e-5 < row["rollout_old_free_k3"]
    assert row["rollout_old_router_flip"] == 0.0
    assert row["rollout_old_free_router_flip"] == pytest.approx(
        np.mean([m["routing/rollout_old_free/router_flip"] for m in metrics]))


def test_without_replay_both_sides_are_the_same_numbers_and_both_positive(off, capsys):
    out, metrics, tokens = off
    assert np.array_equal(tokens.logp_old, tokens.logp_old_free)
    assert np.array_equal(np.stack(tokens.routes_old), np.stack(tokens.routes_old_free))
    for m in metrics:
        for stat in ("k1", "k3", "f2"):
            assert m[f"mismatch/rollout_old/{stat}"] == m[f"mismatch/rollout_old_free/{stat}"]
        assert m["mismatch/rollout_old/k3"] > 1e-5 and m["routing/rollout_old/router_flip"] > 0.05
        assert m["routing/rollout_old/router_flip"] == m["routing/rollout_old_free/router_flip"]
    row = analyze_json(out, capsys)
    assert row["rollout_old_k3"] == row["rollout_old_free_k3"] > 1e-5
    assert row["rollout_old_router_flip"] == row["rollout_old_free_router_flip"] > 0.05


def test_r3_attribution_labels_no_token_flipped_where_both_sides_of_log_w_replay_the_same_routes(r3):
    out, _, tokens = r3
    first = tokens[tokens.minibatch == 0]
    assert (first.log_w == 0.0).all()  # ratio exactly 1 before the first update ...
    attribution = run_attribution(out)  # ... and no token is labelled flipped, in any minibatch
    groups = attribution.groups.set_index("flipped")
    assert groups.loc[True, "tokens"] == 0 and groups.loc["all", "tokens"] == (tokens.minibatch > 0).sum() > 0
    assert attribution.by_minibatch.set_index(["minibatch", "flipped"]).loc[(0, "all"), "tokens"] == len(first)
    # What the old records claimed: the free routes differ from the replayed ones on many tokens.
    assert router_flip(tokens.routes_update, tokens.routes_old_free) > 0.05


def test_attribution_without_replay_compares_the_two_sides_of_log_w(off):
    out, _, tokens = off
    attribution = run_attribution(out)
    flipped = [
        any(set(a[i : i + 2]) != set(b[i : i + 2]) for i in range(0, len(a), 2))
        for a, b in zip(tokens.routes_update, tokens.routes_old, strict=True)
    ]
    assert attribution.groups.set_index("flipped").loc[True, "tokens"] == sum(flipped) > 0
    assert not any(f for f, mb in zip(flipped, tokens.minibatch, strict=True) if mb == 0)


def test_clip_fractions_per_step_over_all_tokens_and_later_minibatches(off):
    _, metrics, tokens = off
    for m in metrics:
        step = tokens[tokens.step == m["step"]]
        later = step[step.minibatch > 0]
        assert m["clip/token_frac"] == pytest.approx(step.clipped.mean(), abs=1e-12)
        assert m["clip/token_frac_later"] == pytest.approx(later.clipped.mean(), abs=1e-12)
        assert m["clip/seq_frac_later"] == pytest.approx(later.groupby("seq").clipped.any().mean(), abs=1e-12)
        w = np.exp(step.log_w.to_numpy(np.float64))
        assert m["ratio/token_max"] == pytest.approx(w.max(), rel=1e-6)  # the step's max, not a mean of maxima
        assert m["minibatches"] == 2
    assert any(m["clip/token_frac_later"] > 0 for m in metrics)  # the check above is not all zeros
