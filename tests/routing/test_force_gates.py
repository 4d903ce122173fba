"""Recorded gate weights and replay with ``force_gates`` ("Total Router Recall"), every family (float64, CPU).

The recorder stores the combine weights each router handed its experts (``Routes.gates``, float32); replay
with ``force_gates`` returns them as given, so the forward is the recorded one and the router is frozen.
Checked against a per-token reimplementation of every family's gate math, on a hand-worked toy, and by
perturbing the routers: the forced forward must not move, the index-only one must.
"""

import math
from dataclasses import replace

import pytest
import torch
from torch import nn
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from moestab.models.families import CORE_FAMILIES
from moestab.routing import Routes, RoutesMismatchError, RoutingRecorder, RoutingReplay, find_routers
from tests.support.routing import batch, make_model

# Every family computes its gates in float32 (or in the model's dtype) and float32 holds them exactly,
# except GPT-OSS in a float64 model: its softmax runs in float64, and float32 rounds each gate by up to
# 2^-24 relative, which moves the logits by ~1e-7 here.
REPLAY_TOLERANCE = {family: 1e-10 for family in CORE_FAMILIES} | {"gpt_oss": 1e-6}


def reference_gates(family: str, router: nn.Module, logits: list[float], chosen: list[int]) -> list[float]:
    """A second, per-token implementation of each family's combine weights, in plain Python floats."""
    if family == "gpt_oss":  # softmax over the chosen experts' logits only
        z = [math.exp(logits[e]) for e in chosen]
        return [v / sum(z) for v in z]
    if family == "deepseek_v3":  # sigmoid without the selection bias, renormalised, then scaled
        g = [1 / (1 + math.exp(-logits[e])) for e in chosen]
        if router.norm_topk_prob:
            total = sum(g) + 1e-20
            g = [v / total for v in g]
        return [v * router.routed_scaling_factor for v in g]
    # softmax over all experts, gathered; Mixtral always renormalises, Qwen / OLMoE when norm_topk_prob
    top = max(logits)
    z = [math.exp(v - top) for v in logits]
    g = [z[e] / sum(z) for e in chosen]
    if family == "mixtral" or router.norm_topk_prob:
        g = [v / sum(g) for v in g]
    return g


def record(model, ids, mask, **recorder_args):
    """``(routes, logits, own)``: recorded routes with gates, the model's logits, and by plain hooks each
    router's own ``(logits [N, E], gates [N, k], indices [N, k])``."""
    own = {}
    handles = [
        s.module.register_forward_hook(
            lambda m, a, o, name=s.name: own.__setitem__(name, (o[0].detach(), o[1].detach(), o[2]))
        )
        for s in find_routers(model)
    ]
    try:
        with RoutingRecorder(model, gates=True, **recorder_args) as rec, torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits  # [batch, seq, vocab]
    finally:
        for h in handles:
            h.remove()
    return rec.routes, logits, own


def replayed_logits(model, ids, mask, routes, *, force_gates: bool) -> torch.Tensor:
    with RoutingReplay(model, routes, force_gates=force_gates), torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits  # [batch, seq, vocab]


@pytest.mark.parametrize("padding", ["left", "right"])
def test_recorded_gates_are_the_routers_own_weights(family, model, padding):
    ids, mask = batch(padding=padding)
    routes, _, own = record(model, ids, mask)
    real = mask.bool()  # [batch, seq]
    flat = real.flatten()  # [batch*seq]
    assert routes.gates.dtype == torch.float32 and routes.gates.shape == routes.indices.shape
    for j, site in enumerate(find_routers(model)):
        logits, gates, chosen = own[site.name]  # [N, E], [N, k], [N, k]
        got = routes.gates[:, :, j][real]  # [n, k]
        # what the router returned, slot for slot (float32 holds it, or rounds GPT-OSS's float64)
        assert torch.equal(got, gates[flat].float()), site.name
        assert torch.equal(routes.indices[:, :, j][real].long(), chosen[flat])
        expected = [
            reference_gates(family, site.module, row.tolist(), idx.tolist())
            for row, idx in zip(logits[flat], chosen[flat], strict=True)
        ]
        torch.testing.assert_close(got.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-7)
    assert bool(routes.gates[~real].isnan().all())  # no gate at padding


def test_force_gates_replay_reproduces_the_recorded_forward(family, model):
    ids, mask = batch()
    routes, recorded, _ = record(model, ids, mask)
    forced = replayed_logits(model, ids, mask, routes, force_gates=True)
    real = mask.bool()
    assert (forced - recorded)[real].abs().max() <= REPLAY_TOLERANCE[family]


@pytest.mark.parametrize("family", sorted(CORE_FAMILIES))
def test_force_gates_replay_is_bit_for_bit_in_float32(family):
    # In float32 every family's gates are float32 values: replaying them gives the very same forward.
    model = make_model(family, dtype=torch.float32)
    ids, mask = batch()
    routes, recorded, _ = record(model, ids, mask)
    assert torch.equal(replayed_logits(model, ids, mask, routes, force_gates=True), recorded)


def test_force_gates_ignores_moved_router_weights_and_index_replay_does_not(family, model):
    ids, mask = batch()
    real = mask.bool()
    routes, recorded, _ = record(model, ids, mask)
    before = replayed_logits(model, ids, mask, routes, force_gates=True)
    torch.manual_seed(1)
    with torch.no_grad():
        for site in find_routers(model):
            site.module.weight.add_(torch.randn_like(site.module.weight) * 2.0)
    moved, _, _ = record(model, ids, mask)
    assert bool((moved.indices.sort(-1).values != routes.indices.sort(-1).values)[real].any())  # routers moved
    after = replayed_logits(model, ids, mask, routes, force_gates=True)
    assert torch.equal(after, before)  # router weights no longer enter the forward
    assert (after - recorded)[real].abs().max() <= REPLAY_TOLERANCE[family]
    index_only = replayed_logits(model, ids, mask, routes, force_gates=False)
    assert (index_only - recorded)[real].abs().max() > 1e-3  # gates recomputed from the moved routers


def test_router_gets_no_gradient_under_force_gates(family, model):
    ids, mask = batch()
    real = mask.bool()
    routes, _, _ = record(model, ids, mask)
    sites = find_routers(model)
    aux = hasattr(model.config, "router_aux_loss_coef")  # DeepSeek-V3 balances with a bias, no aux loss

    def backward(force_gates: bool) -> None:
        model.zero_grad(set_to_none=True)
        with RoutingReplay(model, routes, force_gates=force_gates):
            out = model(input_ids=ids, attention_mask=mask, **({"output_router_logits": True} if aux else {}))
        loss = out.logits[real].logsumexp(-1).sum()
        if aux:  # not even the load-balancing loss reaches a frozen router
            loss = loss + out.aux_loss
        loss.backward()

    backward(force_gates=True)
    for site in sites:
        for name, p in site.module.named_parameters():
            assert p.grad is None, f"{site.name}.{name}"
    experts = [p for n, p in model.named_parameters() if ".experts." in n]
    assert experts and all(p.grad is not None and p.grad.abs().sum() > 0 for p in experts)  # backward did run
    backward(force_gates=False)
    for site in sites:
        assert site.module.weight.grad is not None and site.module.weight.grad.abs().sum() > 0, site.name


class Toy(nn.Module):
    """Embedding (token 0 -> [1, 0], token 1 -> [0, 1]) into one Qwen3-MoE block: 3 experts, top-2,
    renormalised. With ReLU and gate = up = [1, 0], expert e maps token 0 to its down-projection column d_e."""

    def __init__(self) -> None:
        super().__init__()
        config = Qwen3MoeConfig(hidden_size=2, moe_intermediate_size=1, num_experts=3, num_experts_per_tok=2,
                                norm_topk_prob=True, hidden_act="relu", experts_implementation="eager")
        self.embed = nn.Embedding(2, 2)
        self.layers = nn.ModuleList([Qwen3MoeSparseMoeBlock(config)])  # "layers.0.gate": MoE layer 0
        self.double()
        with torch.no_grad():
            self.embed.weight.copy_(torch.eye(2))
            # token 0's router logits: [ln 4, ln 2, 0] -> softmax [4/7, 2/7, 1/7]
            self.layers[0].gate.weight.copy_(torch.tensor([[math.log(4), 0.0], [math.log(2), 0.0], [0.0, 1.0]]))
            self.layers[0].experts.gate_up_proj.copy_(torch.tensor([[[1.0, 0.0], [1.0, 0.0]]] * 3))
            # d_0 = [1, 0], d_1 = [0, 1], d_2 = [10, 10]
            self.layers[0].experts.down_proj.copy_(torch.tensor([[[1.0], [0.0]], [[0.0], [1.0]], [[10.0], [10.0]]]))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.layers[0](self.embed(input_ids))  # [batch, seq, 2]


def test_hand_worked_toy():
    toy = Toy()
    ids = torch.tensor([[0]])
    with RoutingRecorder(toy, gates=True) as rec, torch.no_grad():
        free = toy(input_ids=ids)
    # Own choice: experts 0, 1 with (4/7, 2/7) / (6/7) = (2/3, 1/3) -> 2/3 d_0 + 1/3 d_1 = [2/3, 1/3].
    assert rec.routes.indices.tolist() == [[[[0, 1]]]]
    torch.testing.assert_close(rec.routes.gates, torch.tensor([[[[2 / 3, 1 / 3]]]]), rtol=0, atol=1e-7)
    torch.testing.assert_close(free, torch.tensor([[[2 / 3, 1 / 3]]], dtype=torch.float64), rtol=0, atol=1e-7)
    forced = Routes(indices=torch.tensor([[[[2, 0]]]], dtype=torch.int16), layers=(0,), num_experts=3,
                    gates=torch.tensor([[[[0.25, 0.75]]]]))
    # Index-only replay of experts (2, 0): gates from the live router, (1/7, 4/7) / (5/7) = (1/5, 4/5)
    # -> 1/5 [10, 10] + 4/5 [1, 0] = [2.8, 2].
    with RoutingReplay(toy, forced), torch.no_grad():
        index_only = toy(input_ids=ids)
    torch.testing.assert_close(index_only, torch.tensor([[[2.8, 2.0]]], dtype=torch.float64), rtol=0, atol=1e-7)
    # force_gates: the recorded (1/4, 3/4) as given -> 1/4 [10, 10] + 3/4 [1, 0] = [3.25, 2.5], exactly.
    with RoutingReplay(toy, forced, force_gates=True), torch.no_grad():
        trr = toy(input_ids=ids)
    assert trr.tolist() == [[[3.25, 2.5]]]


def test_gates_survive_generate_with_kv_cache(family, model):
    ids, mask = batch(padding="left", seq=8)
    with RoutingRecorder(model, gates=True) as rec, torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, min_new_tokens=5,
                             do_sample=False, use_cache=True)
    full_mask = torch.cat([mask, torch.ones(mask.shape[0], out.shape[1] - ids.shape[1], dtype=mask.dtype)], dim=1)
    teacher, _, _ = record(model, out[:, :-1], full_mask[:, :-1])
    real = full_mask[:, :-1].bool()  # [batch, seq]
    generated = rec.routes
    assert generated.gates.shape == teacher.gates.shape
    assert torch.equal(generated.indices[real], teacher.indices[real])
    # KV-cached decoding and the full forward agree up to float rounding of the hidden states
    torch.testing.assert_close(generated.gates[real], teacher.gates[real], rtol=1e-6, atol=1e-7)
    assert bool(generated.gates[~real].isnan().all())


@pytest.mark.families("deepseek_v3")
def test_routes_methods_carry_gates():
    model = make_model("deepseek_v3")
    ids, mask = batch(batch_size=2, seq=6, padding="none")
    with RoutingRecorder(model, gates=True, slot_scores=True) as rec, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
        model(input_ids=ids[:, :4], attention_mask=mask[:, :4])
    routes = rec.routes  # two forwards concatenated: the second right-padded from 4 to 6 positions
    assert routes.gates.shape == (4, 6, 2, 2)
    assert bool(routes.gates[2:, 4:].isnan().all()) and bool(routes.gates[:2].isfinite().all())
    torch.testing.assert_close(routes.select([1, 3]).gates, routes.gates[[1, 3]], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(routes.to("cpu").gates, routes.gates, rtol=0, atol=0, equal_nan=True)

    def pairs(r: Routes) -> list[set[tuple[int, float]]]:  # per decision: {(expert, gate)}
        return [set(zip(i.tolist(), g.tolist(), strict=True)) for i, g in
                zip(r.indices[:2].reshape(-1, 2), r.gates[:2].reshape(-1, 2), strict=True)]

    reversed_order = replace(routes, slot_scores=-routes.slot_scores)  # ranking it swaps every decision's slots
    ranked = reversed_order.ranked()
    assert torch.equal(ranked.indices[:2], routes.ranked().indices[:2].flip(-1))
    assert pairs(ranked) == pairs(routes)  # each gate moved with its expert
    with pytest.raises(ValueError, match="gates must match indices"):
        Routes(indices=routes.indices, layers=routes.layers, num_experts=8, gates=routes.gates[:, :, :, :1])


class TestForceGatesErrors:
    @pytest.fixture
    def recorded(self):
        model = make_model("qwen3_moe")
        ids, mask = batch()
        routes, _, _ = record(model, ids, mask)
        return model, ids, mask, routes

    def test_routes_without_gates(self, recorded):
        model, _, _, routes = recorded
        bare = Routes(indices=routes.indices, layers=routes.layers, num_experts=routes.num_experts)
        with pytest.raises(RoutesMismatchError, match=r"these routes have none; record them with "
                                                      r"RoutingRecorder\(\.\.\., gates=True\)"):
            RoutingReplay(model, bare, force_gates=True)
        RoutingReplay(model, bare)  # index-only replay needs no gates

    def test_missing_gate_at_a_routed_slot(self, recorded):
        model, _, _, routes = recorded
        gates = routes.gates.clone()
        gates[2, 5, 1, 0] = float("nan")
        with pytest.raises(RoutesMismatchError, match=r"no finite gate weight, first at \[batch=2, seq=5\]"):
            RoutingReplay(model, Routes(indices=routes.indices, layers=routes.layers, num_experts=8, gates=gates),
                          force_gates=True)

    def test_hooks_are_removed_on_exit_even_when_the_body_raises(self, recorded):
        model, ids, mask, routes = recorded
        before = [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()]
        with pytest.raises(RuntimeError, match="boom"), RoutingReplay(model, routes, force_gates=True):
            with torch.no_grad():
                model(input_ids=ids, attention_mask=mask)
            raise RuntimeError("boom")
        assert before == [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()]
