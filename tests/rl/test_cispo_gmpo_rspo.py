"""CISPO, GMPO and RSPO: hand-worked cases and their relations to the plain clipped surrogate."""

from __future__ import annotations

import math

import pytest
import torch

from moestab.rl import (
    cispo_loss,
    compute_clipped_mask,
    compute_loss_parts,
    gmpo_loss,
    policy_loss,
    router_shift_weights,
    rspo_loss,
)
from tests.support.rl import grad_of, random_batch

F64 = torch.float64
LN = math.log
TOL = {"rtol": 1e-12, "atol": 1e-14}


# ------------------------------------------------------------------------------------------------ CISPO


def _cispo_case():
    # row 0, A = +1: t0 logp = ln .3, old = ln .2 -> w = 1.5; t1 logp = ln .3, old = ln .6 -> w = 0.5
    # row 1, A = -1: t0 logp = ln .4, old = ln .2 -> w = 2;   t1 padding
    logp = torch.tensor([[LN(0.3), LN(0.3)], [LN(0.4), 0.0]], dtype=F64, requires_grad=True)
    old = torch.tensor([[LN(0.2), LN(0.6)], [LN(0.2), 0.0]], dtype=F64)
    mask = torch.tensor([[True, True], [True, False]])
    return logp, old, torch.tensor([1.0, -1.0], dtype=F64), mask


def test_cispo_hand_worked():
    # clip_low = 1 (no lower bound), clip_high = 0.2: weights sg(clip(w, 0, 1.2)) = [1.2, 0.5, 1.2]
    # terms -weight * A * logp: -1.2 ln .3 = 1.444767, -0.5 ln .3 = 0.601986, +1.2 ln .4 = -1.099549
    # token-mean: (1.444767 + 0.601986 - 1.099549) / 3 = 0.315735
    # gradient: -weight * A / 3 = [-0.4, -0.166667], [0.4]: clipped tokens keep a (bounded) gradient.
    logp, old, adv, mask = _cispo_case()
    kwargs = dict(level="token", clip_low=1.0, clip_high=0.2, aggregation="token-mean")
    loss, m = cispo_loss(logp, old, adv, mask, **kwargs)
    expected = (-1.2 * LN(0.3) - 0.5 * LN(0.3) + 1.2 * LN(0.4)) / 3
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=F64))
    torch.testing.assert_close(grad_of(loss, logp), torch.tensor([[-0.4, -0.5 / 3], [0.4, 0.0]], dtype=F64))
    # Clipped = weight truncated, whatever the sign of A: tokens (0,0) and (1,0), both high.
    assert m["clip/high_frac"].item() == pytest.approx(2 / 3) and m["clip/low_frac"].item() == 0
    clipped = compute_clipped_mask("cispo", logp=logp, old_logp=old, advantages=adv, mask=mask, **kwargs)
    assert torch.equal(clipped, torch.tensor([[True, False], [True, False]]))


def test_cispo_lower_bound():
    # clip_low = 0.2: token (0,1) with w = 0.5 gets weight 0.8 and counts as clipped low; gradient -0.8 / 3.
    logp, old, adv, mask = _cispo_case()
    loss, m = cispo_loss(logp, old, adv, mask, level="token", clip_low=0.2, clip_high=0.2, aggregation="token-mean")
    assert grad_of(loss, logp)[0, 1].item() == pytest.approx(-0.8 / 3)
    assert m["clip/low_frac"].item() == pytest.approx(1 / 3)


# ------------------------------------------------------------------------------------------------- GMPO


def test_gmpo_hand_worked():
    # Log-space clip [-0.4, 0.4].
    # row 0, A = +1, log w = [0.6, -0.2]: A > 0 keeps min(log w, clip) = [0.4 (clipped), -0.2]
    #   geometric mean ratio e^((0.4 - 0.2)/2) = e^0.1 = 1.105171; term -A e^0.1 = -1.105171
    #   gradient: t0 0 (clipped), t1 -A e^0.1 / 2 = -0.552585
    # row 1, A = -2, log w = [-0.6, 0.3]: A < 0 keeps max(log w, clip) = [-0.4 (clipped), 0.3]
    #   ratio e^(-0.05) = 0.951229; term -A e^-0.05 = 1.902459; gradient t1: -A e^-0.05 / 2 = 0.951229
    # seq-mean-token-mean over 2 rows: (-1.105171 + 1.902459) / 2 = 0.398644; gradients / 2
    old = torch.full((2, 2), -1.0, dtype=F64)
    logp = (old + torch.tensor([[0.6, -0.2], [-0.6, 0.3]], dtype=F64)).requires_grad_(True)
    adv = torch.tensor([1.0, -2.0], dtype=F64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    loss, m = gmpo_loss(
        logp, old, adv, mask, level="token", clip_low=0.4, clip_high=0.4, aggregation="seq-mean-token-mean"
    )
    torch.testing.assert_close(loss, torch.tensor((-math.exp(0.1) + 2 * math.exp(-0.05)) / 2, dtype=F64))
    expected_grad = torch.tensor([[0.0, -math.exp(0.1) / 2], [0.0, math.exp(-0.05)]], dtype=F64) / 2
    torch.testing.assert_close(grad_of(loss, logp), expected_grad)
    assert m["clip/high_frac"].item() == pytest.approx(1 / 4) and m["clip/low_frac"].item() == pytest.approx(1 / 4)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "token-mean"])
def test_gmpo_without_active_clip_is_the_unclipped_gspo_objective(seed, aggregation):
    # With bounds no token reaches, GMPO's term is -A_i * geomean(w_i) = -A_i * s_i: GSPO's unclipped term.
    batch = random_batch(seed, 5, 7, empty_rows=True)
    common = dict(logp=batch["logp"], old_logp=batch["old_logp"], advantages=batch["advantages"], mask=batch["mask"])
    gmpo, _ = gmpo_loss(**common, level="token", clip_low=50.0, clip_high=50.0, aggregation=aggregation)
    gspo, _ = policy_loss(**common, level="sequence", clip_low=1.0, clip_high=1e9, aggregation=aggregation)
    torch.testing.assert_close(gmpo, gspo, **TOL)
    torch.testing.assert_close(grad_of(gmpo, batch["logp"]), grad_of(gspo, batch["logp"]), **TOL)


def test_gmpo_clipped_tokens_have_zero_gradient():
    batch = random_batch(7, 6, 9, scale=0.6)
    common = dict(logp=batch["logp"], old_logp=batch["old_logp"], advantages=batch["advantages"], mask=batch["mask"])
    kwargs = dict(level="token", clip_low=0.4, clip_high=0.4, aggregation="seq-mean-token-mean")
    parts = compute_loss_parts("gmpo", **common, **kwargs)
    grad = grad_of(parts.loss, batch["logp"])
    assert parts.clipped.any() and (batch["mask"] & ~parts.clipped).any()
    assert (grad[parts.clipped] == 0).all()
    assert (grad[batch["mask"] & ~parts.clipped] != 0).all()


def test_gmpo_rejects_per_token_advantages():
    batch = random_batch(0, 2, 3, per_token_advantages=True)
    with pytest.raises(ValueError, match="one advantage per sequence"):
        gmpo_loss(**batch, level="token", clip_low=0.4, clip_high=0.4, aggregation="seq-mean-token-mean")


# ------------------------------------------------------------------------------------------------- RSPO


def test_router_shift_weight_hand_worked():
    # One token, L = 2 layers, K = 2 experts; new - old router log-probs of the old experts:
    #   layer 0: [0.1, -0.3] -> mean |.| = 0.2;  layer 1: [0.2, 0.0] -> 0.1;  mean over layers 0.15
    #   gamma = e^-0.15 = 0.860708
    # Second token: shift 5 in every slot -> e^-5 = 0.0067 < gamma_min = 0.1 -> floored to 0.1.
    # Third token: masked (NaN router values are not read) -> 1.
    old = torch.zeros(1, 3, 2, 2, dtype=F64)
    new = torch.tensor(
        [[[[0.1, -0.3], [0.2, 0.0]], [[5.0, -5.0], [5.0, 5.0]], [[math.nan, 0.0], [0.0, 0.0]]]], dtype=F64
    ).requires_grad_(True)
    mask = torch.tensor([[True, True, False]])
    gamma = router_shift_weights(new, old, mask, gamma_min=0.1)
    torch.testing.assert_close(gamma, torch.tensor([[math.exp(-0.15), 0.1, 1.0]], dtype=F64))
    assert not gamma.requires_grad  # stop-gradient


def _router_inputs(batch, seed, scale):
    gen = torch.Generator().manual_seed(seed)
    b, t = batch["mask"].shape
    old = -torch.rand(b, t, 3, 2, generator=gen, dtype=F64) * 2  # [batch, seq, layers, top_k]
    new = old + scale * torch.randn(b, t, 3, 2, generator=gen, dtype=F64)
    return new, old


@pytest.mark.parametrize("level", ["token", "sequence", "sequence-token"])
def test_rspo_with_unchanged_router_is_the_base_loss(level):
    batch = random_batch(1, 5, 6, scale=0.05 if level != "token" else 0.3)
    kwargs = dict(level=level, clip_low=0.01, clip_high=0.015, aggregation="seq-mean-token-mean")
    _, old = _router_inputs(batch, 0, 0.0)
    rspo, m = rspo_loss(**batch, **kwargs, router_logp_new=old, router_logp_old=old, gamma_min=0.1)
    base, _ = policy_loss(**batch, **kwargs)
    torch.testing.assert_close(rspo, base, **TOL)
    assert m["rspo/gamma_mean"].item() == 1.0 and m["rspo/floor_frac"].item() == 0.0


def test_rspo_weights_each_token_term_by_gamma():
    # Token level, seq-mean-token-mean: d loss / d logp[i,t] = gamma[i,t] * (base gradient)[i,t], and the
    # clip decisions (flags, clip metrics) are the base loss's.
    batch = random_batch(2, 6, 8, scale=0.4)
    mask = batch["mask"]
    kwargs = dict(level="token", clip_low=0.2, clip_high=0.28, aggregation="seq-mean-token-mean")
    new, old = _router_inputs(batch, 1, 1.0)
    gamma = router_shift_weights(new, old, mask, gamma_min=0.5)
    # floor active on some response tokens, not all; 1 on padding
    assert (gamma[mask] == 0.5).any() and (gamma[mask] > 0.5).any() and (gamma[~mask] == 1).all()
    rspo = compute_loss_parts("rspo", **batch, **kwargs, router_logp_new=new, router_logp_old=old, gamma_min=0.5)
    base = compute_loss_parts("ppo-clip", **batch, **kwargs)
    torch.testing.assert_close(grad_of(rspo.loss, batch["logp"]), gamma * grad_of(base.loss, batch["logp"]), **TOL)
    assert torch.equal(rspo.clipped, base.clipped)
    assert rspo.metrics["clip/frac"] == base.metrics["clip/frac"]
    assert rspo.metrics["rspo/gamma_mean"].item() == pytest.approx(gamma[mask].mean().item())
    assert rspo.metrics["rspo/gamma_min"].item() == pytest.approx(0.5)
    assert rspo.metrics["rspo/floor_frac"].item() == pytest.approx((gamma[mask] == 0.5).double().mean().item())


def test_rspo_constant_gamma_scales_the_loss():
    # Every slot shifted by ln 2 -> gamma = e^-ln2 = 0.5 on every token: loss and gradient halve.
    batch = random_batch(4, 4, 5)
    kwargs = dict(level="sequence", clip_low=0.2, clip_high=0.28, aggregation="token-mean")
    old = torch.zeros(4, 5, 2, 3, dtype=F64)
    rspo, _ = rspo_loss(**batch, **kwargs, router_logp_new=old + LN(2), router_logp_old=old, gamma_min=0.1)
    base, _ = policy_loss(**batch, **kwargs)
    torch.testing.assert_close(rspo, 0.5 * base, **TOL)


def test_rspo_input_errors():
    batch = random_batch(0, 2, 3)
    kwargs = dict(level="token", clip_low=0.2, clip_high=0.2, aggregation="token-mean")
    good = torch.zeros(2, 3, 1, 2)
    with pytest.raises(ValueError, match="gamma_min"):
        rspo_loss(**batch, **kwargs, router_logp_new=good, router_logp_old=good, gamma_min=1.5)
    with pytest.raises(ValueError, match=r"\[batch, seq, layers, top_k\]"):
        rspo_loss(**batch, **kwargs, router_logp_new=good, router_logp_old=torch.zeros(2, 3, 2, 2), gamma_min=0.1)
    with pytest.raises(ValueError, match="expected"):
        rspo_loss(
            **batch,
            **kwargs,
            router_logp_new=torch.zeros(2, 4, 1, 2),
            router_logp_old=torch.zeros(2, 4, 1, 2),
            gamma_min=0.1,
        )
    with pytest.raises(TypeError, match="gamma_min"):
        rspo_loss(**batch, **kwargs, router_logp_new=good, router_logp_old=good)
