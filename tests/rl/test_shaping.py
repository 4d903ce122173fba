"""DAPO's overlong reward shaping: the formula by hand, and as `moestab train` applies it."""

import json

import pytest
import torch

from moestab.configs import ConfigError
from moestab.rl import get_preset
from moestab.rl.shaping import overlong_penalty


def test_overlong_penalty_hand_worked():
    # L_max = 10, L_cache = 4: free up to 6, then (6 - |y|) / 4 down to -1 at 10, -1 beyond
    lengths = torch.tensor([3, 6, 7, 8, 10, 11])
    expected = [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    assert overlong_penalty(lengths, 10, 4).tolist() == pytest.approx(expected, abs=1e-15)
    assert overlong_penalty(lengths, 10, 10).tolist() == pytest.approx([-0.3, -0.6, -0.7, -0.8, -1.0, -1.0])


@pytest.mark.parametrize("cache", [0, 11, -1])
def test_overlong_cache_must_fit_the_budget(cache):
    with pytest.raises(ValueError, match=r"overlong cache must be in 1\.\.max_length=10"):
        overlong_penalty(torch.tensor([5]), 10, cache)


def test_dapo_preset_carries_the_papers_fraction_and_the_config_resolves_it(tmp_path):
    from tests.support.train import tiny_config

    assert get_preset("dapo").overlong_cache_fraction == pytest.approx(4096 / 20480)
    assert all(get_preset(n).overlong_cache_fraction is None for n in ("grpo", "gspo", "cispo"))
    dapo = tiny_config(tmp_path / "r", tmp_path / "c", algo="dapo")
    assert dapo.overlong_cache_tokens(20) == 4 and dapo.overlong_cache_tokens(4) == 1  # a fifth, at least 1
    assert tiny_config(tmp_path / "r", tmp_path / "c", algo="dapo", overlong_cache=0).overlong_cache_tokens(20) is None
    assert tiny_config(tmp_path / "r", tmp_path / "c", algo="grpo").overlong_cache_tokens(20) is None
    assert tiny_config(tmp_path / "r", tmp_path / "c", algo="grpo", overlong_cache=3).overlong_cache_tokens(20) == 3
    with pytest.raises(ConfigError, match="overlong_cache=30 exceeds max_new_tokens=20; valid: 0"):
        tiny_config(tmp_path / "r", tmp_path / "c", overlong_cache=30).overlong_cache_tokens(20)


def test_dapo_run_shapes_its_rewards(tmp_path):
    from moestab.run_folder import schema
    from moestab.train import train
    from tests.support.train import tiny_config

    # max_new_tokens 8 with overlong_cache 4: responses longer than 4 tokens are penalised
    run = tmp_path / "run"
    train(tiny_config(run, tmp_path / "cache", algo="dapo", steps=1, max_new_tokens=8, overlong_cache=4),
          log=lambda s: None)
    (m,) = [json.loads(x) for x in (run / schema.METRICS_JSONL).read_text().splitlines()]
    assert m["reward/mean"] == pytest.approx(m["reward/task_mean"] + m["reward/overlong_penalty_mean"], abs=1e-6)
    assert m["reward/overlong_frac"] > 0 and m["reward/overlong_penalty_mean"] < 0  # the untrained policy rambles
