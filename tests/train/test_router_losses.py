"""moestab.train.router_losses against transformers' own load-balancing loss and a loop over tokens."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from moestab.train.router_losses import load_balancing_loss, router_z_loss


def _logits(layers: int = 3, tokens: int = 50, experts: int = 8, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(layers, tokens, experts, generator=generator, dtype=torch.float64) * 2  # [layers, n, E]


@pytest.mark.parametrize("top_k", [1, 2, 8])
def test_one_layer_is_transformers_loss_over_top_k(top_k):
    logits = _logits(layers=1)
    mask = torch.rand(50, generator=torch.Generator().manual_seed(1)) > 0.3  # [n]
    theirs = load_balancing_loss_func((logits[0].float(),), num_experts=8, top_k=top_k,
                                      attention_mask=mask[None].long())
    assert load_balancing_loss(logits.float(), top_k, mask).item() == pytest.approx(theirs.item() / top_k, rel=1e-6)


def test_layers_are_balanced_one_by_one_then_averaged():
    """Per layer, from the definition: E * sum_e (slots that chose e / slots) * mean prob of e, by a loop."""
    logits, top_k = _logits(), 2
    expected = []
    for layer in logits:  # [n, E]
        probs = layer.softmax(-1)
        counts = [0] * 8
        for row in probs:
            for e in row.topk(top_k).indices.tolist():
                counts[e] += 1
        expected.append(8 * sum(counts[e] / (len(layer) * top_k) * probs[:, e].mean().item() for e in range(8)))
    assert load_balancing_loss(logits, top_k).item() == pytest.approx(sum(expected) / 3, rel=1e-12)


def test_one_layers_imbalance_is_not_offset_by_anothers():
    """transformers pools every layer's tokens: two layers that each send everything to one expert, a different
    one, look half-balanced to it. Per layer, both are as unbalanced as one layer alone."""
    busy = torch.full((2, 40, 4), -5.0, dtype=torch.float64)
    busy[0, :, 0] = busy[1, :, 1] = 5.0  # layer 0 always expert 0, layer 1 always expert 1 (top-1)
    ours = load_balancing_loss(busy, 1).item()
    single = load_balancing_loss(busy[:1], 1).item()
    pooled = load_balancing_loss_func(tuple(busy.float()), num_experts=4, top_k=1).item()
    assert ours == pytest.approx(single) and ours > 3.9  # ~E = 4: all load and nearly all probability on one expert
    assert pooled < ours * 0.6


def test_uniform_routing_gives_one_and_the_gradient_leaves_busy_experts():
    flat = torch.zeros(2, 10, 8, dtype=torch.float64)
    flat[..., :2] += 1e-9  # ties broken: every token chooses experts 0 and 1
    assert load_balancing_loss(torch.zeros(1, 8, 8, dtype=torch.float64) + torch.eye(8)[None] * 1e-9, 1).item() == \
        pytest.approx(1.0, abs=1e-8)  # token t chooses expert t: uniform load, uniform probability
    logits = flat.clone().requires_grad_()
    load_balancing_loss(logits, 2).backward()
    grad = logits.grad.sum(dim=(0, 1))  # [E]
    assert (grad[:2] > 0).all() and (grad[2:] < 0).all()  # descent lowers the chosen experts' logits


def test_padding_is_left_out():
    logits = _logits()
    mask = torch.arange(50) < 30
    assert load_balancing_loss(logits, 2, mask).item() == pytest.approx(load_balancing_loss(logits[:, :30], 2).item())
    assert router_z_loss(logits, mask).item() == pytest.approx(router_z_loss(logits[:, :30]).item())


def test_z_loss_is_the_squared_log_partition_function():
    logits = _logits()
    expected = sum(math.log(sum(math.exp(x) for x in row.tolist())) ** 2 for layer in logits for row in layer)
    assert router_z_loss(logits).item() == pytest.approx(expected / (3 * 50), rel=1e-12)


def test_shapes_are_checked():
    with pytest.raises(ValueError, match=r"router_logits must be \[layers, tokens, experts\]"):
        load_balancing_loss(torch.zeros(4, 8), 2)
    with pytest.raises(ValueError, match=r"mask must be \[tokens\] = \[50\]"):
        router_z_loss(_logits(), torch.ones(49, dtype=torch.bool))
    with pytest.raises(ValueError, match="top_k must be 1 to 8"):
        load_balancing_loss(_logits(), 9)
