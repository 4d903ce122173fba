"""A new measurement is one class plus its key row, and both trainers run it (issue 42.2).

The measurement added here scores pi_new once more (its own forward, at the step's ``after_step``) and reports the
mean log-prob of the response tokens it scored. Its value is checked against a second path: the ``logp_new`` column
that the built-in ``NewPolicy`` measurement writes to the same step's token table, from its own forward.
"""

from __future__ import annotations

import math

import pytest
import torch

from moestab.metrics import keys
from moestab.recording import measurements
from moestab.run_folder import schema
from moestab.run_folder.reader import load_metrics, load_tokens
from moestab.train import train
from tests.support.train import tiny_config

KEY = "test/pi_new_logp_mean"
TOL = 1e-5
"""The same float32 log-probs averaged in float32 (the measurement) and in float64 from the token table: a few 1e-7
apart on values near -3."""


class PiNewLogpMean(measurements.Measurement):
    """pi_new's mean log-prob over the response tokens its forward scored."""

    keys = (KEY,)

    @staticmethod
    def applies(setup: measurements.MeasureSetup) -> bool:
        return True

    def after_step(self, fwd, measured) -> None:
        scored = fwd.free(measured)
        self.value = float(scored.logp[scored.mask].mean())

    def metrics(self) -> dict[str, float]:
        return {KEY: self.value}


@pytest.fixture
def added(monkeypatch):
    """The measurement and its key row, added where a contributor would add them."""
    row = keys.MetricKey(KEY, keys.FLOAT, f"{__name__}.PiNewLogpMean", "pi_new's mean response log-prob", "progress",
                         computed=False)
    monkeypatch.setattr(keys, "KEYS", {**keys.KEYS, KEY: row})
    monkeypatch.setattr(measurements, "MEASUREMENTS", (*measurements.MEASUREMENTS, PiNewLogpMean))


def _check(run) -> None:
    metrics = load_metrics(run)
    tokens = load_tokens(run, columns=[schema.COL_STEP, schema.COL_LOGP_NEW])
    assert len(metrics) >= 1
    for _, line in metrics.iterrows():
        expected = tokens[tokens[schema.COL_STEP] == line["step"]][schema.COL_LOGP_NEW].astype("float64").mean()
        assert math.isfinite(expected)
        assert abs(line[KEY] - expected) < TOL, (line["step"], line[KEY], expected)


def test_moestab_train_runs_an_added_measurement(added, tmp_path, cache_dir):
    config = tiny_config(tmp_path / "run", cache_dir, steps=1)
    train(config)
    _check(tmp_path / "run")


def test_the_trl_integration_runs_an_added_measurement(added, tmp_path):
    pytest.importorskip("trl")
    from datasets import Dataset  # TRL's own dependency

    from moestab.integrations.trl import MoestabGRPOTrainer, RecordSettings
    from moestab.models import EmbeddedModelSpec, build_embedded_policy
    from tests.support.trl import LAYERS, PROMPTS, grpo_args, reward

    torch.manual_seed(0)
    model, tokenizer = build_embedded_policy(EmbeddedModelSpec(num_layers=LAYERS, hidden_size=64))
    trainer = MoestabGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=reward,
                                 train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                                 args=grpo_args(tmp_path / "trl", max_steps=2),
                                 moestab=RecordSettings(tmp_path / "run"))
    trainer.train()
    _check(tmp_path / "run")


def test_a_measurement_reporting_an_undeclared_key_is_refused(monkeypatch):
    class Stray(PiNewLogpMean):
        keys = ()

    stray = Stray(measurements.MeasureSetup(replay="off"), (1, 1), torch.float32, torch.device("cpu"))
    stray.value = 0.0
    with pytest.raises(ValueError, match=r"Stray reported .*test/pi_new_logp_mean.* not among its declared keys"):
        measurements.measured_metrics([stray])
