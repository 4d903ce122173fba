"""Response masks and masked reductions shared by the RL objectives.

A response mask ``mask`` is ``[batch, seq]``: ``True`` (or 1) on the response tokens that enter the loss,
``False`` (or 0) on prompt, padding and any other excluded token. Values at masked positions of the other
tensors are never read: they are replaced with a neutral value via ``torch.where`` *before* any arithmetic,
so padding that holds NaN or -inf cannot leak into a loss, a metric or a gradient (``x * mask`` would turn
``NaN * 0`` into NaN).
"""

from __future__ import annotations

import torch


def as_bool_mask(mask: torch.Tensor, shape: torch.Size | tuple[int, ...], name: str = "mask") -> torch.Tensor:
    """Validate a response mask and return it as a bool tensor.

    Args:
        mask: ``[batch, seq]`` bool, or integer / floating tensor holding only 0 and 1.
        shape: the shape the mask must have (that of the log-prob tensors it masks).
        name: the argument name used in error messages.

    Returns:
        ``[batch, seq]`` bool tensor.
    """
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(mask.shape)}; expected {tuple(shape)} (that of logp)")
    if mask.dtype == torch.bool:
        return mask
    if mask.is_floating_point() or mask.dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError(f"{name} must hold only 0 and 1 (or be bool); fractional weights are not supported")
        return mask != 0
    raise ValueError(f"{name} must be bool, integer or floating, got {mask.dtype}")


def masked_fill_zero(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x`` on response tokens, exactly 0 elsewhere (NaN/inf padding included). Shapes broadcast."""
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def response_lengths(mask: torch.Tensor) -> torch.Tensor:
    """Number of response tokens per row: ``[batch, seq]`` bool -> ``[batch]`` int64."""
    return mask.sum(dim=-1)


def masked_row_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over each row's response tokens: ``[batch, seq]`` -> ``[batch]``; 0 for an empty row."""
    lengths = response_lengths(mask).clamp(min=1).to(x.dtype)  # [batch]
    return masked_fill_zero(x, mask).sum(dim=-1) / lengths  # [batch]


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over all response tokens of the batch (0-dim); NaN when there are none."""
    count = mask.sum()
    total = masked_fill_zero(x, mask).sum()
    return total / count.to(x.dtype)  # 0 / 0 -> NaN: an empty set has no mean
