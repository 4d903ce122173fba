"""Every algorithm x replay mode trains a few steps and leaves a complete, valid run folder."""

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from moestab.rl import PRESETS
from moestab.run_folder import schema
from moestab.run_folder.reader import read_routes
from moestab.train import train
from tests.support.tables import TOKEN_COLUMNS, token_frame
from tests.support.train import tiny_config

REQUIRED_METRICS = [
    "step", "reward/mean", "accuracy", "response/length_mean", "minibatches", "loss", "grad_norm", "entropy",
    "clip/token_frac", "clip/token_frac_later", "clip/seq_frac", "clip/seq_frac_later", "ratio/token_max",
    "ratio/token_log_var", "ratio/seq_log_var", "loss/kl/old_new_k3",
    "routing/old_new/changed", "routing/old_new/changed_by_layer", "routing/rollout_old/router_flip",
    "routing/rollout_old_free/router_flip", "routing/update_old/changed_by_minibatch",
    "mismatch/rollout_old/k3", "mismatch/rollout_old_free/k3", "experts/load", "experts/load_entropy",
    "eval/accuracy",
]


def check_run(run_dir, steps: int, algo: str, replay: str) -> None:
    info = json.loads((run_dir / schema.RUN_JSON).read_text())
    assert info["schema_version"] == schema.SCHEMA_VERSION
    assert info["status"] == "finished" and info["last_step"] == steps
    assert info["config"]["algo"] == algo and info["config"]["routing_replay"] == replay
    model = info["model"]
    assert model["family"] == "qwen3_moe" and model["num_layers"] == 4 and model["top_k"] == 2
    lines = [json.loads(line) for line in (run_dir / schema.METRICS_JSONL).read_text().splitlines()]
    assert [m["step"] for m in lines] == list(range(1, steps + 1))
    for m in lines:
        missing = [k for k in REQUIRED_METRICS if k not in m]
        assert not missing, missing
        assert len(m["routing/old_new/changed_by_layer"]) == 4
        assert np.allclose([sum(row) for row in m["experts/load"]], 1.0, atol=1e-4)
        assert 0.0 <= m["routing/old_new/changed"] <= 1.0
    for step in range(1, steps + 1):
        table = pq.read_table(run_dir / schema.tokens_file(step))
        assert table.column_names == TOKEN_COLUMNS
        assert table.num_rows > 0
        routes = read_routes(run_dir / schema.tokens_file(step), schema.COL_ROUTES_OLD, top_k=2)  # [tokens, 4, 2]
        assert routes.shape[1:] == (4, 2)
        assert routes.min() >= 0 and routes.max() < 8  # every recorded response token is routed
        assert (run_dir / schema.checkpoint_dir(step) / "model.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("replay", schema.REPLAY_MODES)
@pytest.mark.parametrize("algo", sorted(PRESETS))
def test_every_algo_and_replay_mode_writes_valid_records(tmp_path, cache_dir, algo, replay):
    config = tiny_config(tmp_path / "run", cache_dir, algo=algo, routing_replay=replay)
    result = train(config, log=lambda s: None)
    assert result.status == "finished"
    check_run(tmp_path / "run", 2, algo, replay)


def test_default_algo_run_writes_valid_records(tmp_path, cache_dir):
    result = train(tiny_config(tmp_path / "run", cache_dir), log=lambda s: None)
    check_run(result.run_dir, 2, "gspo", "off")


def test_checkpoint_loads_with_transformers_alone(tmp_path, cache_dir):
    train(tiny_config(tmp_path / "run", cache_dir, steps=1), log=lambda s: None)
    ckpt = tmp_path / "run" / schema.checkpoint_dir(1)
    code = (
        "import sys, transformers\n"
        f"m = transformers.AutoModelForCausalLM.from_pretrained({str(ckpt)!r})\n"
        f"t = transformers.AutoTokenizer.from_pretrained({str(ckpt)!r})\n"
        "ids = t('12+3=', return_tensors='pt').input_ids\n"
        "print(m(input_ids=ids).logits.shape[-1] == len(t), 'moestab' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[-2:] == ["True", "False"]


@pytest.mark.parametrize("replay", ["off", "old", "rollout", "rollout-gates"])
def test_first_minibatch_ratios_are_exactly_one(tmp_path, cache_dir, replay):
    train(tiny_config(tmp_path / "run", cache_dir, steps=1, routing_replay=replay), log=lambda s: None)
    table = token_frame(tmp_path / "run" / schema.tokens_file(1))
    first = table[table.minibatch == 0]
    assert len(first) and (first.log_w == 0.0).all()  # pi_theta == pi_old before the first update
    assert (table[table.minibatch == 1].log_w != 0.0).any()  # ... and not after it
    if replay == "old":  # R2: the first update replays exactly the old routes
        assert np.array_equal(np.stack(first.routes_update), np.stack(first.routes_old))
    if replay == "rollout-gates":  # TRR: pi_old and the updates replay the rollout's routes (and gates)
        assert np.array_equal(np.stack(table.routes_update), np.stack(table.routes_rollout))
        assert np.array_equal(np.stack(table.routes_old), np.stack(table.routes_rollout))


def test_volume_controls_thin_the_tables_but_not_the_step_aggregates(tmp_path, cache_dir):
    full = tmp_path / "full"
    thin = tmp_path / "thin"
    train(tiny_config(full, cache_dir, steps=1), log=lambda s: None)
    train(tiny_config(thin, cache_dir, steps=1, record_fraction=0.5, record_layers="1,3"), log=lambda s: None)
    info = json.loads((thin / schema.RUN_JSON).read_text())
    assert info["model"]["recorded_layers"] == [1, 3]
    full_t = token_frame(full / schema.tokens_file(1))
    thin_t = token_frame(thin / schema.tokens_file(1))
    assert thin_t.seq.nunique() == full_t.seq.nunique() // 2  # 16 sequences -> 8
    # same seed, same rollout: the kept rows are the full table's rows of those sequences
    kept = full_t[full_t.seq.isin(set(thin_t.seq))].reset_index(drop=True)
    assert np.array_equal(kept.log_w.to_numpy(), thin_t.log_w.to_numpy())
    full_routes = np.stack(kept.routes_old).reshape(-1, 4, 2)
    assert np.array_equal(np.stack(thin_t.routes_old).reshape(-1, 2, 2), full_routes[:, [1, 3]])
    # step aggregates use every token whatever the volume controls
    metrics = [json.loads((d / schema.METRICS_JSONL).read_text().splitlines()[0]) for d in (full, thin)]
    for key in ("routing/old_new/changed", "clip/token_frac", "ratio/token_log_var", "mismatch/rollout_old/k3"):
        assert metrics[0][key] == metrics[1][key], key


def test_bfloat16_run_writes_valid_records(tmp_path, cache_dir):
    result = train(tiny_config(tmp_path / "run", cache_dir, dtype="bfloat16"), log=lambda s: None)
    check_run(result.run_dir, 2, "gspo", "off")
    config = json.loads((result.run_dir / schema.checkpoint_dir(2) / "config.json").read_text())
    assert config["dtype"] == "bfloat16"


@pytest.mark.parametrize("family", ["olmoe", "deepseek_v3"])
def test_training_a_local_checkpoint_of_another_family(tmp_path, family):
    from transformers import AutoModelForCausalLM

    from moestab.models import build_char_tokenizer, save_policy, tiny_config

    tokenizer = build_char_tokenizer()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(family, vocab_size=len(tokenizer), num_moe_layers=2))
    save_policy(model, tokenizer, tmp_path / "base")
    result = train(
        tiny_config_for(tmp_path, model=str(tmp_path / "base"), routing_replay="old", steps=1), log=lambda s: None
    )
    info = json.loads((result.run_dir / schema.RUN_JSON).read_text())
    assert result.status == "finished" and info["model"]["family"] == family
    table = token_frame(result.run_dir / schema.tokens_file(1))
    first = table[table.minibatch == 0]
    assert (first.log_w == 0.0).all()  # R2 on this family too: exact ratio 1 before the first update
    assert np.array_equal(np.stack(first.routes_update), np.stack(first.routes_old))


def tiny_config_for(tmp_path, **overrides):
    return tiny_config(tmp_path / "run", tmp_path / "cache", **overrides)
