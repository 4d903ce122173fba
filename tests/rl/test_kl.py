"""k1 / k3 KL estimators: hand-worked values, masking, exact expectations against torch.distributions."""

from __future__ import annotations

import math

import torch

from moestab.rl import kl_k1, kl_k1_per_token, kl_k3, kl_k3_per_token


def test_hand_worked_values():
    # Token 0: p = 0.5, q = 0.25 -> d = ln q - ln p = ln 0.5 = -0.693147
    #          k1 = -d = 0.693147;  k3 = e^d - 1 - d = 0.5 - 1 + 0.693147 = 0.193147
    # Token 1: p = 0.2, q = 0.4 -> d = ln 2 = 0.693147
    #          k1 = -0.693147;      k3 = 2 - 1 - 0.693147 = 0.306853
    # Token 2: masked (NaN values must not leak).
    logp_p = torch.tensor([[math.log(0.5), math.log(0.2), math.nan]], dtype=torch.float64)
    logp_q = torch.tensor([[math.log(0.25), math.log(0.4), math.nan]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    ln2 = math.log(2)
    torch.testing.assert_close(
        kl_k1_per_token(logp_p, logp_q, mask), torch.tensor([[ln2, -ln2, 0.0]], dtype=torch.float64)
    )
    torch.testing.assert_close(
        kl_k3_per_token(logp_p, logp_q, mask), torch.tensor([[ln2 - 0.5, 1 - ln2, 0.0]], dtype=torch.float64)
    )
    torch.testing.assert_close(kl_k1(logp_p, logp_q, mask), torch.tensor(0.0, dtype=torch.float64))
    torch.testing.assert_close(kl_k3(logp_p, logp_q, mask), torch.tensor(0.25, dtype=torch.float64))  # (0.193+0.307)/2


def test_k3_nonnegative_and_zero_when_equal():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    b = a + torch.randn(5, 7, generator=gen, dtype=torch.float64)
    mask = torch.ones(5, 7, dtype=torch.bool)
    assert (kl_k3_per_token(a, b, mask) >= 0).all()
    assert kl_k3(a, a, mask).item() == 0.0
    assert kl_k1(a, a, mask).item() == 0.0


def test_empty_mask_gives_nan():
    x = torch.zeros(2, 3)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    assert math.isnan(kl_k3(x, x, mask).item())


def test_estimators_are_unbiased_for_kl_p_q():
    # Exact expectation over tokens y ~ p of a categorical: sum_y p(y) k(y) must equal KL(p || q), computed
    # independently by torch.distributions.
    gen = torch.Generator().manual_seed(1)
    p = torch.distributions.Categorical(logits=torch.randn(6, generator=gen, dtype=torch.float64))
    q = torch.distributions.Categorical(logits=torch.randn(6, generator=gen, dtype=torch.float64))
    tokens = torch.arange(6)
    logp_p = p.log_prob(tokens)[None, :]  # [1, 6]: one "sequence" holding every token once
    logp_q = q.log_prob(tokens)[None, :]
    mask = torch.ones(1, 6, dtype=torch.bool)
    weights = p.probs[None, :]
    expected = torch.distributions.kl_divergence(p, q)
    torch.testing.assert_close((weights * kl_k1_per_token(logp_p, logp_q, mask)).sum(), expected)
    torch.testing.assert_close((weights * kl_k3_per_token(logp_p, logp_q, mask)).sum(), expected)
