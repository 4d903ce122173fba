"""A new measurement is one class plus its key row, and both trainers run it (issue 42.2); one that fills a token-table
column of its own is its class and its field declaration, and both trainers write the column (issue 56.1).

The measurement added here scores pi_new once more (its own forward, at the step's ``after_step``) and reports the
mean log-prob of the response tokens it scored. Its value is checked against a second path: the ``logp_new`` column
that the built-in ``NewPolicy`` measurement writes to the same step's token table, from its own forward. A second
one logs the hooks each trainer calls, in order, with their rows: TRL's call order moves ``before_updates`` to the
last micro-step when TRL computes no pi_old forward (``gradient_accumulation_steps`` covering the generation batch).
"""

from __future__ import annotations

import itertools
import math
from typing import ClassVar

import pytest
import torch

from moestab.metrics import keys
from moestab.recording import measurements
from moestab.run_folder import schema
from moestab.run_folder.reader import load_metrics, load_tokens
from moestab.train import train
from tests.support.measurements import COLUMN as OWN_COLUMN
from tests.support.measurements import add as add_measurement
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
        self.value = float(scored.logp[scored.mask].mean()) if bool(scored.mask.any()) else None

    def metrics(self) -> dict[str, float]:
        return {} if self.value is None else {KEY: self.value}


class HookLog(measurements.Measurement):
    """Each hook the trainer calls, with the rows it passes (kept on the class: the trainer builds one a step)."""

    calls: ClassVar[list[tuple[str, list[int]]]]  # set by the `added` fixture

    @staticmethod
    def applies(setup: measurements.MeasureSetup) -> bool:
        return True

    def before_updates(self, fwd, measured) -> None:
        HookLog.calls.append(("before_updates", []))

    def before_update(self, fwd, rows, scored) -> None:
        HookLog.calls.append(("before_update", rows.tolist()))

    def after_update(self, rows, update) -> None:
        assert update.clipped(update.logp).shape == update.logp.shape
        HookLog.calls.append(("after_update", rows.tolist()))

    def after_step(self, fwd, measured) -> None:
        HookLog.calls.append(("after_step", []))


@pytest.fixture
def added(monkeypatch):
    """The measurement and its key row, added where a contributor would add them."""
    row = keys.MetricKey(KEY, keys.FLOAT, "pi_new's mean response log-prob", "progress", computed=False)
    monkeypatch.setattr(keys, "KEYS", {**keys.KEYS, KEY: row})
    monkeypatch.setattr(measurements, "MEASUREMENTS", (*measurements.MEASUREMENTS, PiNewLogpMean, HookLog))
    monkeypatch.setattr(HookLog, "calls", [], raising=False)


def _updates_then(calls: list[tuple[str, list[int]]], minibatches: int, rows: int) -> list[str]:
    """The hook names in order; checks that the update hooks come in before/after pairs, each pair on one
    minibatch's rows, the minibatches covering every row once."""
    pairs = [(a, b) for a, b in itertools.pairwise(calls) if a[0] == "before_update"]
    assert len(pairs) == minibatches and all(b[0] == "after_update" and a[1] == b[1] for a, b in pairs)
    assert sorted(r for a, _ in pairs for r in a[1]) == list(range(rows))
    return [name for name, _ in calls]


def _check(run) -> None:
    metrics = load_metrics(run)
    tokens = load_tokens(run, columns=[schema.COL_STEP, schema.COL_LOGP_NEW])
    assert len(metrics) >= 1
    for _, line in metrics.iterrows():
        expected = tokens[tokens[schema.COL_STEP] == line["step"]][schema.COL_LOGP_NEW].astype("float64").mean()
        assert math.isfinite(expected)
        assert abs(line[KEY] - expected) < TOL, (line["step"], line[KEY], expected)


def test_moestab_train_runs_an_added_measurement(added, tmp_path, cache_dir):
    config = tiny_config(tmp_path / "run", cache_dir, steps=1)  # 4 prompts x 4, 2 minibatches
    train(config)
    _check(tmp_path / "run")
    names = _updates_then(HookLog.calls, minibatches=2, rows=16)
    assert names == ["before_updates"] + ["before_update", "after_update"] * 2 + ["after_step"]


def test_an_unmeasured_step_writes_none_of_a_measurement_s_keys(added, tmp_path, cache_dir):
    train(tiny_config(tmp_path / "run", cache_dir, steps=2, measure_every=2))  # step 2 measures no row
    metrics = load_metrics(tmp_path / "run").set_index("step")
    assert math.isfinite(metrics.loc[1, KEY]) and math.isnan(metrics.loc[2, KEY])


@pytest.mark.parametrize("accumulation", [1, 2])  # 2: one optimizer step per generation batch, no pi_old forward
def test_the_trl_integration_runs_an_added_measurement(added, tmp_path, accumulation):
    pytest.importorskip("trl")
    from datasets import Dataset  # TRL's own dependency

    from moestab.integrations.trl import MoestabGRPOTrainer, RecordSettings
    from moestab.models import EmbeddedModelSpec, build_embedded_policy
    from tests.support.trl import LAYERS, PROMPTS, grpo_args, reward

    torch.manual_seed(0)
    model, tokenizer = build_embedded_policy(EmbeddedModelSpec(num_layers=LAYERS, hidden_size=64))
    trainer = MoestabGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=reward,
                                 train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                                 args=grpo_args(tmp_path / "trl", max_steps=2 // accumulation,
                                                gradient_accumulation_steps=accumulation),
                                 moestab=RecordSettings(tmp_path / "run"))
    trainer.train()
    _check(tmp_path / "run")
    names = _updates_then(HookLog.calls, minibatches=2, rows=16)  # 16 sequences, 2 micro-batches of 8
    updates = ["before_update", "after_update"] * 2
    if accumulation == 1:  # TRL's pi_old forward ran before the first micro-step's update
        assert names == ["before_updates", *updates, "after_step"]
    else:  # pi_old is the loss forward itself: its calls are all known at the last micro-step only
        assert names == [*updates, "before_updates", "after_step"]


def test_a_measurement_reporting_an_undeclared_key_is_refused(monkeypatch):
    class Stray(PiNewLogpMean):
        keys = ()

    stray = Stray(measurements.MeasureSetup(replay="off"), (1, 1), torch.float32, torch.device("cpu"))
    stray.value = 0.0
    with pytest.raises(ValueError, match=r"Stray reported .*test/pi_new_logp_mean.* not among its declared keys"):
        measurements.measured_metrics([stray])


# ---- a measurement that fills a token-table column of its own (issue 56.1) -----------------------------------------


@pytest.fixture
def with_column(monkeypatch):
    """tests/support/measurements.py's ``LogpNewAgain``: its class and its field declaration, nothing else."""
    monkeypatch.setattr(measurements, "MEASUREMENTS", add_measurement("logp-new-again"))


def check_own_column(run) -> None:
    """The measurement's column holds pi_new's log-probs as ``NewPolicy``'s ``logp_new`` (the same forward)."""
    tokens = load_tokens(run, columns=[schema.COL_STEP, schema.COL_LOGP_NEW, OWN_COLUMN])
    assert len(tokens) and tokens[schema.COL_LOGP_NEW].notna().any()
    assert tokens[OWN_COLUMN].equals(tokens[schema.COL_LOGP_NEW])


@pytest.mark.parametrize("measure_fraction", [1.0, 0.5])  # 0.5: a budget's sample of the rows, scored by both
def test_moestab_train_writes_a_measurement_s_own_column(with_column, tmp_path, cache_dir, measure_fraction):
    train(tiny_config(tmp_path / "run", cache_dir, steps=1, measure_fraction=measure_fraction))
    check_own_column(tmp_path / "run")


def test_the_trl_integration_writes_a_measurement_s_own_column(with_column, tmp_path):
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
    check_own_column(tmp_path / "run")
