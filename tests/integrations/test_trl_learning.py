"""README's "A model that learns" with the TRL integration: the warm-started base and the task's reward give
nonzero advantages and no warning, where an untrained model gets the "every advantage is 0" warning at its first
step (issue 54.5)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")

from moestab.metrics import keys
from moestab.models import EmbeddedModelSpec, build_embedded_policy
from moestab.run_folder import schema
from moestab.run_folder.run_info import read_run_info
from tests.support.trl import readme_blocks, run_snippet

NOTHING = "every advantage is 0"


def _learning_block() -> str:
    return next(block for block in readme_blocks() if "warm_started_base" in block)


@pytest.mark.slow
def test_the_readmes_warm_started_model_learns_and_an_untrained_one_is_warned_about(tmp_path, monkeypatch):
    monkeypatch.setenv("MOESTAB_CACHE", str(tmp_path / "cache"))
    env: dict = {}
    exec(_learning_block(), env)  # README's block as written: the warm start (cached here), the data, the reward
    trainer = run_snippet(tmp_path / "warm", env["model"], env["tokenizer"], reward_funcs=env["reward"],
                          dataset=env["dataset"], max_completion_length=4, temperature=1.0, learning_rate=1e-4,
                          epsilon=0.2)  # a step size that keeps the base answering (the tests' 1e-2 wrecks it)
    run = tmp_path / "warm" / "run"
    lines = [json.loads(x) for x in (run / schema.METRICS_JSONL).read_text().splitlines()]
    assert max(line[keys.ADVANTAGE_NONZERO] for line in lines) > 0
    assert not any(NOTHING in w for w in read_run_info(run).warnings)
    assert trainer.state.global_step > 0

    untrained, tokenizer = build_embedded_policy(EmbeddedModelSpec())
    run_snippet(tmp_path / "cold", untrained, tokenizer, reward_funcs=env["reward"], dataset=env["dataset"],
                max_completion_length=4)
    warnings = [w for w in read_run_info(tmp_path / "cold" / "run").warnings if NOTHING in w]
    assert len(warnings) == 1 and warnings[0].startswith("step 1:")
