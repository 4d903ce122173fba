"""`moestab train --model DIR --routing-replay rollout` on saved checkpoints of families beyond the core six: one
per routing recipe / model kind (the per-router tests in tests/routing/test_all_families.py cover all 44)."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from moestab.cli import main
from moestab.models import build_char_tokenizer
from moestab.models.families import tiny_config
from tests.support.train import TASK

# One family per recipe: hybrid linear attention (softmax, renorm); Mamba hybrid (softmax); softmax over the top-k;
# DeepSeek-V3 recipe with a dense first layer; bias as a forward argument on [batch, seq, hidden] input; sigmoid of
# the chosen logits with a bias-on-logits selection; Llama-4's own output contract; softmax + bias selection with a
# floored renormalisation; DeepSeek-V2's group-limited greedy; a gating chosen by a config attribute; conv hybrid.
FAMILIES = ["qwen3_next", "jamba", "granitemoe", "glm4_moe", "afmoe", "kolibri1", "llama4_text", "ernie4_5_moe",
            "deepseek_v2", "cohere2_moe", "lfm2_moe"]


def save_checkpoint(path, family: str) -> str:
    torch.manual_seed(0)
    tokenizer = build_char_tokenizer()
    config = tiny_config(family, vocab_size=len(tokenizer), hidden_size=64, num_moe_layers=2, num_experts=8, top_k=2)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def train_args(model: str, out, replay: str) -> list[str]:
    return ["train", "--model", model, "--task", TASK, "--routing-replay", replay, "--steps", "2",
            "--prompts-per-step", "4", "--group-size", "4", "--minibatches", "2", "--eval-size", "8",
            "--threads", "1", "--out", str(out)]


@pytest.mark.parametrize("family", FAMILIES)
def test_train_with_rollout_replay_on_a_saved_checkpoint(tmp_path, family, capsys):
    model = save_checkpoint(tmp_path / "model", family)
    assert main(train_args(model, tmp_path / "run", "rollout")) == 0, capsys.readouterr().err
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["status"] == "finished" and info["last_step"] == 2
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # R3: pi_old is computed on the rollout's routes, so no router of the ratio's pi_old differs from the rollout.
    assert all(m["routing/rollout_old/router_flip"] == 0.0 for m in metrics)


@pytest.mark.families("phimoe")
def test_phimoe_with_replay_is_refused_before_anything_is_written(tmp_path, capsys):
    model = save_checkpoint(tmp_path / "model", "phimoe")
    assert main(train_args(model, tmp_path / "run", "rollout")) == 2
    err = capsys.readouterr().err
    assert "routing_replay: 'rollout' cannot be exact for phimoe: PhiMoE's SparseMixer samples experts" in err
    assert "use --routing-replay off" in err
    assert not (tmp_path / "run" / "run.json").exists()
