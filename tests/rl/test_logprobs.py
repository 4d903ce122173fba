"""token_logprobs / token_entropy: hand-worked values, naive log_softmax reference, gradcheck, TRL helpers."""

from __future__ import annotations

import math

import pytest
import torch

from moestab.rl import token_entropy, token_logprobs


def _naive_logprobs(logits, tokens, temperature=1.0):
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)


def _naive_entropy(logits, temperature=1.0):
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def test_hand_worked_two_token_vocab():
    # logits [0, ln 3]: softmax = [1/4, 3/4]; log p(token 1) = ln(3/4); log p(token 0) = ln(1/4).
    # Entropy = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.5623351446...
    # Temperature 2: logits / 2 = [0, ln sqrt(3)]: softmax = [1/(1+sqrt3), sqrt3/(1+sqrt3)].
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]], dtype=torch.float64)  # [1, 2, 2]
    tokens = torch.tensor([[1, 0]])  # [1, 2]
    out = token_logprobs(logits, tokens)
    torch.testing.assert_close(out, torch.tensor([[math.log(0.75), math.log(0.25)]], dtype=torch.float64))
    ent = token_entropy(logits)
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    torch.testing.assert_close(ent, torch.full((1, 2), expected, dtype=torch.float64))
    s3 = math.sqrt(3.0)
    out_t2 = token_logprobs(logits, tokens, temperature=2.0)
    torch.testing.assert_close(
        out_t2, torch.tensor([[math.log(s3 / (1 + s3)), math.log(1 / (1 + s3))]], dtype=torch.float64)
    )


@pytest.mark.parametrize("chunk_rows", [1, 3, 7, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_naive_values_and_gradients(chunk_rows, temperature):
    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(3, 5, 11, generator=gen, dtype=torch.float64)).requires_grad_(True)  # [3, 5, 11]
    tokens = torch.randint(0, 11, (3, 5), generator=gen)  # [3, 5]
    weights = torch.randn(3, 5, generator=gen, dtype=torch.float64)  # arbitrary upstream gradient

    ours = token_logprobs(logits, tokens, temperature=temperature, chunk_rows=chunk_rows)
    ref = _naive_logprobs(logits, tokens, temperature)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    (g_ours,) = torch.autograd.grad((ours * weights).sum(), logits)
    (g_ref,) = torch.autograd.grad((ref * weights).sum(), logits)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-12, atol=1e-12)

    ent = token_entropy(logits, temperature=temperature, chunk_rows=chunk_rows)
    ent_ref = _naive_entropy(logits, temperature)
    torch.testing.assert_close(ent, ent_ref, rtol=1e-12, atol=1e-12)
    (g_ent,) = torch.autograd.grad((ent * weights).sum(), logits)
    (g_ent_ref,) = torch.autograd.grad((ent_ref * weights).sum(), logits)
    torch.testing.assert_close(g_ent, g_ent_ref, rtol=1e-10, atol=1e-12)


def test_gradcheck():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, 5, (2, 3), generator=gen)
    assert torch.autograd.gradcheck(lambda x: token_logprobs(x, tokens, temperature=0.8, chunk_rows=2), (logits,))
    assert torch.autograd.gradcheck(lambda x: token_entropy(x, temperature=1.3, chunk_rows=4), (logits,))


def test_minus_inf_logits_give_finite_entropy_and_gradient():
    # Vocabulary entries masked to -inf have p = 0 and contribute 0 to the entropy (not 0 * -inf = NaN).
    # Row [0, 0, -inf]: uniform over two tokens -> entropy ln 2.
    logits = torch.tensor([[[0.0, 0.0, -math.inf]]], dtype=torch.float64, requires_grad=True)  # [1, 1, 3]
    ent = token_entropy(logits)
    torch.testing.assert_close(ent, torch.tensor([[math.log(2.0)]], dtype=torch.float64))
    (grad,) = torch.autograd.grad(ent.sum(), logits)
    assert torch.isfinite(grad).all()
    lp = token_logprobs(logits, torch.tensor([[1]]))
    torch.testing.assert_close(lp, torch.tensor([[math.log(0.5)]], dtype=torch.float64))


def test_low_precision_logits_are_upcast():
    gen = torch.Generator().manual_seed(2)
    logits32 = torch.randn(2, 4, 9, generator=gen)
    tokens = torch.randint(0, 9, (2, 4), generator=gen)
    logits16 = logits32.to(torch.bfloat16).requires_grad_(True)
    out = token_logprobs(logits16, tokens)
    assert out.dtype == torch.float32
    # Same as the naive computation on the bf16 values upcast to float32.
    torch.testing.assert_close(out, _naive_logprobs(logits16.detach().float(), tokens), rtol=1e-6, atol=1e-6)
    (grad,) = torch.autograd.grad(out.sum(), logits16)
    assert grad.dtype == torch.bfloat16


def test_matches_trl_helpers():
    trl_utils = pytest.importorskip("trl.trainer.utils")
    gen = torch.Generator().manual_seed(3)
    logits = 2 * torch.randn(4, 6, 13, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, 13, (4, 6), generator=gen)
    torch.testing.assert_close(
        token_logprobs(logits, tokens, temperature=0.9),
        trl_utils.selective_log_softmax(logits, tokens, temperature=0.9),
        rtol=1e-12,
        atol=1e-12,
    )
    torch.testing.assert_close(
        token_entropy(logits), trl_utils.entropy_from_logits(logits, chunk_size=5), rtol=1e-12, atol=1e-12
    )


def test_bad_inputs_are_rejected_with_clear_errors():
    logits = torch.zeros(2, 3, 5)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 5\)"):
        token_logprobs(logits, torch.full((2, 3), 5))
    with pytest.raises(ValueError, match="tokens has shape"):
        token_logprobs(logits, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="integer tensor"):
        token_logprobs(logits, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, torch.zeros(2, 3, dtype=torch.long), temperature=0.0)
    with pytest.raises(ValueError, match="chunk_rows"):
        token_entropy(logits, chunk_rows=0)
    with pytest.raises(ValueError, match="floating point"):
        token_entropy(torch.zeros(2, 3, 5, dtype=torch.long))


def test_backward_keeps_no_vocab_sized_copy():
    """Everything autograd saves is either the logits themselves or one value per row: no [rows, vocab]
    log-softmax / softmax / scaled copy survives until backward (the naive path saves one, checked too)."""
    logits = torch.randn(4, 8, 50, requires_grad=True)  # 32 rows, vocab 50
    tokens = torch.randint(0, 50, (4, 8))
    saved: list[tuple[int, int]] = []

    def pack(t):
        saved.append((t.data_ptr(), t.numel()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_logprobs(logits, tokens, temperature=0.7, chunk_rows=5)
        token_entropy(logits, temperature=0.7, chunk_rows=5)
    copies = [numel for ptr, numel in saved if ptr != logits.data_ptr()]
    assert saved and max(copies) <= 32

    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _naive_logprobs(logits, tokens, 0.7)
    assert max(numel for ptr, numel in saved if ptr != logits.data_ptr()) == 32 * 50
