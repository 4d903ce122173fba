"""The TRL integration's collapse watch (issue 57): ``RecordSettings(on_collapse_warning=...)`` adds the
``collapse/*`` keys, reads TRL's logged reward, and under ``stop`` asks the Trainer to save and stop; run.json ends
``interrupted`` with the warning."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

pytest.importorskip("trl")

from datasets import Dataset

from moestab.integrations.trl import MoestabGRPOTrainer, RecordSettings
from moestab.integrations.trl import trainer as trl_trainer
from moestab.metrics import keys
from moestab.metrics.collapse_warning import DEFAULT_RULE, WarningRule
from moestab.models import EmbeddedModelSpec, build_embedded_policy
from moestab.recording.collapse_watch import CollapseMonitor
from moestab.run_folder.reader import load_metrics, read_run_info
from tests.support.trl import LAYERS, PROMPTS, grpo_args, reward

REWARD_ONLY = WarningRule(signals=("reward",), weights=(0.0,), intercept=1.0, threshold=0.0, baseline_steps=2,
                          name="fires once reward has 2 values")


def test_stop_saves_a_checkpoint_and_ends_the_run_interrupted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(trl_trainer, "CollapseMonitor", partial(CollapseMonitor, rule=REWARD_ONLY))
    model, tokenizer = build_embedded_policy(EmbeddedModelSpec(num_layers=LAYERS, hidden_size=64))
    trainer = MoestabGRPOTrainer(
        model=model, processing_class=tokenizer, reward_funcs=reward,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}), args=grpo_args(tmp_path / "trl"),
        moestab=RecordSettings(tmp_path / "run", on_collapse_warning="stop"),
    )
    trainer.train()
    # 3 generation cycles of 2 optimizer steps; reward (TRL's log) has its 2 values at the end of cycle 2
    assert trainer.state.global_step == 4
    assert (tmp_path / "trl" / "checkpoint-4").is_dir()
    info = read_run_info(tmp_path / "run")
    assert info.status == "interrupted" and "collapse warning at step 2" in info.error
    assert any(w.startswith("collapse warning at step 2") for w in info.warnings)
    m = load_metrics(tmp_path / "run").set_index(keys.STEP)
    assert m.loc[2, keys.COLLAPSE_WARNING] == 1 and m.loc[2, "collapse/warning_on/reward"] == 1
    # The shipped rule under TRL: every signal but the updates' KL is there (TRL's records hold no update metrics), so
    # it never fires; the watch says so once (docs/collapse.md, docs/integrations.md).
    there = set(m.columns) | set(trl_trainer.TRL_SIGNALS.values())
    assert set(DEFAULT_RULE.keys) - there == {keys.LOSS_KL_OLD_NEW_K3}


def test_a_bad_policy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="on_collapse_warning must be one of"):
        RecordSettings(tmp_path / "run", on_collapse_warning="pause")
