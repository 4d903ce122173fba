"""Group-relative advantage estimators, registered by name.

Rewards are ``[batch]``; groups are consecutive blocks of ``group_size`` responses to the same prompt
(``rewards.view(-1, group_size)``), the layout GRPO / GSPO / TRL use.

- ``group-normalized`` (GRPO, DeepSeekMath arXiv 2402.03300; GSPO arXiv 2507.18071 Eq. 6):
  ``A_i = (r_i - mean(r_group)) / std(r_group)``, with the Bessel-corrected (``n - 1``) standard deviation,
  as TRL (``nanstd``) and verl (``torch.std``) compute it.
- ``group-centered`` (Dr. GRPO, arXiv 2503.20783): ``A_i = r_i - mean(r_group)``, no division by the std.

Zero-variance groups. A group whose rewards are all equal (every response right, or every one wrong) gets
advantage exactly 0 in both estimators. This is decided by ``max == min`` on the group, not by a tolerance:
the floating-point group mean of equal values can differ from them by an ulp (``(0.1 + 0.1 + 0.1) / 3 !=
0.1``), and ``tiny / tiny`` would then hand the group advantages of order +-1 instead of 0.

Epsilon. We do **not** add TRL's ``std + 1e-4``: for a group with nonzero variance the result is exactly
``(r - mean) / std``. The std is only clamped below at ``torch.finfo(dtype).tiny`` (~1e-38 in float32),
which can bind only if every deviation underflows when squared, i.e. never for real rewards. TRL's epsilon
shrinks advantages by ``std / (std + 1e-4)``: a relative 3e-4 for 0/1 rewards with G = 8 (std >= 0.35).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from moestab.rl.errors import lookup


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Validate ``rewards`` ``[batch]`` and view it as ``[groups, group_size]`` in a floating dtype."""
    if not (isinstance(group_size, int) and group_size >= 1):
        raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [batch], got shape {tuple(rewards.shape)}")
    if rewards.numel() % group_size != 0:
        raise ValueError(
            f"batch of {rewards.numel()} rewards is not a whole number of groups of size {group_size}; "
            "groups are consecutive blocks of group_size responses to the same prompt"
        )
    dtype = torch.promote_types(rewards.dtype, torch.float32)
    rewards = rewards.detach().to(dtype)
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards must be finite (no NaN / inf)")
    return rewards.view(-1, group_size)  # [groups, group_size]


def _centered_and_constant(grouped: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``r - group mean`` ``[groups, group_size]`` and the per-group ``all equal`` flag ``[groups, 1]``."""
    constant = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)  # [groups, 1]
    centered = grouped - grouped.mean(dim=1, keepdim=True)  # [groups, group_size]
    return torch.where(constant, torch.zeros_like(centered), centered), constant


def group_centered_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dr. GRPO advantage ``r_i - mean(r_group)`` (arXiv 2503.20783); exactly 0 for constant groups.

    Args:
        rewards: ``[batch]`` sequence rewards, ``batch`` a multiple of ``group_size``.
        group_size: responses per prompt (G).

    Returns:
        ``[batch]`` advantages in ``promote_types(rewards.dtype, float32)``.
    """
    centered, _ = _centered_and_constant(_grouped(rewards, group_size))  # [groups, group_size]
    return centered.reshape(-1)  # [batch]


def group_normalized_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """GRPO / GSPO advantage ``(r_i - mean(r_group)) / std(r_group)`` (GSPO Eq. 6), Bessel-corrected std.

    Constant groups (including ``group_size == 1``) give exactly 0; no epsilon is added to the std (see the
    module docstring for why, and for the difference from TRL's ``std + 1e-4``).

    Args:
        rewards: ``[batch]`` sequence rewards, ``batch`` a multiple of ``group_size``.
        group_size: responses per prompt (G).

    Returns:
        ``[batch]`` advantages in ``promote_types(rewards.dtype, float32)``.
    """
    grouped = _grouped(rewards, group_size)  # [groups, group_size]
    centered, constant = _centered_and_constant(grouped)  # [groups, group_size], [groups, 1]
    dof = max(group_size - 1, 1)
    std = (centered.square().sum(dim=1, keepdim=True) / dof).sqrt()  # [groups, 1]
    std = std.clamp(min=torch.finfo(std.dtype).tiny)
    advantages = torch.where(constant, torch.zeros_like(centered), centered / std)  # [groups, group_size]
    return advantages.reshape(-1)  # [batch]


ADVANTAGE_ESTIMATORS: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "group-normalized": group_normalized_advantages,
    "group-centered": group_centered_advantages,
}
"""Advantage estimators by name; each maps ``(rewards [batch], group_size)`` to ``[batch]`` advantages."""


def compute_advantages(name: str, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Run the advantage estimator registered as ``name`` (``ADVANTAGE_ESTIMATORS``).

    Args:
        name: ``"group-normalized"`` or ``"group-centered"``.
        rewards: ``[batch]`` sequence rewards, consecutive groups of ``group_size``.
        group_size: responses per prompt (G).

    Returns:
        ``[batch]`` advantages.

    Raises:
        UnknownNameError: ``name`` is not registered (the message lists the valid names).
    """
    return lookup(ADVANTAGE_ESTIMATORS, name, "advantage estimator")(rewards, group_size)
