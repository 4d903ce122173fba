"""A run recorded before a setting existed resumes with what it ran with, not the setting's new default
(moestab.train.config.BEFORE_THE_SETTING): a warm start without the load-balancing loss stays without it."""

from __future__ import annotations

import json

import pytest

from moestab.train import TrainingError
from moestab.train.config import BEFORE_THE_SETTING, TrainConfig, load_train_config
from moestab.train.run_lifetime import check_resumed_settings, config_defaults
from tests.support.runs import a_run

RECORDED = {"algo": "gspo", "routing_replay": "off", "model": "embedded", "task": "arithmetic", "steps": 3}


def _older_run(path, config: dict):
    """A run whose run.json config lacks the warm start's router-loss settings, as runs before them."""
    folder = a_run(path, checkpoints=(0,), last_step=0)
    info = json.loads(folder.run_json.read_text())
    info["config"] = config
    folder.run_json.write_text(json.dumps(info))
    return folder


def test_an_older_run_resumes_without_the_balancing_loss_a_new_one_has(tmp_path):
    assert TrainConfig().warm_start_aux_loss_coef == 0.01  # new runs: Switch's coefficient
    folder = _older_run(tmp_path / "old", RECORDED)
    resumed = load_train_config(flags={"resume": str(folder.path), "steps": 4})
    assert resumed.warm_start_aux_loss_coef == BEFORE_THE_SETTING["warm_start_aux_loss_coef"] == 0.0
    check_resumed_settings(folder.path, folder.info(), {"warm_start_aux_loss_coef": 0.0},
                           defaults=config_defaults())  # what it ran with: accepted


def test_an_older_run_refuses_the_new_default_as_a_changed_setting(tmp_path):
    folder = _older_run(tmp_path / "old", RECORDED)
    with pytest.raises(TrainingError, match=r"warm_start_aux_loss_coef: run has 0.0, asked 0.01"):
        check_resumed_settings(folder.path, folder.info(), {"warm_start_aux_loss_coef": 0.01},
                               defaults=config_defaults())


def test_a_run_that_recorded_the_setting_keeps_its_value(tmp_path):
    folder = _older_run(tmp_path / "new", {**RECORDED, "warm_start_aux_loss_coef": 0.05})
    assert load_train_config(flags={"resume": str(folder.path)}).warm_start_aux_loss_coef == 0.05
