"""moestab.analysis.router_stats against a loop over tokens, and the routers probe on families' own folders."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from moestab.analysis.router_stats import COLUMNS, router_statistics
from moestab.probes.collect import collect
from moestab.probes.suites import load_suite
from tests.support.probes import FAMILIES, probe, save_family


def _by_loop(routes, margin, entropy, experts, layer):
    """The layer's row by its definition, one token at a time."""
    counts = [0] * experts
    for token in routes[:, layer]:
        for e in token:
            counts[int(e)] += 1
    mean = sum(counts) / experts
    share = [c / sum(counts) for c in counts]
    ordered = sorted(float(m) for m in margin[:, layer])
    return {"max_vio": (max(counts) - mean) / mean, "dead_experts": counts.count(0),
            "experts_under_1pct": sum(s < 0.01 for s in share),
            "entropy_norm_mean": sum(float(h) for h in entropy[:, layer]) / len(entropy) / math.log(experts),
            "margin_p50": (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2]) / 2}


def test_each_column_is_its_definition():
    rng = np.random.default_rng(0)
    tokens, layers, experts = 400, 3, 8
    # A skewed load: expert 0 in most decisions, expert 7 never, expert 6 in 2 of 800 slots (under 1%).
    first = np.where(rng.random((tokens, layers)) < 0.7, 0, rng.integers(1, 6, (tokens, layers)))
    second = rng.integers(1, 6, (tokens, layers))
    second = np.where(second == first, 5 - (first == 5), second)  # two distinct experts per decision
    routes = np.stack([first, second], axis=-1).astype(np.int16)  # [tokens, layers, 2]
    routes[:2, :, 1] = 6
    margin = rng.random((tokens, layers)).astype(np.float32) * 3
    entropy = rng.random((tokens, layers)).astype(np.float32) * math.log(experts)
    table = router_statistics(routes, margin, entropy, experts, layers=[2, 5, 9])
    assert tuple(table.columns) == COLUMNS and table.layer.tolist() == [2, 5, 9]
    for i in range(layers):
        expected = _by_loop(routes, margin, entropy, experts, i)
        row = table.iloc[i]
        assert row.tokens == tokens
        for key, value in expected.items():
            assert row[key] == pytest.approx(value, rel=1e-6), key
    assert (table.dead_experts == 1).all() and (table.experts_under_1pct == 2).all()


def test_uniform_routing_has_no_violation_and_unrecorded_tokens_are_left_out():
    routes = np.array([[[0, 1]], [[2, 3]], [[-1, -1]]], np.int16)  # [3 tokens, 1 layer, 2]: the last not recorded
    margin = np.array([[0.5], [1.5], [np.nan]])
    entropy = np.array([[math.log(4)], [0.0], [np.nan]])
    row = router_statistics(routes, margin, entropy, 4).iloc[0]
    assert row.tokens == 2 and row.max_vio == 0 and row.dead_experts == 0
    assert row.margin_p50 == 1.0 and row.entropy_norm_mean == 0.5


def test_shapes_and_a_one_expert_layer_are_refused():
    routes = np.zeros((3, 2, 1), np.int16)
    with pytest.raises(ValueError, match=r"margin, entropy \[tokens, layers\]"):
        router_statistics(routes, np.zeros((3, 1)), np.zeros((3, 2)), 4)
    with pytest.raises(ValueError, match="at least 2 experts"):
        router_statistics(routes, np.zeros((3, 2)), np.zeros((3, 2)), 1)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_routers_probe_reads_the_routers_own_entropy(tmp_path, family):
    """On each family's own folder: the recorded entropy is that of the router's softmax over its logits, and the
    table's load columns are those of the recorded routes."""
    path = save_family(tmp_path / "m", family)
    table = probe("routers", [path]).tables["routers"]
    assert table.checkpoint.nunique() == 1 and len(table) >= 2
    assert table.entropy_norm_mean.between(0, 1).all() and table.max_vio.ge(0).all()
    from moestab.probes.checkpoints import load_checkpoint, resolve_checkpoints

    model, tokenizer = load_checkpoint(resolve_checkpoints([path])[0])
    record = collect(model, tokenizer, load_suite("general", 12).texts)
    again = router_statistics(record.routes, record.margin, record.entropy, record.num_experts, record.layers)
    np.testing.assert_allclose(table.drop(columns="checkpoint").to_numpy(float), again.to_numpy(float))
    # The routers' logits of the first text, by transformers' own output_router_logits.
    ids = torch.tensor([tokenizer.encode(load_suite("general", 12).texts[0], add_special_tokens=False)])
    with torch.no_grad():
        out = model(input_ids=ids, output_router_logits=True)
    logits = torch.stack([r.reshape(-1, r.shape[-1]).float() for r in out.router_logits])  # [layers, seq, E]
    assert logits.shape[0] == record.entropy.shape[1]  # every layer of these tiny configs routes
    probs = logits.softmax(-1)
    theirs = -(probs * probs.clamp_min(1e-30).log()).sum(-1).T  # [seq, layers]
    np.testing.assert_allclose(record.entropy[: ids.shape[1]], theirs.numpy(), rtol=1e-4, atol=1e-5)
