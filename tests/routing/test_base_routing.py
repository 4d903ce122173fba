"""BaseRouting (the routing-constant control): the policy routes as the frozen base does, in full forwards and in
KV-cached generation, checked against RoutingReplay of the base's own recorded routes."""

import pytest
import torch

from moestab.recording.batch import position_ids_from_mask
from moestab.routing import RoutesMismatchError, RoutingRecorder, RoutingReplay
from moestab.routing.base_routing import BaseRouting
from tests.support.routing import batch, make_model


def _pair(family: str):
    """A policy and a base of one architecture whose own routes differ (different weights)."""
    return make_model(family, seed=0), make_model(family, seed=1)


def _routes(model, ids, mask):
    with RoutingRecorder(model) as rec, torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask))
    return rec.routes, out.logits


def test_a_full_forward_routes_as_the_base_and_equals_replaying_its_routes(family):
    policy, base = _pair(family)
    ids, mask = batch(padding="left")
    base_routes, _ = _routes(base, ids, mask)
    own, _ = _routes(policy, ids, mask)
    real = mask.bool()
    assert bool((own.indices.sort(-1).values != base_routes.indices.sort(-1).values).any(-1)[real].any()), \
        "the test needs a policy whose own routes differ from the base's"
    with BaseRouting(policy, base):
        followed, logits = _routes(policy, ids, mask)
    with RoutingReplay(policy, base_routes), torch.no_grad():
        want = policy(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    assert torch.equal(followed.indices[real], base_routes.indices[real])
    torch.testing.assert_close(logits[real], want[real], rtol=0, atol=1e-10)
    # On exit every hook is gone: the policy routes as itself again.
    again, _ = _routes(policy, ids, mask)
    assert torch.equal(again.indices, own.indices)


def test_gradients_reach_the_policy_router_and_never_the_base():
    policy, base = _pair("qwen3_moe")
    policy.train()
    ids, mask = batch(padding="left")
    with BaseRouting(policy, base):
        out = policy(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask))
    out.logits.sum().backward()
    router_grads = [p.grad for n, p in policy.named_parameters() if "gate.weight" in n and "mlp.gate." in n]
    assert router_grads and all(g is not None and float(g.abs().sum()) > 0 for g in router_grads)
    assert all(p.grad is None for p in base.parameters())


def _greedy_without_cache(policy, base, ids, mask, steps: int) -> torch.Tensor:
    """A second implementation: each token from a full forward of the prefix, replaying the routes the base's own
    full forward of that prefix recorded."""
    for _ in range(steps):
        routes, _ = _routes(base, ids, mask)
        with RoutingReplay(policy, routes), torch.no_grad():
            logits = policy(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return ids


def test_kv_cached_generate_follows_the_base_token_by_token(family):
    policy, base = _pair(family)
    ids, mask = batch(padding="left", seq=6)
    with BaseRouting(policy, base), RoutingRecorder(policy) as rec, torch.no_grad():
        out = policy.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=5, min_new_tokens=5,
                              use_cache=True, pad_token_id=0, eos_token_id=None)
    assert torch.equal(out, _greedy_without_cache(policy, base, ids, mask, steps=5))
    # The routes generate() used are the base's for the whole sequence (its last token is never an input).
    full_mask = torch.cat([mask, torch.ones(mask.shape[0], 4, dtype=mask.dtype)], dim=1)
    base_routes, _ = _routes(base, out[:, :-1], full_mask)
    real = full_mask.bool()
    assert torch.equal(rec.routes.indices.sort(-1).values[real], base_routes.indices.sort(-1).values[real])
    # Without the base the policy would have decoded otherwise (or at least routed otherwise).
    with RoutingRecorder(policy) as free, torch.no_grad():
        policy(input_ids=out[:, :-1], attention_mask=full_mask, position_ids=position_ids_from_mask(full_mask))
    assert bool((free.routes.indices.sort(-1).values != base_routes.indices.sort(-1).values).any(-1)[real].any())


def test_a_base_of_another_architecture_is_refused():
    from transformers import AutoModelForCausalLM

    from moestab.models.families import tiny_config

    policy = make_model("qwen3_moe")
    with pytest.raises(RoutesMismatchError, match="architecture"):
        BaseRouting(policy, make_model("mixtral"))
    wider = AutoModelForCausalLM.from_config(tiny_config("qwen3_moe", num_moe_layers=2, num_experts=16, top_k=2),
                                             experts_implementation="eager").eval().double()
    with pytest.raises(RoutesMismatchError, match="experts"):
        BaseRouting(policy, wider)


def test_a_decode_step_whose_prefill_it_did_not_see_is_refused():
    policy, base = _pair("qwen3_moe")
    ids, mask = batch(padding="none", seq=6)
    with torch.no_grad():
        first = policy(input_ids=ids, attention_mask=mask, use_cache=True)
        with BaseRouting(policy, base), pytest.raises(RoutesMismatchError, match="prefill"):
            policy(input_ids=ids[:, :1], attention_mask=torch.ones(3, 7, dtype=mask.dtype),
                   past_key_values=first.past_key_values, use_cache=True)
