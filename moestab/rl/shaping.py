"""Reward shaping applied before advantages: DAPO's overlong penalty.

DAPO (arXiv 2503.14476, §3.4, "overlong reward shaping"), with maximum length ``L_max`` and cache
``L_cache``, adds to the task reward of a response of length ``|y|``:

- ``0`` if ``|y| <= L_max - L_cache``;
- ``((L_max - L_cache) - |y|) / L_cache`` if ``L_max - L_cache < |y| <= L_max`` (from 0 down to -1);
- ``-1`` if ``|y| > L_max``.

The paper used ``L_max`` 20,480 and ``L_cache`` 4,096 (a fifth of it) on 16,384-token generations.
"""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_length: int, cache: int) -> torch.Tensor:
    """``[B]`` penalty in ``[-1, 0]`` for response lengths ``lengths`` ``[B]`` (tokens).

    Raises ``ValueError`` unless ``0 < cache <= max_length``.
    """
    if not 0 < cache <= max_length:
        raise ValueError(f"overlong cache must be in 1..max_length={max_length}, got {cache}")
    soft = max_length - cache  # lengths up to here are free
    lengths = lengths.to(torch.float64)  # [B]
    ramp = (soft - lengths) / cache  # [B], 0 at soft, -1 at max_length
    penalty = torch.where(lengths <= soft, torch.zeros_like(ramp), ramp)
    return torch.where(lengths > max_length, torch.full_like(ramp, -1.0), penalty)  # [B]
