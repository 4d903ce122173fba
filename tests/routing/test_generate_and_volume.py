"""Recording during generate() with a KV cache, sequence / layer volume controls, dense models."""

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from moestab.models import build_embedded_policy
from moestab.routing import NotAnMoEModelError, RoutingRecorder, find_routers
from tests.support.routing import batch, make_model


def test_generate_routes_equal_teacher_forced_routes():
    model, tokenizer = build_embedded_policy()
    model.eval()
    enc = tokenizer(["12+34=", "5+6=", "100-7="], return_tensors="pt", padding=True)  # left-padded
    torch.manual_seed(0)
    with RoutingRecorder(model) as rec, torch.no_grad():
        out = model.generate(**enc, max_new_tokens=8, do_sample=True, min_new_tokens=8)
    generated = out.shape[1] - enc.input_ids.shape[1]
    gen_routes = rec.routes
    # The last sampled token is never fed to the model: routes cover sequences[:, :-1].
    assert gen_routes.indices.shape[:2] == (3, out.shape[1] - 1)
    assert len(rec.segments) == 1
    mask = torch.cat([enc.attention_mask, torch.ones(3, generated, dtype=torch.long)], dim=1)
    with RoutingRecorder(model) as tf, torch.no_grad():
        model(input_ids=out[:, :-1], attention_mask=mask[:, :-1])
    a = gen_routes.indices.sort(-1).values
    b = tf.routes.indices.sort(-1).values
    real = mask[:, :-1].bool()
    # KV-cached decoding and the full forward compute the same hidden states up to float rounding;
    # in float32 on this tiny model no router decision is within rounding of a tie, so all agree.
    mismatch = (a != b).any(-1)[real].float().mean().item()
    assert mismatch == 0.0, f"{mismatch:.2%} of router decisions differ between generate and teacher forcing"
    assert bool((a[~real] == -1).all())


def test_sequence_fraction_keeps_a_reproducible_subset():
    model = make_model("qwen3_moe")
    ids, mask = batch(batch_size=8, seq=6, padding="none")
    with RoutingRecorder(model) as full, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    runs = []
    for _ in range(2):
        with RoutingRecorder(model, sequence_fraction=0.5, seed=3) as part, torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
        runs.append(part.routes)
    rows = runs[0].rows
    assert rows.tolist() == runs[1].rows.tolist() and len(rows) == 4
    assert torch.equal(runs[0].indices, full.routes.indices[rows])


@pytest.mark.families("deepseek_v3")
def test_layer_subset_and_bad_layer():
    model = make_model("deepseek_v3")  # MoE layers are decoder layers 1 and 2 (layer 0 is dense)
    assert [s.layer for s in find_routers(model)] == [1, 2]
    ids, mask = batch()
    with RoutingRecorder(model, layers=[2]) as rec, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    assert rec.routes.layers == (2,) and rec.routes.indices.shape[2] == 1
    with pytest.raises(ValueError, match=r"layers \[0\] have no MoE router; MoE layers are \[1, 2\]"):
        RoutingRecorder(model, layers=[0])


def test_separate_forwards_concatenate_along_batch():
    model = make_model("mixtral")
    ids, mask = batch(batch_size=2, seq=5, padding="none")
    with RoutingRecorder(model) as rec, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
        model(input_ids=ids[:, :3], attention_mask=mask[:, :3])
    routes = rec.routes
    assert routes.indices.shape[:2] == (4, 5)
    assert bool((routes.indices[2:, 3:] == -1).all())
    assert torch.equal(routes.indices[2:, :3], routes.indices[:2, :3])  # causal: same prefix, same routes


def test_dense_model_gets_a_clear_error():
    dense = AutoModelForCausalLM.from_config(
        LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    )
    with pytest.raises(NotAnMoEModelError, match=r"supported families: qwen3_moe, qwen2_moe, olmoe, .*mixtral"):
        RoutingRecorder(dense)
