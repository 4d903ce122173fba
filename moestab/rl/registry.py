"""The by-name calling surface of the policy losses, used by the trainer and the integrations.

``LOSSES`` maps a name to its ``Objective`` (``moestab.rl.objectives``), filled by the ``@objective`` declarations
in ``moestab.rl.losses``, which this module imports so that every registered loss is there. Each is callable as
``(logp, old_logp, advantages, mask, *, level, clip_low, clip_high, aggregation, norm_constant=None, kl_coef=0.0,
ref_logp=None, **its own inputs) -> (loss, metrics)``; ``Objective.parts`` returns ``LossParts`` (loss, metrics and
the per-token ``clipped`` flags).
"""

from __future__ import annotations

from typing import Any

import torch

from moestab.rl import losses as _losses  # noqa: F401  (its @objective declarations fill LOSSES)
from moestab.rl.errors import lookup
from moestab.rl.objectives import LOSSES, LossParts, Objective

__all__ = ["LOSSES", "compute_clipped_mask", "compute_loss_parts", "compute_policy_loss", "get_loss"]


def get_loss(name: str) -> Objective:
    """The loss registered as ``name``; ``UnknownNameError`` (lists valid names) otherwise."""
    return lookup(LOSSES, name, "policy loss")


def compute_policy_loss(name: str, /, **kwargs: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Evaluate the loss registered as ``name`` with keyword arguments only.

    ``kwargs`` are the loss's arguments by name: ``logp``, ``old_logp``, ``advantages``, ``mask``, ``level``,
    ``clip_low``, ``clip_high``, ``aggregation``, optional ``norm_constant``, ``kl_coef``, ``ref_logp``, and
    the loss's own ones (``get_loss(name).inputs``). A missing or unexpected keyword is a ``TypeError`` naming it.

    Returns:
        ``(loss, metrics)``.
    """
    return get_loss(name)(**kwargs)


def compute_loss_parts(name: str, /, **kwargs: Any) -> LossParts:
    """Like ``compute_policy_loss`` but returns ``LossParts`` (loss, metrics, per-token ``clipped``)."""
    return get_loss(name).parts(**kwargs)


def compute_clipped_mask(name: str, /, **kwargs: Any) -> torch.Tensor:
    """``[batch, seq]`` bool: response tokens whose governing ratio the loss ``name`` clipped.

    Takes exactly the keyword arguments of ``compute_policy_loss`` (so the trainer can pass the same dict) and
    evaluates the loss without autograd; for sequence-level clipping every token of a clipped sequence is True.
    Masked positions are False.
    """
    with torch.no_grad():
        return compute_loss_parts(name, **kwargs).clipped
