"""Shared builders for the moestab.rl tests (random but seeded inputs)."""

from __future__ import annotations

import torch


def random_batch(
    seed: int,
    batch: int,
    seq: int,
    *,
    scale: float = 0.3,
    dtype: torch.dtype = torch.float64,
    empty_rows: bool = False,
    per_token_advantages: bool = False,
) -> dict[str, torch.Tensor]:
    """logp (leaf, requires grad), old_logp, advantages, mask for a batch of right-padded responses.

    Every row has 1..seq response tokens (0 allowed when ``empty_rows``); ``logp - old_logp`` ~ N(0, scale^2),
    so with scale ~0.3 some token ratios leave a (0.2, 0.28) clip range and some stay inside.
    """
    gen = torch.Generator().manual_seed(seed)
    old_logp = -torch.rand(batch, seq, generator=gen, dtype=dtype) * 3 - 0.05  # [batch, seq], log-probs < 0
    logp = (old_logp + scale * torch.randn(batch, seq, generator=gen, dtype=dtype)).requires_grad_(True)
    low = 0 if empty_rows else 1
    lengths = torch.randint(low, seq + 1, (batch,), generator=gen)  # [batch]
    mask = torch.arange(seq)[None, :] < lengths[:, None]  # [batch, seq]
    if per_token_advantages:
        advantages = torch.randn(batch, seq, generator=gen, dtype=dtype)  # [batch, seq]
    else:
        advantages = torch.randn(batch, generator=gen, dtype=dtype)  # [batch]
    return {"logp": logp, "old_logp": old_logp, "advantages": advantages, "mask": mask}


def grad_of(loss: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """d loss / d logp, ``[batch, seq]``."""
    (grad,) = torch.autograd.grad(loss, logp)
    return grad
