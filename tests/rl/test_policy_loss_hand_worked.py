"""policy_loss (ppo-clip) on tiny batches worked out by hand: values, gradients, metrics, clipped flags."""

from __future__ import annotations

import math

import pytest
import torch

from moestab.rl import compute_clipped_mask, policy_loss
from tests.support.rl import grad_of

F64 = torch.float64
LN = math.log


def _token_case():
    """Four rows, clip range [1 - 0.2, 1 + 0.28] = [0.8, 1.28], per-sequence advantages.

    row 0, A = +1: w = [1.5, 1.1, 0.5]
        t0: 1.5 > 1.28 and A > 0 -> clipped high: term = -min(1.5, 1.28) = -1.28, gradient 0
        t1: inside: term = -1.1, d term / d logp = -A w = -1.1
        t2: 0.5 < 0.8 but A > 0 -> not clipped (min picks 0.5): term = -0.5, gradient -0.5
    row 1, A = -2: w = [1.5, 0.5, pad=NaN]
        t0: A < 0, w above range -> unclipped: term = -min(-3, -2.56) = 3, gradient -A w = 3
        t1: 0.5 < 0.8 and A < 0 -> clipped low: term = -min(-1, -1.6) = 1.6, gradient 0
    row 2: all masked (garbage values): contributes nothing
    row 3, A = 0.5: length-1 response with w = 1: term = -0.5, gradient -0.5
    """
    old = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, math.nan], [math.inf, 0.0, -1.0], [-0.3, 0.0, 0.0]], dtype=F64)
    log_w = torch.tensor(
        [[LN(1.5), LN(1.1), LN(0.5)], [LN(1.5), LN(0.5), 0.0], [0.0, math.nan, 5.0], [0.0, 0.0, 0.0]], dtype=F64
    )
    logp = (old + log_w).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0], [1, 0, 0]], dtype=torch.bool)
    advantages = torch.tensor([1.0, -2.0, 7.0, 0.5], dtype=F64)
    return logp, old, advantages, mask


TOKEN_TERMS = torch.tensor([[-1.28, -1.1, -0.5], [3.0, 1.6, 0.0], [0.0, 0.0, 0.0], [-0.5, 0.0, 0.0]], dtype=F64)
TOKEN_TERM_GRADS = torch.tensor([[0.0, -1.1, -0.5], [3.0, 0.0, 0.0], [0.0, 0.0, 0.0], [-0.5, 0.0, 0.0]], dtype=F64)
TOKEN_LENGTHS = torch.tensor([3.0, 2.0, 1.0, 1.0], dtype=F64)[:, None]  # row 2's count is irrelevant (all 0)


@pytest.mark.parametrize(
    ("aggregation", "expected", "grad_scale"),
    [
        # row means: (-1.28 - 1.1 - 0.5)/3 = -0.96, (3 + 1.6)/2 = 2.3, -0.5; 3 non-empty rows:
        # (-0.96 + 2.3 - 0.5) / 3 = 0.28; gradient of a term = term grad / |y_i| / 3
        ("seq-mean-token-mean", 0.28, 1 / (3 * TOKEN_LENGTHS)),
        # sum of terms = -2.88 + 4.6 - 0.5 = 1.22 over 6 tokens = 0.2033...; gradient = term grad / 6
        ("token-mean", 1.22 / 6, torch.tensor(1 / 6, dtype=F64)),
        # Dr. GRPO with C = 4: 1.22 / 4 / 3 rows = 0.101666...; gradient = term grad / 12
        ("seq-mean-token-sum-norm", 1.22 / 12, torch.tensor(1 / 12, dtype=F64)),
    ],
)
def test_token_level_values_and_gradients(aggregation, expected, grad_scale):
    logp, old, adv, mask = _token_case()
    loss, _ = policy_loss(
        logp, old, adv, mask, level="token", clip_low=0.2, clip_high=0.28, aggregation=aggregation, norm_constant=4
    )
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=F64))
    torch.testing.assert_close(grad_of(loss, logp), TOKEN_TERM_GRADS * grad_scale)


def test_token_level_metrics_and_clipped_flags():
    logp, old, adv, mask = _token_case()
    kwargs = dict(level="token", clip_low=0.2, clip_high=0.28, aggregation="seq-mean-token-mean")
    _, m = policy_loss(logp, old, adv, mask, **kwargs)
    # 6 response tokens; one clipped high (row 0 t0), one clipped low (row 1 t1).
    assert m["clip/high_frac"].item() == pytest.approx(1 / 6)
    assert m["clip/low_frac"].item() == pytest.approx(1 / 6)
    assert m["clip/frac"].item() == pytest.approx(2 / 6)
    assert m["clip/token_frac"].item() == pytest.approx(2 / 6)  # token level: same as the level fraction
    # w over response tokens: [1.5, 1.1, 0.5, 1.5, 0.5, 1.0]: mean 6.1/6, min 0.5, max 1.5
    w = torch.tensor([1.5, 1.1, 0.5, 1.5, 0.5, 1.0], dtype=F64)
    assert m["ratio/token_mean"].item() == pytest.approx(6.1 / 6)
    assert m["ratio/token_std"].item() == pytest.approx(w.std(correction=0).item())
    assert (m["ratio/token_min"].item(), m["ratio/token_max"].item()) == pytest.approx((0.5, 1.5))
    assert m["ratio/token_log_var"].item() == pytest.approx(w.log().var(correction=0).item())
    # s = [(1.5 * 1.1 * 0.5)^(1/3), (1.5 * 0.5)^(1/2), 1] over the 3 non-empty rows
    s = torch.tensor([0.825 ** (1 / 3), 0.75**0.5, 1.0], dtype=F64)
    assert m["ratio/seq_mean"].item() == pytest.approx(s.mean().item())
    assert m["ratio/seq_min"].item() == pytest.approx(0.75**0.5)
    assert m["ratio/seq_log_var"].item() == pytest.approx(s.log().var(correction=0).item())
    # old -> new KL over tokens: k1 = mean(-log w), k3 = mean(w - 1 - log w)
    assert m["kl/old_new_k1"].item() == pytest.approx((-w.log()).mean().item())
    assert m["kl/old_new_k3"].item() == pytest.approx((w - 1 - w.log()).mean().item())
    assert (m["count/tokens"].item(), m["count/seqs"].item()) == (6, 3)
    assert m["objective/policy_loss"].item() == pytest.approx(0.28)
    assert m["objective/kl_penalty"].item() == 0.0 and math.isnan(m["kl/ref_k3"].item())
    assert all(v.dim() == 0 and not v.requires_grad for v in m.values())
    clipped = compute_clipped_mask("ppo-clip", logp=logp, old_logp=old, advantages=adv, mask=mask, **kwargs)
    expected = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 0, 0], [0, 0, 0]], dtype=torch.bool)
    assert torch.equal(clipped, expected)


def _sequence_case():
    """GSPO, clip range [0.8, 1.28] (wide, to make the arithmetic readable), per-sequence advantages.

    row 0, A = +1: log w = [ln 2, ln 2, 0] -> s = 2^(2/3) = 1.5874 > 1.28 -> clipped high, term -1.28, grad 0
    row 1, A = +1: log w = [ln .5, ln .5]  -> s = 0.5 < 0.8, A > 0 -> unclipped, term -0.5,
                                              d term / d logp[1,t] = -A s / |y| = -0.25
    row 2, A = -1: log w = [ln .5, 0]      -> s = 0.7071 < 0.8, A < 0 -> clipped low, term -min(-.7071, -.8) = 0.8
    row 3: all masked
    row 4, A = -1: log w = [ln 1.2]        -> s = 1.2 inside, term 1.2, gradient -A s / 1 = 1.2
    seq-mean-token-mean over 4 non-empty rows: (-1.28 - 0.5 + 0.8 + 1.2) / 4 = 0.055
    """
    log_w = torch.tensor(
        [[LN(2), LN(2), 0.0], [LN(0.5), LN(0.5), 0.0], [LN(0.5), 0.0, 0.0], [0.0, 0.0, 0.0], [LN(1.2), 0.0, 0.0]],
        dtype=F64,
    )
    old = torch.full((5, 3), -1.0, dtype=F64)
    logp = (old + log_w).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0], [0, 0, 0], [1, 0, 0]], dtype=torch.bool)
    advantages = torch.tensor([1.0, 1.0, -1.0, 3.0, -1.0], dtype=F64)
    return logp, old, advantages, mask


@pytest.mark.parametrize("level", ["sequence", "sequence-token"])
def test_sequence_level_values_gradients_and_metrics(level):
    logp, old, adv, mask = _sequence_case()
    kwargs = dict(level=level, clip_low=0.2, clip_high=0.28, aggregation="seq-mean-token-mean")
    loss, m = policy_loss(logp, old, adv, mask, **kwargs)
    torch.testing.assert_close(loss, torch.tensor(0.055, dtype=F64))
    expected_grad = torch.zeros(5, 3, dtype=F64)
    expected_grad[1, :2] = -0.25 / 4
    expected_grad[4, 0] = 1.2 / 4
    torch.testing.assert_close(grad_of(loss, logp), expected_grad)
    # Token-weighted: clipped tokens are row 0's 3 (high) and row 2's 2 (low) out of 3 + 2 + 2 + 1 = 8.
    assert m["clip/token_high_frac"].item() == pytest.approx(3 / 8)
    assert m["clip/token_low_frac"].item() == pytest.approx(2 / 8)
    assert m["clip/token_frac"].item() == pytest.approx(5 / 8)
    if level == "sequence":  # level fractions are per sequence: 1 of 4 high, 1 of 4 low
        assert (m["clip/high_frac"].item(), m["clip/low_frac"].item()) == pytest.approx((1 / 4, 1 / 4))
    else:  # GSPO-token clips per token (with the same decisions, so the same token fractions)
        assert (m["clip/high_frac"].item(), m["clip/low_frac"].item()) == pytest.approx((3 / 8, 2 / 8))
    assert m["ratio/seq_max"].item() == pytest.approx(2 ** (2 / 3))
    clipped = compute_clipped_mask("ppo-clip", logp=logp, old_logp=old, advantages=adv, mask=mask, **kwargs)
    expected = torch.tensor([[1, 1, 1], [0, 0, 0], [1, 1, 0], [0, 0, 0], [0, 0, 0]], dtype=torch.bool)
    assert torch.equal(clipped, expected)


def test_kl_penalty_hand_worked():
    # One token, logp = ln 0.5, ref = ln 0.25, old = logp (w = 1), A = 0: the policy term is 0.
    # k3(pi -> ref) = e^(ref - logp) - (ref - logp) - 1 = 0.5 + ln 2 - 1 = 0.193147; with kl_coef 0.1 -> 0.0193147
    # d/d logp = kl_coef * (1 - e^(ref - logp)) = 0.1 * 0.5 = 0.05
    logp = torch.tensor([[LN(0.5)]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[LN(0.25)]], dtype=F64)
    loss, m = policy_loss(
        logp,
        logp.detach(),
        torch.zeros(1, dtype=F64),
        torch.ones(1, 1, dtype=torch.bool),
        level="token",
        clip_low=0.2,
        clip_high=0.2,
        aggregation="token-mean",
        kl_coef=0.1,
        ref_logp=ref,
    )
    k3 = 0.5 + math.log(2) - 1
    torch.testing.assert_close(loss, torch.tensor(0.1 * k3, dtype=F64))
    torch.testing.assert_close(grad_of(loss, logp), torch.tensor([[0.05]], dtype=F64))
    assert m["kl/ref_k3"].item() == pytest.approx(k3)
    assert m["objective/kl_penalty"].item() == pytest.approx(0.1 * k3)
    assert m["objective/policy_loss"].item() == 0.0


def test_per_token_advantages_token_level():
    # Row of 2 tokens, w = [1, 1] (logp = old), A = [2, -1]: terms = [-2, 1], mean = -0.5;
    # gradient = -A / 2 = [-1, 0.5].
    logp = torch.tensor([[-1.0, -2.0]], dtype=F64, requires_grad=True)
    loss, _ = policy_loss(
        logp,
        logp.detach(),
        torch.tensor([[2.0, -1.0]], dtype=F64),
        torch.ones(1, 2, dtype=torch.bool),
        level="token",
        clip_low=0.2,
        clip_high=0.2,
        aggregation="seq-mean-token-mean",
    )
    torch.testing.assert_close(loss, torch.tensor(-0.5, dtype=F64))
    torch.testing.assert_close(grad_of(loss, logp), torch.tensor([[-1.0, 0.5]], dtype=F64))
