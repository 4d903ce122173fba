"""Token, sequence and GSPO-token ratios: hand-worked values, masking, stop-gradient structure."""

from __future__ import annotations

import math

import torch

from moestab.rl import sequence_log_ratios, sequence_ratios, sequence_token_ratios, token_ratios


def _inputs():
    # Row 0: log w = [ln 2, ln 0.5, ln 3] -> s = (2 * 0.5 * 3)^(1/3) = 3^(1/3) = 1.442250
    # Row 1: log w = [ln 1.5, pad, pad]  -> s = 1.5 (length-1 response); pads hold NaN / inf garbage
    # Row 2: all masked                  -> s = 1 (log s = 0), w = 1 everywhere, no NaN
    old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, math.nan, -1.0], [math.nan, math.inf, -1.0]], dtype=torch.float64)
    log_w = torch.tensor(
        [[math.log(2), math.log(0.5), math.log(3)], [math.log(1.5), 0.0, math.nan], [0.0, 0.0, 0.0]],
        dtype=torch.float64,
    )
    logp = (old + log_w).requires_grad_(True)
    mask = torch.tensor([[True, True, True], [True, False, False], [False, False, False]])
    return logp, old, mask


def test_token_ratios_hand_worked():
    logp, old, mask = _inputs()
    w = token_ratios(logp, old, mask)
    expected = torch.tensor([[2.0, 0.5, 3.0], [1.5, 1.0, 1.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(w, expected)


def test_sequence_ratios_hand_worked_and_gradient():
    logp, old, mask = _inputs()
    s = sequence_ratios(logp, old, mask)
    torch.testing.assert_close(s, torch.tensor([3 ** (1 / 3), 1.5, 1.0], dtype=torch.float64))
    torch.testing.assert_close(sequence_log_ratios(logp, old, mask)[2], torch.tensor(0.0, dtype=torch.float64))
    # d s_i / d logp[i,t] = s_i / |y_i| on response tokens, 0 on pads (NaN pads must not poison it).
    (grad,) = torch.autograd.grad(s.sum(), logp)
    expected = torch.tensor([[3 ** (1 / 3) / 3] * 3, [1.5, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected)


def test_sequence_token_ratio_value_is_s_and_gradient_is_own_token():
    logp, old, mask = _inputs()
    s = sequence_ratios(logp, old, mask).detach()
    s_tok = sequence_token_ratios(logp, old, mask)
    # Value: s_i on every response token (bit for bit), 1 on masked positions.
    assert torch.equal(s_tok[0], s[0].expand(3))
    assert s_tok[1, 0] == s[1] and torch.equal(s_tok[2], torch.ones(3, dtype=torch.float64))
    # Gradient of s_tok[0, 1] alone: only logp[0, 1] receives s_0 (sg on everything else).
    (grad,) = torch.autograd.grad(s_tok[0, 1], logp)
    expected = torch.zeros(3, 3, dtype=torch.float64)
    expected[0, 1] = s[0]
    torch.testing.assert_close(grad, expected)
