"""Recorder and replay on a tiny random model of every supported family (float64, CPU)."""

import pytest
import torch

from moestab.routing import RoutesMismatchError, RoutingRecorder, RoutingReplay, find_routers
from tests.support.routing import batch, make_model


def reference_top_k(family: str, site, logits: torch.Tensor) -> torch.Tensor:
    """A second, per-token implementation of each family's expert selection -> [N, k] sorted ids."""
    k, router = site.top_k, site.module
    out = []
    for row in logits.double():
        if family == "deepseek_v3":
            # sigmoid + bias; keep the topk_group groups with the best top-2 sums; top-k inside them.
            scores = row.sigmoid() + router.e_score_correction_bias.double()
            groups = scores.view(router.num_group, -1)
            group_rank = sorted(range(router.num_group), key=lambda g: -float(groups[g].topk(2).values.sum()))
            width = groups.shape[1]
            allowed = [e for g in group_rank[: router.topk_group] for e in range(g * width, (g + 1) * width)]
            chosen = sorted(allowed, key=lambda e: -float(scores[e]))[:k]
        else:
            chosen = sorted(range(row.numel()), key=lambda e: -float(row[e]))[:k]
        out.append(sorted(chosen))
    return torch.tensor(out)


def router_logits_by_hook(model, ids, mask):
    """Router logits captured by plain forward hooks, independent of the recorder."""
    captured = {}
    handles = [
        s.module.register_forward_hook(lambda m, a, o, name=s.name: captured.__setitem__(name, o[0].detach()))
        for s in find_routers(model)
    ]
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
    finally:
        for h in handles:
            h.remove()
    return captured


@pytest.mark.parametrize("padding", ["left", "right"])
def test_recorded_indices_equal_the_routers_own_top_k(family, model, padding):
    ids, mask = batch(padding=padding)
    with RoutingRecorder(model) as rec, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    routes = rec.routes
    sites = find_routers(model)
    assert routes.indices.shape == (3, 10, len(sites), 2)
    assert routes.indices.dtype == torch.int16
    logits = router_logits_by_hook(model, ids, mask)
    real = mask.bool()
    for j, site in enumerate(sites):
        expected = reference_top_k(family, site, logits[site.name]).view(3, 10, 2)
        got = routes.indices[:, :, j].long().sort(-1).values
        assert torch.equal(got[real], expected[real]), f"{site.name}"
    # padding positions are -1 in every layer and slot; margins NaN there, finite and >= 0 elsewhere
    assert bool((routes.indices[~real] == -1).all())
    assert bool(routes.margin[~real].isnan().all())
    assert bool((routes.margin[real] >= 0).all())
    assert bool((routes.entropy[real] > 0).all())


def test_replaying_own_routes_reproduces_logits(family, model):
    ids, mask = batch()
    with RoutingRecorder(model) as rec, torch.no_grad():
        free = model(input_ids=ids, attention_mask=mask).logits
    with RoutingReplay(model, rec.routes), torch.no_grad():
        replayed = model(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    assert (free - replayed)[real].abs().max() <= 1e-6


def test_replay_forces_routes_after_weights_move(family, model):
    ids, mask = batch()
    real = mask.bool()
    with RoutingRecorder(model) as rec, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    old = rec.routes
    torch.manual_seed(1)
    with torch.no_grad():
        for site in find_routers(model):
            site.module.weight.add_(torch.randn_like(site.module.weight) * 2.0)
    # free forward: at least one real token now routes elsewhere
    with RoutingRecorder(model) as free_rec, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    free_sets = free_rec.routes.indices.sort(-1).values
    old_sets = old.indices.sort(-1).values
    assert bool((free_sets != old_sets)[real].any())
    # replayed forward: exactly the forced experts at every real token (recorder sees what was used)
    with RoutingReplay(model, old), RoutingRecorder(model) as used, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    assert torch.equal(used.routes.indices[real], old.indices[real])


def test_router_gets_gradient_under_replay(family, model):
    ids, mask = batch()
    with RoutingRecorder(model) as rec, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    model.zero_grad()
    with RoutingReplay(model, rec.routes):
        logits = model(input_ids=ids, attention_mask=mask).logits
    logits[mask.bool()].logsumexp(-1).sum().backward()
    for site in find_routers(model):
        grad = site.module.weight.grad
        assert grad is not None and grad.abs().sum() > 0, site.name


def test_recording_with_grad_keeps_graph_intact(model):
    ids, mask = batch()
    with RoutingRecorder(model) as rec:
        loss = model(input_ids=ids, attention_mask=mask).logits.sum()
    loss.backward()
    assert not rec.routes.indices.requires_grad
    assert any(p.grad is not None for p in model.parameters())


def test_hooks_are_removed_on_exit(model):
    before = [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()]
    ids, mask = batch()
    with RoutingRecorder(model) as rec, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    with RoutingReplay(model, rec.routes), torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    with pytest.raises(RuntimeError), RoutingRecorder(model):
        raise RuntimeError("boom")  # hooks must go even when the body raises
    after = [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()]
    assert before == after


class TestReplayErrors:
    @pytest.fixture
    def recorded(self):
        model = make_model("qwen3_moe")
        ids, mask = batch()
        with RoutingRecorder(model) as rec, torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
        return model, ids, mask, rec.routes

    def test_wrong_batch(self, recorded):
        model, ids, mask, routes = recorded
        with pytest.raises(RoutesMismatchError, match=r"batch=3, seq=10.*batch=2"), RoutingReplay(model, routes):
            model(input_ids=ids[:2], attention_mask=mask[:2])

    def test_wrong_length(self, recorded):
        model, ids, mask, routes = recorded
        with pytest.raises(RoutesMismatchError, match="seq=9"), RoutingReplay(model, routes):
            model(input_ids=ids[:, 1:], attention_mask=mask[:, 1:])

    def test_missing_layer(self, recorded):
        model, ids, mask, _ = recorded
        with RoutingRecorder(model, layers=[0]) as rec, torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
        with pytest.raises(RoutesMismatchError, match=r"layers \[0\].*\[0, 1\]"):
            RoutingReplay(model, rec.routes)

    def test_route_missing_at_real_token(self, recorded):
        model, ids, mask, routes = recorded
        unpadded = torch.ones_like(mask)  # row 0 was left-padded: its routes are -1 there
        with pytest.raises(RoutesMismatchError, match="first at \\[batch=0, seq=0\\]"), RoutingReplay(model, routes):
            model(input_ids=ids, attention_mask=unpadded)

    def test_unknown_expert(self, recorded):
        model, _, _, routes = recorded
        bad = routes.indices.clone()
        bad[2, 3, 0, 0] = 8
        with pytest.raises(RoutesMismatchError, match=r"valid ids 0\.\.7"):
            RoutingReplay(model, type(routes)(indices=bad, layers=routes.layers, num_experts=8))

    def test_duplicate_expert(self, recorded):
        model, ids, mask, routes = recorded
        bad = routes.indices.clone()
        bad[2, 3, 1, 1] = bad[2, 3, 1, 0]
        with (
            pytest.raises(RoutesMismatchError, match=r"same expert, first at \[batch=2, seq=3\]"),
            RoutingReplay(model, type(routes)(indices=bad, layers=routes.layers, num_experts=8)),
        ):
            model(input_ids=ids, attention_mask=mask)
