"""moestab.models.precision: a float64 model's RMSNorms compute in float64 (issue 40.7), other dtypes untouched."""

import pytest
import torch

from moestab.models import build_embedded_policy
from moestab.models.precision import float64_norms


def _policy(dtype: torch.dtype):
    model, _ = build_embedded_policy()
    model.config._experts_implementation = "eager"  # the grouped kernels take <= float32 (as load_policy asks)
    return model.to(dtype)


def _float64_rmsnorm(norm, x):
    """Qwen3-MoE's RMSNorm written out in float64: weight * x / sqrt(mean(x^2) + eps)."""
    return norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))


def test_a_float64_norm_computes_in_float64_forward_and_backward():
    model = _policy(torch.float64)
    norm = model.model.layers[0].input_layernorm
    x = torch.randn(2, 5, 128, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    want = _float64_rmsnorm(norm, x)
    # The family's own norm rounds its input to float32: ~1e-7 relative, far above float64 rounding (the cause).
    assert float(((norm(x) - want).abs() / want.abs()).max()) > 1e-9
    handles = float64_norms(model)
    assert len(handles) == 2 * 17  # 4 layers x (input, post-attention, q, k) + the final norm, two hooks each
    got = norm(x)
    assert got.dtype == torch.float64 and torch.equal(got, want)  # the same float64 operations, bit for bit
    grad_got, = torch.autograd.grad(got.square().sum(), x)
    grad_want, = torch.autograd.grad(want.square().sum(), x)
    assert torch.equal(grad_got, grad_want)


def test_removing_the_handles_restores_the_family_math_and_other_dtypes_are_untouched():
    ids = torch.randint(3, 80, (2, 9), generator=torch.Generator().manual_seed(1))
    model = _policy(torch.float64)
    stock = model(input_ids=ids).logits
    handles = float64_norms(model)
    assert not torch.equal(model(input_ids=ids).logits, stock)
    for handle in handles:
        handle.remove()
    assert torch.equal(model(input_ids=ids).logits, stock)
    model32 = _policy(torch.float32)
    stock32 = model32(input_ids=ids).logits
    float64_norms(model32)
    assert torch.equal(model32(input_ids=ids).logits, stock32)


def test_a_norm_that_raises_leaves_no_float64_casts_behind():
    model = _policy(torch.float64)
    float64_norms(model)
    with pytest.raises(RuntimeError):
        model.model.norm(torch.zeros(3, 7, dtype=torch.float64))  # hidden size 7, weight 128: the product fails
    assert torch.zeros(2, dtype=torch.float64).to(torch.float32).dtype == torch.float32
