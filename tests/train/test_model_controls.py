"""Issue 26's controls: the dense embedded control, the fine-grained embedded variant, and --freeze-router."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from moestab.models import EmbeddedModelSpec, build_embedded_policy, parse_model_spec, tiny_config
from moestab.routing import router_parameters
from moestab.run_folder import RunFolder, schema
from moestab.train import train
from moestab.train.checkpoint import read_training_state
from tests.support.train import tiny_config as tiny_train_config

DEFAULT, DENSE, FINE = "embedded", "embedded:dense", "embedded:fine"


def test_named_variants_are_their_specs():
    assert parse_model_spec(DENSE, seed=2) == EmbeddedModelSpec(num_experts=1, top_k=1, expert_width=256, seed=2)
    assert parse_model_spec(FINE) == parse_model_spec("embedded:experts=64,top_k=8,ffn=32")
    # A variant takes further keys it does not set; one it sets is given twice.
    assert parse_model_spec("embedded:dense,layers=8") == EmbeddedModelSpec(num_layers=8, num_experts=1, top_k=1,
                                                                             expert_width=256)
    with pytest.raises(ValueError, match="parameter 'experts' is given twice"):
        parse_model_spec("embedded:dense,experts=4")
    assert parse_model_spec("embedded:ffn=64,family=olmoe").expert_width == 64
    with pytest.raises(ValueError, match="ffn is not supported for jamba; valid families: qwen3_moe"):
        parse_model_spec("embedded:ffn=64,family=jamba")
    with pytest.raises(ValueError, match="parameter 'dense' has no '='"):  # a shorthand of the embedded policy only
        parse_model_spec("other:dense")


def _used_per_token(spec: str) -> dict[str, int]:
    """Parameter elements one token's forward uses, measured: the elements whose gradient is nonzero after a backward
    from that token's logits, by part of the model. Expert weights are stored stacked per layer ([experts, ...]), so
    only the chosen experts' slices get a gradient. Router weights are reported by size (a softmax router's unchosen
    logits get no gradient under top-k renormalisation, but every logit is computed)."""
    model, _ = build_embedded_policy(parse_model_spec(spec))
    model(input_ids=torch.tensor([[5]])).logits.sum().backward()  # one token
    used = {"experts": 0, "router": 0, "rest": 0}
    for name, param in model.named_parameters():
        if ".mlp.experts." in name:
            used["experts"] += int((param.grad != 0).sum())
        elif ".mlp.gate." in name:
            used["router"] += param.numel()
        else:
            used["rest"] += param.numel()  # attention, norms, the tied embedding: every token uses all of them
    return used


def test_dense_and_fine_grained_use_the_defaults_active_parameters_per_token():
    default, dense, fine = (_used_per_token(s) for s in (DEFAULT, DENSE, FINE))
    # 4 layers x top_k x (gate, up, down: 3 x hidden 128 x width): 2 x 128, 1 x 256, 8 x 32 -> 3 x 128 x 256 each.
    assert default["experts"] == dense["experts"] == fine["experts"] == 4 * 3 * 128 * 256
    assert default["rest"] == dense["rest"] == fine["rest"]  # same depth, width, attention, vocabulary
    # Only the routers differ: 128 x experts logits' weights per layer (documented in moestab.models.spec).
    assert (default["router"], dense["router"], fine["router"]) == (4 * 128 * 8, 4 * 128 * 1, 4 * 128 * 64)


@pytest.mark.parametrize("family, expected", [("qwen3_moe", {"weight"}), ("deepseek_v3", {"weight"}),
                                               ("afmoe", {"expert_bias"})])
def test_router_parameters_are_the_gates_and_trained_biases_only(family, expected):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_config(family, hidden_size=32))
    names = {id(p): n for n, p in model.named_parameters()}
    found = [names[id(p)] for p in router_parameters(model)]
    assert found and not any(".experts." in n for n in found), (family, found)
    assert expected <= {n.rpartition(".")[2] for n in found}, (family, found)


def _weights(run, step: int) -> dict[str, torch.Tensor]:
    return load_file(run / schema.checkpoint_dir(step) / "model.safetensors")


@pytest.mark.slow
@pytest.mark.parametrize("freeze", [True, False])
def test_freeze_router_leaves_router_weights_bitwise_unchanged(tmp_path, freeze):
    run = tmp_path / "run"
    train(tiny_train_config(run, tmp_path / "cache", steps=1, freeze_router=freeze, model="embedded:hidden=32"),
          log=lambda s: None)
    before, after = _weights(run, 0), _weights(run, 1)
    gates = [k for k in before if k.endswith(".mlp.gate.weight")]
    assert len(gates) == 4
    for layer in range(4):  # each layer's experts trained either way (saved one tensor per expert: some got no token)
        experts = [k for k in before if k.startswith(f"model.layers.{layer}.mlp.experts.")]
        assert experts and any(not torch.equal(before[k], after[k]) for k in experts)
    assert all(torch.equal(before[k], after[k]) for k in gates) is freeze
    info = json.loads((run / schema.RUN_JSON).read_text())
    assert info["config"]["freeze_router"] is freeze
    optimizer, _ = read_training_state(RunFolder(run), 1)
    model, _ = build_embedded_policy(parse_model_spec("embedded:hidden=32"))
    trained = len(list(model.parameters())) - (len(gates) if freeze else 0)
    assert len(optimizer["param_groups"][0]["params"]) == trained  # frozen routers: no AdamW state, no decay


@pytest.mark.slow
@pytest.mark.parametrize("replay", ["off", "rollout-gates"])
def test_the_dense_control_trains_records_and_never_changes_a_route(tmp_path, replay):
    run = tmp_path / "run"
    train(tiny_train_config(run, tmp_path / "cache", steps=1, model=DENSE, routing_replay=replay), log=lambda s: None)
    info = json.loads((run / schema.RUN_JSON).read_text())
    assert info["status"] == "finished" and (info["model"]["num_experts"], info["model"]["top_k"]) == (1, 1)
    metrics = [json.loads(line) for line in (run / schema.METRICS_JSONL).read_text().splitlines()]
    changed = [m["routing/old_new/changed"] for m in metrics if "routing/old_new/changed" in m]
    assert changed and all(c == 0 for c in changed)  # one expert: no routing to change
