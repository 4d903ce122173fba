"""Group-relative advantages: hand-worked values, zero-variance groups, registry errors."""

from __future__ import annotations

import math

import pytest
import torch

from moestab.rl import (
    ADVANTAGE_ESTIMATORS,
    UnknownNameError,
    compute_advantages,
    group_centered_advantages,
    group_normalized_advantages,
)


def test_group_normalized_hand_worked():
    # Group 1: [1, 0, 0, 1]: mean 0.5, deviations +-0.5, Bessel variance = 4 * 0.25 / 3 = 1/3,
    #          std = 0.57735 -> advantages +-0.5 / 0.57735 = +-0.866025 (= +-sqrt(3)/2).
    # Group 2: [2, 0, 1, 1]: mean 1, deviations [1, -1, 0, 0], variance = 2/3, std = 0.816497
    #          -> [1.224745, -1.224745, 0, 0] (= +-sqrt(3/2)).
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 1.0, 1.0])
    a = math.sqrt(3) / 2
    b = math.sqrt(1.5)
    expected = torch.tensor([a, -a, -a, a, b, -b, 0.0, 0.0])
    torch.testing.assert_close(compute_advantages("group-normalized", rewards, 4), expected)


def test_group_centered_hand_worked():
    # Dr. GRPO: r - mean only. Group [1, 0, 0, 1] -> +-0.5; group [2, 0, 1, 1] -> [1, -1, 0, 0].
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 1.0, 1.0])
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5, 1.0, -1.0, 0.0, 0.0])
    torch.testing.assert_close(compute_advantages("group-centered", rewards, 4), expected)


@pytest.mark.parametrize("value", [0.1, 1.0, 0.0, -3.7, 1e8])
@pytest.mark.parametrize("fn", [group_normalized_advantages, group_centered_advantages])
def test_zero_variance_group_gives_exact_zero(value, fn):
    # (0.1 + 0.1 + 0.1) / 3 = 0.10000000000000002 != 0.1 in float64: a naive (r - mean) / std would divide
    # two ~1e-17 numbers and return advantages of order 1. We return exactly 0 for the constant group and
    # leave the other group untouched.
    rewards = torch.tensor([value, value, value, 0.0, 1.0, 0.5], dtype=torch.float64)
    adv = fn(rewards, 3)
    assert torch.equal(adv[:3], torch.zeros(3, dtype=torch.float64))
    assert torch.isfinite(adv).all()
    assert adv[3:].abs().sum() > 0


def test_naive_formula_would_fail_on_the_constant_group():
    # Makes the previous test meaningful: the naive computation really is wrong here.
    grouped = torch.tensor([[0.1, 0.1, 0.1]], dtype=torch.float64)
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    assert centered.abs().max() > 0  # an ulp, not 0
    naive = centered / grouped.std(dim=1, keepdim=True)
    assert naive.abs().max() > 0.5


def test_group_size_one_gives_zero():
    rewards = torch.tensor([3.0, -1.0])
    assert torch.equal(group_normalized_advantages(rewards, 1), torch.zeros(2))


def test_no_epsilon_on_nonzero_variance_and_std_matches_trl_nanstd():
    trl_utils = pytest.importorskip("trl.trainer.utils")
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(24, generator=gen, dtype=torch.float64)
    adv = group_normalized_advantages(rewards, 8).view(3, 8)
    grouped = rewards.view(3, 8)
    # Our std is the Bessel-corrected one TRL uses (trl.trainer.utils.nanstd); TRL then adds 1e-4, we don't:
    # (nanstd's Bessel factor count / (count - 1) is an int64 division, i.e. float32: hence rtol 1e-7.)
    std = trl_utils.nanstd(grouped, dim=1, keepdim=True)
    torch.testing.assert_close(adv, (grouped - grouped.mean(1, keepdim=True)) / std, rtol=1e-7, atol=0)
    # and each group's advantages have mean 0 and Bessel std exactly 1.
    torch.testing.assert_close(adv.mean(1), torch.zeros(3, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(adv.std(1), torch.ones(3, dtype=torch.float64), rtol=1e-12, atol=0)


def test_integer_rewards_become_float():
    adv = compute_advantages("group-centered", torch.tensor([1, 0]), 2)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5]))


def test_errors():
    with pytest.raises(UnknownNameError, match="group-centered, group-normalized") as info:
        compute_advantages("grpo-norm", torch.zeros(4), 2)
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert set(info.value.valid) == set(ADVANTAGE_ESTIMATORS)
    with pytest.raises(ValueError, match="not a whole number of groups"):
        compute_advantages("group-normalized", torch.zeros(5), 2)
    with pytest.raises(ValueError, match="1-D"):
        compute_advantages("group-normalized", torch.zeros(2, 2), 2)
    with pytest.raises(ValueError, match="finite"):
        compute_advantages("group-normalized", torch.tensor([0.0, math.nan]), 2)
    with pytest.raises(ValueError, match="group_size"):
        compute_advantages("group-normalized", torch.zeros(4), 0)
