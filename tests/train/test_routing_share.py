"""``--routing-share``: routing's share of the ratio, measured with one more no-grad forward per minibatch.

The extra forward must change nothing else (weights, every other metric, the token tables), its replayed side must
be the logged ratio under R2 (its free side under ``off``), and with nothing to change the share is 0.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from moestab.metrics import keys
from moestab.train import train
from moestab.train.rollout import HFRolloutEngine
from tests.support.train import one_grpo_step, tiny_config

SHARE = frozenset({"routing_share"})  # the measurement switch of routing's share (RoutingShare.switch)

NEW = "routing_share/"
SCRIPTS = Path(__file__).parents[2] / "scripts"


def _same_run():
    spec = importlib.util.spec_from_file_location("same_run", SCRIPTS / "same_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _engine(replay: str):
    """The HF rollout engine, recording gate weights when the replay needs them (TRR)."""
    return lambda model, tokenizer: HFRolloutEngine(model, tokenizer, gates=replay == "rollout-gates")


def _others(metrics: dict) -> dict:
    """Every metric but the new keys and the wall times."""
    return {k: v for k, v in metrics.items() if not k.startswith((NEW, "time/"))}


@pytest.mark.parametrize("replay", ["off", "old", "rollout-gates"])
def test_the_extra_forward_changes_neither_the_weights_nor_another_metric(replay):
    _, model_off, metrics_off, t_off = one_grpo_step(replay, _engine(replay))
    _, model_on, metrics_on, t_on = one_grpo_step(replay, _engine(replay), measure_switches=SHARE)
    assert not any(k.startswith(NEW) for k in metrics_off)
    assert keys.ROUTING_SHARE_VAR in metrics_on
    assert json.dumps(_others(metrics_on)) == json.dumps(_others(metrics_off))  # bit for bit, NaNs included
    for (name, p_on), p_off in zip(model_on.named_parameters(), model_off.parameters(), strict=True):
        assert torch.equal(p_on, p_off), name
    for field in ("logp_old", "logp_old_free", "logp_update", "logp_new", "clipped", "routes_update"):
        assert torch.equal(getattr(t_on, field), getattr(t_off, field)), field
    assert t_off.logp_update_counterfactual is None and t_off.clipped_counterfactual is None


@pytest.mark.slow  # two tiny runs, about 50 s on two shared cores; the step-level test above runs in the fast tier
def test_a_tiny_run_with_the_flag_is_the_same_run_but_for_the_new_keys(tmp_path, cache_dir):
    runs = {}
    for on in (False, True):
        config = tiny_config(tmp_path / f"run-{on}", cache_dir, routing_share=on, algo="grpo", routing_replay="off")
        assert train(config, log=lambda s: None).status == "finished"
        runs[on] = tmp_path / f"run-{on}"
    lines = {on: [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
             for on, run in runs.items()}
    assert [_others(m) for m in lines[True]] == [_others(m) for m in lines[False]]
    assert all(keys.ROUTING_SHARE_VAR in m for m in lines[True] if keys.LOSS in m)
    assert any(m.get(keys.ROUTING_SHARE_LOG_VAR_FREE, 0) > 0 for m in lines[True])  # the run's ratio moved
    diffs, _ = _same_run().compare(runs[False], runs[True])
    expected = {"run.json config differs: ['routing_share']"}
    assert {d for d in diffs if not d.startswith("metrics key only in")} == expected  # tables, checkpoints: same
    assert all(d.split(": ")[-1].startswith(NEW) for d in diffs if d.startswith("metrics key only in"))


@pytest.mark.parametrize(("replay", "side"), [("old", "replayed"), ("rollout", "replayed"), ("off", "free")])
def test_the_update_forwards_side_is_the_logged_ratio(replay, side):
    _, _, m, t = one_grpo_step(replay, HFRolloutEngine, measure_switches=SHARE)
    assert m[f"{NEW}log_var_{side}"] == m[keys.RATIO_TOKEN_LOG_VAR] > 0  # the same computation on the same tokens
    assert m[f"{NEW}clip_frac_{side}"] == m[keys.CLIP_TOKEN_FRAC]
    log_w = t.tokens(t.logp_update - t.logp_old).double()
    assert m[f"{NEW}abs_log_w_{side}"] == pytest.approx(log_w.abs().mean().item(), rel=1e-12)
    # the counterfactual is a forward of its own: it differs from the update's somewhere after the first update
    assert not torch.equal(t.logp_update_counterfactual, t.logp_update)


@pytest.mark.parametrize("replay", ["off", "old"])
def test_the_share_is_zero_when_the_weights_are_pi_olds(replay):
    # One minibatch: the update forward runs on pi_old's weights, so pi_old's routes are the free ones and both
    # log-ratios are exactly 0 (the step runs every forward in the same chunks).
    _, _, m, t = one_grpo_step(replay, HFRolloutEngine, minibatches=1, measure_switches=SHARE)
    assert m[keys.ROUTING_SHARE_VAR] == 0.0
    assert m[keys.ROUTING_SHARE_LOG_VAR_FREE] == m[keys.ROUTING_SHARE_LOG_VAR_REPLAYED] == 0.0
    assert torch.equal(t.logp_update_counterfactual, t.logp_update)
    # with two, the first minibatch (pi_old's weights) still shows none
    _, _, m2, _ = one_grpo_step(replay, HFRolloutEngine, measure_switches=SHARE)
    assert m2[keys.ROUTING_SHARE_BY_MINIBATCH.format(stat="var_share")][0] == 0.0
    assert m2[keys.ROUTING_SHARE_BY_MINIBATCH.format(stat="log_var_free")][1] > 0
