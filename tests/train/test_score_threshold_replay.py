"""Score-threshold replay in ``moestab train`` (``--replay-score-ratio``, prime-rl PR #2703), tested like the other
replay modes: a step's update forwards use the replayed routes except where the threshold refilled them, the logged
``routing/replay_replace_rate`` is recomputed from the step's route tensors with plain Python sets, plain replay
replaces nothing, and bad settings are refused before anything runs."""

from __future__ import annotations

import json

import pytest

from moestab.configs import ConfigError
from moestab.metrics import keys
from moestab.run_folder import schema
from moestab.train import train
from moestab.train.rollout import HFRolloutEngine
from tests.support.train import one_grpo_step, tiny_config


def replaced_share(t) -> tuple[float, int]:
    """Share of the replayed slots at response-scoring positions that the update forwards did not use, with sets
    (``routes_old`` are the routes the updates replayed under R2 and R3), and the number of decisions."""
    update, replayed = t.response(t.routes_update), t.response(t.routes_old)  # [tokens, layers, k]
    kept = decisions = 0
    for u_tok, r_tok in zip(update.tolist(), replayed.tolist(), strict=True):
        for u, r in zip(u_tok, r_tok, strict=True):
            kept += len(set(u) & set(r))
            decisions += 1
    k = update.shape[-1]
    return 1 - kept / (k * decisions), decisions


@pytest.mark.parametrize("replay", ["old", "rollout"])
def test_plain_replay_replaces_nothing_and_a_threshold_replaces_what_the_sets_say(replay):
    engine = lambda model, tokenizer: HFRolloutEngine(model, tokenizer)  # noqa: E731
    _, _, plain, t_plain = one_grpo_step(replay, engine)
    assert plain[keys.ROUTING_REPLACE_RATE] == 0.0 == replaced_share(t_plain)[0]
    _, _, metrics, t = one_grpo_step(replay, engine, replay_score_ratio=1.0)
    share, decisions = replaced_share(t)
    assert metrics[keys.ROUTING_REPLACE_RATE] == pytest.approx(share, rel=1e-12)
    # ratio 1 keeps a replayed expert only when the updating router ranks it in its own top-k: after the first
    # minibatch's optimizer step some are not (the check can fail), and most still are.
    assert 0 < share < 0.5 and decisions > 0


def test_off_writes_no_replace_rate():
    engine = lambda model, tokenizer: HFRolloutEngine(model, tokenizer)  # noqa: E731
    _, _, metrics, _ = one_grpo_step("off", engine)
    assert keys.ROUTING_REPLACE_RATE not in metrics


@pytest.mark.parametrize(("overrides", "message"), [
    ({"routing_replay": "off", "replay_score_ratio": 0.5}, "needs routing_replay old or rollout"),
    ({"routing_replay": "rollout-gates", "replay_score_ratio": 0.5}, "not rollout-gates"),
    ({"routing_replay": "rollout", "replay_score_ratio": 1.5}, "replay_score_ratio"),
    ({"routing_replay": "rollout", "replay_score_ratio": float("nan")}, "replay_score_ratio"),
])
def test_bad_settings_are_refused(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(tmp_path / "run", tmp_path / "cache", **overrides)


def test_a_run_with_a_threshold_records_its_setting_and_the_rate(tmp_path):
    run = tmp_path / "run"
    config = tiny_config(run, tmp_path / "cache", steps=1, routing_replay="rollout", replay_score_ratio=0.9)
    train(config, log=lambda s: None)
    line = json.loads((run / schema.METRICS_JSONL).read_text().splitlines()[0])
    assert list(line) == keys.written_keys(keys.MOESTAB_TRAIN | {keys.REPLAYED, keys.EVAL})
    assert 0 <= line[keys.ROUTING_REPLACE_RATE] <= 1
    assert json.loads((run / schema.RUN_JSON).read_text())["config"]["replay_score_ratio"] == 0.9
