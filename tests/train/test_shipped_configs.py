"""The YAML recipes in configs/ are valid, say what they claim, and the SRPO two-stage chain runs."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from moestab.configs import build_config, load_yaml
from moestab.run_folder import schema
from moestab.run_folder.reader import read_run_info
from moestab.tasks import task_from_spec
from moestab.train import TrainConfig, train
from tests.support.train import tiny_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def load(name: str) -> TrainConfig:
    return build_config(TrainConfig, load_yaml(CONFIGS / name))


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_is_valid(path):
    config = build_config(TrainConfig, load_yaml(path))  # raises ConfigError on any invalid field
    task_from_spec(config.task)


def test_long_config_has_responses_of_at_least_32_tokens():
    config = load("long.yaml")
    task = task_from_spec(config.task)
    answers = [len(e.answer) for e in task.eval_set(200, seed=0)]
    assert statistics.mean(answers) >= 32  # the bar; the answer is followed by EOS as well
    assert config.rollout_dtype == "bfloat16" and config.dtype == "float32"  # the production-like gap


def test_srpo_stage2_starts_from_stage1_last_checkpoint():
    first, second = load("srpo-stage1.yaml"), load("srpo-stage2.yaml")
    assert second.model == f"{first.out}/{schema.checkpoint_dir(first.steps)}"
    assert first.history_resampling and second.history_resampling
    # Stage 2 is the mixed data: its lengths include stage 1's and shorter ones.
    short, long_ = task_from_spec(second.task).length, task_from_spec(first.task).length
    assert short[0] < long_[0] and short[1] == long_[1]


@pytest.mark.slow
def test_srpo_two_stages_chain(tmp_path, cache_dir):
    # The recipe at test scale: stage 1's final checkpoint is a model stage 2 trains from (no warm start).
    first, second = load("srpo-stage1.yaml"), load("srpo-stage2.yaml")
    stage1 = tmp_path / "stage1"
    common = {"history_resampling": True, "max_zero_advantage_steps": 0, "algo": first.algo}
    train(tiny_config(stage1, cache_dir, **common), log=lambda s: None)
    model = stage1 / schema.checkpoint_dir(2)
    result = train(tiny_config(tmp_path / "stage2", cache_dir, model=str(model), task=second.task.replace("32", "6"),
                               **common), log=lambda s: None)
    info = read_run_info(result.run_dir)
    assert info.status == schema.STATUS_FINISHED and info.last_step == 2
    assert info.warm_start["path"] == str(model) and info.warm_start["record"] is None  # used as given, no warm start
