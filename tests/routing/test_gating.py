"""The routing recipes of moestab.routing.gating on hand-worked cases (arithmetic in the comments)."""

import math
from types import SimpleNamespace

import pytest
import torch

from moestab.routing.gating import (
    ChoiceGating,
    DeepseekV2Selection,
    Gating,
    Selection,
    SparseMixerGating,
    group_limited,
)

LOGITS = torch.tensor([[0.0, math.log(2.0), math.log(3.0), math.log(4.0)]])  # softmax = [1, 2, 3, 4] / 10
TOP = torch.tensor([[3, 2]])  # experts 3 and 2


def test_softmax_over_all_experts_then_optionally_renormalised():
    router = SimpleNamespace(norm_topk_prob=False)
    # softmax gathered at experts 3, 2: [0.4, 0.3]
    assert torch.allclose(Gating("softmax", renorm="norm_topk_prob")(router, LOGITS, TOP), torch.tensor([[0.4, 0.3]]))
    router.norm_topk_prob = True
    # renormalised: [0.4, 0.3] / 0.7
    assert torch.allclose(Gating("softmax", renorm="norm_topk_prob")(router, LOGITS, TOP),
                          torch.tensor([[4 / 7, 3 / 7]]))


def test_softmax_over_the_chosen_logits_only():
    # softmax([log 4, log 3]) = [4, 3] / 7: the same as renormalised softmax, computed another way
    assert torch.allclose(Gating("softmax_topk")(None, LOGITS, TOP), torch.tensor([[4 / 7, 3 / 7]]))


def test_sigmoid_renormalised_with_eps_floor_and_scale():
    logits = torch.tensor([[0.0, 0.0, math.log(3.0), -math.log(3.0)]])  # sigmoid = [0.5, 0.5, 0.75, 0.25]
    chosen = torch.tensor([[2, 3]])
    router = SimpleNamespace(norm_topk_prob=True, routed_scaling_factor=2.5, norm_min=2.0)
    # [0.75, 0.25] / (1.0 + 0) * 2.5 = [1.875, 0.625]
    gates = Gating("sigmoid", renorm="norm_topk_prob", eps=1e-20, scale="routed_scaling_factor")(router, logits, chosen)
    assert torch.allclose(gates, torch.tensor([[1.875, 0.625]]))
    # ERNIE's floor on the denominator: max(1.0, norm_min=2.0) = 2 -> [0.375, 0.125]
    floored = Gating("sigmoid", renorm=True, min_denominator="norm_min")(router, logits, chosen)
    assert torch.allclose(floored, torch.tensor([[0.375, 0.125]]))
    # sigmoid of the chosen logits only: the same values
    assert torch.allclose(Gating("sigmoid_topk")(router, logits, chosen), torch.tensor([[0.75, 0.25]]))


def test_gates_keep_the_familys_dtype():
    bf16 = LOGITS.to(torch.bfloat16)
    assert Gating("softmax")(None, bf16, TOP).dtype == torch.float32  # the family computes in float32
    assert Gating("softmax_topk", dtype="logits")(None, bf16, TOP).dtype == torch.bfloat16


def test_choice_gating_follows_the_router_attribute_and_names_bad_values():
    gating = ChoiceGating("expert_selection_fn", (("softmax", Gating("softmax_topk")), ("sigmoid", Gating("sigmoid"))))
    assert torch.allclose(gating(SimpleNamespace(expert_selection_fn="softmax"), LOGITS, TOP),
                          torch.tensor([[4 / 7, 3 / 7]]))
    # sigmoid(log 4) = 4/5, sigmoid(log 3) = 3/4
    assert torch.allclose(gating(SimpleNamespace(expert_selection_fn="sigmoid"), LOGITS, TOP),
                          torch.tensor([[0.8, 0.75]]))
    with pytest.raises(ValueError, match=r"expert_selection_fn = 'relu' is not one moestab knows \(softmax, sigmoid\)"):
        gating(SimpleNamespace(expert_selection_fn="relu"), LOGITS, TOP)


def test_selection_with_attribute_bias_argument_bias_and_groups():
    logits = torch.zeros(1, 4)  # sigmoid = 0.5 everywhere
    router = SimpleNamespace(bias=torch.tensor([0.0, 0.3, 0.1, 0.2]), num_group=2, topk_group=1)
    # 0.5 + bias = [0.5, 0.8, 0.6, 0.7]
    assert torch.allclose(Selection("sigmoid", bias="bias")(router, logits), torch.tensor([[0.5, 0.8, 0.6, 0.7]]))
    # the bias as forward argument 1
    assert torch.allclose(Selection("sigmoid", bias=1)(router, logits, (None, router.bias)),
                          torch.tensor([[0.5, 0.8, 0.6, 0.7]]))
    # groups {0, 1} and {2, 3}: with bias [0, 0.3, 0.4, 0.2] scores are [0.5, 0.8, 0.9, 0.7], top-2 sums 1.3 vs 1.6
    router.bias = torch.tensor([0.0, 0.3, 0.4, 0.2])
    grouped = Selection("sigmoid", bias="bias", groups=True)(router, logits)
    assert torch.equal(torch.isinf(grouped), torch.tensor([[True, True, False, False]]))


def test_group_limited_keeps_the_best_groups_by_top2_sum():
    scores = torch.tensor([[9.0, 0.0, 0.0, 5.0, 4.0, 0.0]])  # 3 groups of 2: sums 9, 5, 4
    kept = group_limited(scores, num_group=3, topk_group=2)
    assert torch.equal(torch.isinf(kept), torch.tensor([[False, False, False, False, True, True]]))


def test_sparsemixer_masks_far_logits_per_slot():
    router = SimpleNamespace(router_jitter_noise=0.1)  # mask threshold: relative gap > 0.2
    logits = torch.tensor([[4.0, 3.5, 1.0, 3.0]])
    chosen = torch.tensor([[0, 1]])
    # slot 1: best 4.0; gaps (4-x)/max(|x|, 4) = [0, 0.125, 0.75, 0.25] -> keep experts 0, 1
    #   gate = softmax([4.0, 3.5])[0] = 1 / (1 + e^-0.5)
    # slot 2: expert 0 removed, best 3.5; gaps (3.5-x)/max(|x|, 3.5) = [-, 0, 0.714, 0.143] -> keep experts 1, 3
    #   gate = softmax([3.5, 3.0])[0] = 1 / (1 + e^-0.5)
    expected = 1 / (1 + math.exp(-0.5))
    assert torch.allclose(SparseMixerGating()(router, logits, chosen), torch.tensor([[expected, expected]]))


def test_deepseek_v2_group_limited_greedy_zeroes_other_groups():
    logits = torch.log(torch.tensor([[4.0, 1.0, 3.0, 2.0]]))  # softmax = [0.4, 0.1, 0.3, 0.2]
    greedy = SimpleNamespace(topk_method="greedy", num_group=2, topk_group=1)
    assert torch.allclose(DeepseekV2Selection()(greedy, logits), torch.tensor([[0.4, 0.1, 0.3, 0.2]]))
    # group maxima 0.4 and 0.3: keep group 0 only
    limited = SimpleNamespace(topk_method="group_limited_greedy", num_group=2, topk_group=1)
    assert torch.allclose(DeepseekV2Selection()(limited, logits), torch.tensor([[0.4, 0.1, 0.0, 0.0]]))
