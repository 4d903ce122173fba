"""Reading a router's top-1 in every family: slot scores recorded, slots ranked by them (float64, CPU).

DeepSeek-V3's router picks its top-k with ``topk(..., sorted=False)``; the others sort. Recorded routes
keep the router's own slot order (replay reproduces it exactly); ``RoutingRecorder(slot_scores=True)``
adds each chosen expert's selection score and ``Routes.ranked()`` sorts by it. The checks use top-4 of
16 experts, where DeepSeek-V3's own slot 0 is not its best expert (asserted below), so they fail if
the ranking is not by the family's selection score.
"""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from moestab.models.families import CORE_FAMILIES, tiny_config
from moestab.routing import RoutingRecorder, find_routers
from tests.support.routing import batch

EXPERTS, TOP_K = 16, 4


def make_wide_model(family: str, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    """Top-4 of 16 experts; DeepSeek-V3 gets a random selection bias (zero at init).

    With the bias (scale ~ the spread of the sigmoid scores), DeepSeek-V3's selection order differs
    from the order of its gate weights in about a third of the decisions. float64 uses the eager
    experts loop; float32 the default grouped_mm, whose sum over slots depends on the slot order.
    """
    torch.manual_seed(seed)
    config = tiny_config(family, num_moe_layers=2, num_experts=EXPERTS, top_k=TOP_K)
    eager = {"experts_implementation": "eager"} if dtype == torch.float64 else {}
    model = AutoModelForCausalLM.from_config(config, **eager)
    model.config.use_cache = False
    if family == "deepseek_v3":
        for site in find_routers(model):
            site.module.e_score_correction_bias.copy_(torch.randn(EXPERTS) * 0.01)
    return model.eval().to(dtype)


def reference_selection_scores(family: str, router: torch.nn.Module, logits: torch.Tensor) -> torch.Tensor:
    """A second, per-token implementation of what each family ranks: ``logits [N, E] -> [N, E]`` float64.

    Experts a family cannot pick for a token (DeepSeek-V3: outside its best groups) get -inf.
    """
    if family == "gpt_oss":
        return logits.double()  # top-k of the logits
    if family != "deepseek_v3":
        return torch.softmax(logits.double(), dim=-1)  # top-k of the softmax probabilities
    out = torch.full(logits.shape, float("-inf"), dtype=torch.float64)
    width = logits.shape[1] // router.num_group
    for t, row in enumerate(logits):
        # sigmoid in the router's dtype (float32), plus the selection bias; groups ranked by their top-2 sum
        scores = row.sigmoid().double() + router.e_score_correction_bias.double()
        groups = [scores[g * width : (g + 1) * width] for g in range(router.num_group)]
        best = sorted(range(router.num_group), key=lambda g: -float(groups[g].topk(2).values.sum()))
        for g in best[: router.topk_group]:
            out[t, g * width : (g + 1) * width] = groups[g]
    return out


def record_with_router_outputs(model, ids, mask, **recorder_args):
    """Routes recorded by ``RoutingRecorder`` and, by plain hooks, each router's own (logits, indices)."""
    own = {}
    handles = [
        s.module.register_forward_hook(lambda m, a, o, name=s.name: own.__setitem__(name, (o[0].detach(), o[2])))
        for s in find_routers(model)
    ]
    try:
        with RoutingRecorder(model, **recorder_args) as rec, torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits
    finally:
        for h in handles:
            h.remove()
    return rec.routes, own, logits


@pytest.mark.parametrize("family", sorted(CORE_FAMILIES))
def test_slot_scores_are_the_selection_scores_and_ranking_puts_the_best_expert_first(family):
    model = make_wide_model(family)
    ids, mask = batch(batch_size=4, seq=16)
    routes, own, _ = record_with_router_outputs(model, ids, mask, slot_scores=True)
    ranked = routes.ranked()
    real = mask.bool().flatten()  # [batch*seq]
    for j, site in enumerate(find_routers(model)):
        logits, own_idx = own[site.name]  # [N, E], [N, k] as the router returned them
        scores = reference_selection_scores(family, site.module, logits)[real]  # [n, E]
        own_idx = own_idx[real]  # [n, k]
        raw = routes.indices[:, :, j].reshape(-1, TOP_K)[real].long()  # [n, k]
        assert torch.equal(raw, own_idx), f"{site.name}: recorded slots are not the router's own order"
        recorded = routes.slot_scores[:, :, j].reshape(-1, TOP_K)[real].double()  # [n, k] float32 -> float64
        # Softmax families rank by logit (the same order as the probabilities), DeepSeek-V3 by its score.
        expected = scores if family == "deepseek_v3" else logits[real].double()  # [n, E]
        torch.testing.assert_close(recorded, expected.gather(-1, raw), rtol=1e-6, atol=1e-7)
        best_first = ranked.indices[:, :, j].reshape(-1, TOP_K)[real].long()  # [n, k]
        values = scores.gather(-1, best_first)  # [n, k]
        assert bool((values[:, :-1] > values[:, 1:]).all()), f"{site.name}: ranked slots do not descend"
        assert torch.equal(best_first[:, 0], scores.argmax(-1)), f"{site.name}: slot 0 is not the best expert"
        assert torch.equal(best_first.sort(-1).values, raw.sort(-1).values)  # the same experts
        if family == "deepseek_v3":
            # topk(sorted=False): the router's own slot 0 is mostly not its best expert (here: always)
            unsorted = (own_idx[:, 0] != scores.argmax(-1)).float().mean().item()
            assert unsorted > 0.5, f"{site.name}: raw slot 0 differs from the best in only {unsorted:.0%}"
    assert torch.isnan(routes.slot_scores[~mask.bool()]).all()  # padding has no score


def test_ranking_needs_recorded_scores():
    model = make_wide_model("qwen3_moe")
    ids, mask = batch()
    routes, _, _ = record_with_router_outputs(model, ids, mask)
    with pytest.raises(ValueError, match="slot_scores=True"):
        routes.ranked()


@pytest.mark.parametrize("family", sorted(CORE_FAMILIES))
def test_recording_slot_scores_leaves_the_forward_unchanged(family):
    model = make_wide_model(family, dtype=torch.float32)
    ids, mask = batch()
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask).logits
    _, _, recorded = record_with_router_outputs(model, ids, mask, slot_scores=True)
    assert torch.equal(plain, recorded)


def deepseek_probe_scores(model, ids, mask) -> torch.Tensor:
    """``[tokens, layers, experts]`` reference selection scores at the real tokens, row-major (probe, position)."""
    _, own, _ = record_with_router_outputs(model, ids, mask)
    real = mask.bool().flatten()
    return torch.stack(
        [
            reference_selection_scores("deepseek_v3", s.module, own[s.name][0])[real]
            for s in find_routers(model)
        ],
        dim=1,
    )


@pytest.mark.families("deepseek_v3")
def test_saturation_top1_reads_the_best_expert_on_deepseek_v3():
    from moestab.analysis.saturation import router_saturation
    from moestab.probes.collect import record_batches

    def record_probe_routes(model, ids, mask):
        record = record_batches(model, ids, mask)
        return record.routes, record.layers

    model = make_wide_model("deepseek_v3")
    ids, mask = batch(batch_size=6, seq=16)
    routes, _ = record_probe_routes(model, ids, mask)  # [tokens, layers, k]
    again, _ = record_probe_routes(model, ids, mask)
    table = router_saturation(routes, again)
    assert table.saturation.tolist() == [1.0, 1.0] and table.saturation_top1.tolist() == [1.0, 1.0]
    # A reference whose slot 0 is known to be the best expert: the top-k by the reference scores.
    scores = deepseek_probe_scores(model, ids, mask)  # [tokens, layers, experts]
    known = scores.topk(TOP_K, dim=-1).indices.to(torch.int16).numpy()  # [tokens, layers, k], best first
    table = router_saturation(routes, known)
    assert table.saturation.tolist() == [1.0, 1.0] and table.saturation_top1.tolist() == [1.0, 1.0]

    # Two checkpoints: top-1 agreement from the argmax of each one's scores equals saturation_top1.
    other = copy.deepcopy(model)
    torch.manual_seed(2)
    with torch.no_grad():
        for site in find_routers(other):
            site.module.weight.add_(torch.randn_like(site.module.weight) * 0.05)
    other_routes, _ = record_probe_routes(other, ids, mask)
    expected = (scores.argmax(-1) == deepseek_probe_scores(other, ids, mask).argmax(-1)).double().mean(0)  # [layers]
    table = router_saturation(other_routes, routes)
    assert expected.min() > 0.0 and expected.max() < 1.0  # the perturbation moved some top-1s, not all
    assert table.saturation_top1.tolist() == pytest.approx(expected.tolist(), abs=1e-12)


@pytest.mark.families("deepseek_v3")
def test_generate_records_the_same_scores_and_ranking_as_teacher_forcing_on_deepseek_v3():
    model = make_wide_model("deepseek_v3")
    ids, mask = batch(padding="left", seq=8)
    with RoutingRecorder(model, slot_scores=True) as rec, torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6, do_sample=False, use_cache=True
        )
    full_mask = torch.cat([mask, torch.ones(mask.shape[0], out.shape[1] - ids.shape[1], dtype=mask.dtype)], dim=1)
    with RoutingRecorder(model, slot_scores=True) as tf, torch.no_grad():
        model(input_ids=out[:, :-1], attention_mask=full_mask[:, :-1])
    real = full_mask[:, :-1].bool()
    generated, forced = rec.routes.ranked(), tf.routes.ranked()
    assert generated.indices.shape == forced.indices.shape
    # slot for slot, not only as sets: the KV-cached decode steps are ranked the same way
    assert torch.equal(generated.indices[real], forced.indices[real])
    torch.testing.assert_close(generated.slot_scores[real], forced.slot_scores[real], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("family", sorted(CORE_FAMILIES))
def test_routing_confidence_is_the_softmax_mass_on_the_chosen_experts(family):
    model = make_wide_model(family)
    ids, mask = batch()
    routes, own, _ = record_with_router_outputs(model, ids, mask)  # entropy (and confidence) on by default
    real = mask.bool().flatten()
    for j, site in enumerate(find_routers(model)):
        logits, own_idx = own[site.name]  # [N, E], [N, k]
        expected = [  # per token, with plain Python: sum over the chosen experts of softmax(logits)
            sum(torch.softmax(row.double(), -1)[e].item() for e in chosen.tolist())
            for row, chosen in zip(logits[real], own_idx[real], strict=True)
        ]
        got = routes.confidence[:, :, j].reshape(-1)[real].double()  # [n]
        torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-6)
        assert bool(((got > 0) & (got <= 1 + 1e-6)).all())
    assert torch.isnan(routes.confidence[~mask.bool()]).all()
