"""Score-threshold replay (prime-rl PR #2703): a hand-worked case, a per-token loop as the second implementation, and
``RoutingReplay(score_ratio=...)`` on real tiny models (a softmax family and a sigmoid family, float64, CPU)."""

from __future__ import annotations

import pytest
import torch

from moestab.routing import RoutingRecorder, RoutingReplay, find_routers
from moestab.routing.threshold import router_scores, threshold_routes
from tests.support.routing import batch, make_model


def naive(scores: list[list[float]], own: list[list[int]], forced: list[list[int]], ratio: float):
    """Token by token: keep a replayed expert scoring >= ratio * the weakest own score; fill the rejected slots, in
    slot order, with the own experts in descending score that are not kept."""
    chosen, rejected = [], []
    for s, o, f in zip(scores, own, forced, strict=True):
        if all(e < 0 for e in f):
            chosen.append(list(f))
            rejected.append([False] * len(f))
            continue
        weakest = min(s[e] for e in o)
        reject = [e >= 0 and s[e] < ratio * weakest for e in f]
        kept = {e for e, r in zip(f, reject, strict=True) if not r}
        fill = iter([e for e in sorted(o, key=lambda e: -s[e]) if e not in kept])
        chosen.append([next(fill) if r else e for e, r in zip(f, reject, strict=True)])
        rejected.append(reject)
    return chosen, rejected


def test_hand_worked():
    scores = torch.tensor([[0.4, 0.3, 0.15, 0.1, 0.05]] * 4)  # own top-2 {0, 1}: weakest own score 0.3
    own = torch.tensor([[0, 1]] * 4)
    forced = torch.tensor([[2, 0], [2, 0], [3, 4], [-1, -1]])
    ratios = (0.5, 0.6, 0.5, 0.5)
    out = [threshold_routes(scores[i : i + 1], own[i : i + 1], forced[i : i + 1], r) for i, r in enumerate(ratios)]
    # 0.5 * 0.3 = 0.15: expert 2 (0.15) is kept, and expert 0 -> unchanged
    assert out[0][0].tolist() == [[2, 0]] and out[0][1].tolist() == [[False, False]]
    # 0.6 * 0.3 = 0.18 > 0.15: expert 2 rejected; own best first [0, 1], 0 is kept -> slot 0 takes 1
    assert out[1][0].tolist() == [[1, 0]] and out[1][1].tolist() == [[True, False]]
    # experts 3 (0.1) and 4 (0.05) both below 0.15: the slots take own 0, then 1
    assert out[2][0].tolist() == [[0, 1]] and out[2][1].tolist() == [[True, True]]
    # padding: nothing replayed, nothing rejected, -1 stays for the router's own choice
    assert out[3][0].tolist() == [[-1, -1]] and out[3][1].tolist() == [[False, False]]


@pytest.mark.parametrize("ratio", [0.0, 0.3, 0.8, 1.0])
def test_against_the_per_token_loop(ratio):
    gen = torch.Generator().manual_seed(int(ratio * 10))
    n, experts, k = 400, 16, 4
    scores = torch.softmax(torch.randn(n, experts, generator=gen) * 2, dim=-1)
    own = scores.topk(k, dim=-1).indices
    forced = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(n)])
    forced[:7] = -1
    forced[7:40] = own[7:40].flip(-1)  # some rows replay the trainer's own choice: never rejected
    chosen, rejected = threshold_routes(scores, own, forced, ratio)
    want_chosen, want_rejected = naive(scores.tolist(), own.tolist(), forced.tolist(), ratio)
    assert chosen.tolist() == want_chosen and rejected.tolist() == want_rejected
    assert not rejected[7:40].any()
    assert (chosen[7:].sort(-1).values.diff(dim=-1) > 0).all()  # k distinct experts in every routed row
    if 0 < ratio < 1:
        assert 0 < rejected.float().mean() < 1  # both branches ran: the check can fail


def replay_with_threshold(model, ids, mask, routes, ratio):
    """``(used routes, the replay, logits, {layer: (router logits [N, E], own indices [N, k])})`` of one forward
    replaying ``routes`` with ``ratio``. The used routes are recorded from inside the replay; plain hooks put in front
    of the replay's see each router's own output."""
    seen = {}

    def hook(i: int, site):
        def read(module, args, output):
            logits, _, own = site.adapter.read(output, site.top_k)  # [N, E], [N, k] in the family's format
            seen[i] = (logits.detach(), own)
        return read

    replay = RoutingReplay(model, routes, score_ratio=ratio)
    with replay, RoutingRecorder(model) as rec, torch.no_grad():
        handles = [s.module.register_forward_hook(hook(i, s), prepend=True) for i, s in enumerate(find_routers(model))]
        try:
            logits = model(input_ids=ids, attention_mask=mask).logits
        finally:
            for h in handles:
                h.remove()
    return rec.routes, replay, logits, seen


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_replay_with_a_threshold_on_a_real_model(family):
    model = make_model(family)
    ids, mask = batch()
    with RoutingRecorder(model) as rec, torch.no_grad():
        plain_logits = model(input_ids=ids, attention_mask=mask).logits
    own_routes = rec.routes
    # Routes to replay: each real position's experts shifted by one (most are not the router's choice).
    shifted = own_routes.indices.clone()
    shifted[shifted >= 0] = (shifted[shifted >= 0] + 1) % own_routes.num_experts
    other = type(own_routes)(indices=shifted, layers=own_routes.layers, num_experts=own_routes.num_experts)
    # ratio 0 is plain replay, bit for bit; the model's own routes are never replaced, whatever the ratio.
    used0, replay0, logits0, _ = replay_with_threshold(model, ids, mask, other, 0.0)
    with RoutingReplay(model, other), torch.no_grad():
        assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, logits0)
    assert torch.equal(used0.indices, other.indices) and replay0.replayed_slots == 0
    _, replay_own, logits_own, _ = replay_with_threshold(model, ids, mask, own_routes, 1.0)
    assert replay_own.replaced_slots == 0 and replay_own.replayed_slots == int((own_routes.indices >= 0).sum())
    assert torch.allclose(logits_own, plain_logits, atol=1e-10)
    # A threshold on the shifted routes: the used routes are the per-token loop's on the router's own scores. These
    # untrained routers score experts nearly alike, so only a ratio near 1 rejects some replayed experts.
    ratio = 0.98
    used, replay, _, seen = replay_with_threshold(model, ids, mask, other, ratio)
    adapter = find_routers(model)[0].adapter
    replaced = replayed = 0
    for layer in range(len(used.layers)):
        real = mask.bool().reshape(-1)  # [N] positions with a route
        router_logits, own = seen[layer]  # [N, E], [N, k]
        scores = router_scores(adapter, router_logits)[real]  # sigmoid (DeepSeek-V3) or softmax
        forced = other.indices[:, :, layer].reshape(-1, other.top_k)[real]  # [n, k]
        want, reject = naive(scores.tolist(), own[real].tolist(), forced.tolist(), ratio)
        assert used.indices[:, :, layer].reshape(-1, used.top_k)[real].tolist() == want
        replaced += sum(map(sum, reject))
        replayed += forced.numel()
    assert replay.replaced_slots == replaced and replay.replayed_slots == replayed
    assert 0 < replaced < replayed  # some replayed experts kept, some replaced: the check can fail
    assert replay.replace_rate == pytest.approx(replaced / replayed)
    assert (getattr(adapter.selection_scores, "base", "logits") == "sigmoid") == (family == "deepseek_v3")


def test_the_router_keeps_its_gradient_and_bad_settings_are_refused():
    model = make_model("qwen3_moe").train()
    ids, mask = batch()
    with RoutingRecorder(model) as rec, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    with RoutingReplay(model, rec.routes, score_ratio=0.7):
        model(input_ids=ids, attention_mask=mask).logits.sum().backward()
    router = find_routers(model)[0].module
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in router.parameters())
    with pytest.raises(ValueError, match=r"score_ratio must be in \[0, 1\]"):
        RoutingReplay(model, rec.routes, score_ratio=1.5)
    with pytest.raises(ValueError, match="cannot be combined with force_gates"):
        RoutingReplay(model, rec.routes, score_ratio=0.5, force_gates=True)
