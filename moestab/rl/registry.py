"""Policy losses registered by name, and the by-name calling surface used by the trainer.

``LOSSES`` maps a name to a pure function ``(logp, old_logp, advantages, mask, *, level, clip_low, clip_high,
aggregation, norm_constant=None, kl_coef=0.0, ref_logp=None, **loss_specific) -> (loss, metrics)``
(see ``moestab.rl.losses``). ``LOSS_PARTS`` maps the same names to the functions returning ``LossParts``
(loss, metrics and the per-token ``clipped`` flags).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from moestab.rl.errors import lookup
from moestab.rl.losses import (
    LossParts,
    cispo_loss,
    cispo_loss_parts,
    gmpo_loss,
    gmpo_loss_parts,
    policy_loss,
    policy_loss_parts,
    rspo_loss,
    rspo_loss_parts,
)

LossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]

LOSSES: dict[str, LossFn] = {
    "ppo-clip": policy_loss,
    "cispo": cispo_loss,
    "gmpo": gmpo_loss,
    "rspo": rspo_loss,
}
"""Policy losses by name."""

LOSS_PARTS: dict[str, Callable[..., LossParts]] = {
    "ppo-clip": policy_loss_parts,
    "cispo": cispo_loss_parts,
    "gmpo": gmpo_loss_parts,
    "rspo": rspo_loss_parts,
}
"""The same losses, returning ``LossParts`` (with the per-token clipped flags)."""

LOSS_SPECIFIC_INPUTS: dict[str, tuple[str, ...]] = {
    "ppo-clip": (),
    "cispo": (),
    "gmpo": (),
    "rspo": ("router_logp_new", "router_logp_old", "gamma_min"),
}
"""Keyword arguments a loss takes beyond the common ones: the tensors the trainer must compute for it
(``router_logp_*``) and the settings its preset fixes (``gamma_min``)."""


def get_loss(name: str) -> LossFn:
    """The loss registered as ``name``; ``UnknownNameError`` (lists valid names) otherwise."""
    return lookup(LOSSES, name, "policy loss")


def compute_policy_loss(name: str, /, **kwargs: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Evaluate the loss registered as ``name`` with keyword arguments only.

    ``kwargs`` are the loss's arguments by name: ``logp``, ``old_logp``, ``advantages``, ``mask``, ``level``,
    ``clip_low``, ``clip_high``, ``aggregation``, optional ``norm_constant``, ``kl_coef``, ``ref_logp``, and
    the loss-specific ones (``LOSS_SPECIFIC_INPUTS``). A missing or unexpected keyword is a ``TypeError``
    naming it.

    Returns:
        ``(loss, metrics)``.
    """
    return get_loss(name)(**kwargs)


def compute_loss_parts(name: str, /, **kwargs: Any) -> LossParts:
    """Like ``compute_policy_loss`` but returns ``LossParts`` (loss, metrics, per-token ``clipped``)."""
    return lookup(LOSS_PARTS, name, "policy loss")(**kwargs)


def compute_clipped_mask(name: str, /, **kwargs: Any) -> torch.Tensor:
    """``[batch, seq]`` bool: response tokens whose governing ratio the loss ``name`` clipped.

    Takes exactly the keyword arguments of ``compute_policy_loss`` (so the trainer can pass the same dict) and
    evaluates the loss without autograd; for sequence-level clipping every token of a clipped sequence is True.
    Masked positions are False.
    """
    with torch.no_grad():
        return compute_loss_parts(name, **kwargs).clipped
