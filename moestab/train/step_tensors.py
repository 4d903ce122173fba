"""``StepTensors``: everything one RL step computed per sequence and response token, for metrics and records."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moestab.routing import Routes
from moestab.tasks import Example
from moestab.train.batch import RolloutBatch


@dataclass(frozen=True)
class StepTensors:
    """One step's per-token results. Token tensors are ``[B, T]`` (response positions); route tensors
    ``[B, L, layers, top_k]`` over the trainer's input positions (see :mod:`moestab.train.batch`).

    pi_old is kept on both sides: *as used in the ratio* (``logp_old`` / ``routes_old``: the rollout
    engine's routes under R3) and with the trainer's *free* routing (``logp_old_free`` /
    ``routes_old_free``); without R3 the two are identical.
    """

    batch: RolloutBatch
    examples: list[Example]
    rewards: torch.Tensor  # [B] task reward plus any shaping
    correct: torch.Tensor  # [B] bool: the task scores the response correct
    advantages: torch.Tensor  # [B]
    minibatch: torch.Tensor  # [B] 0-based index of the minibatch that updated each sequence
    logp_old: torch.Tensor  # [B, T] pi_old as used in the ratio
    logp_old_free: torch.Tensor  # [B, T] pi_old, free routing
    logp_update: torch.Tensor  # [B, T] at each sequence's minibatch update (replay as configured)
    logp_new: torch.Tensor  # [B, T] after all updates, free routing
    clipped: torch.Tensor  # [B, T] bool: the token's governing ratio was clipped
    routes_old: torch.Tensor  # [B, L, layers, k] routes that produced logp_old
    routes_old_free: Routes  # free routes under pi_old, with router margin and entropy
    routes_update: torch.Tensor  # [B, L, layers, k] routes that produced logp_update
    routes_new: Routes  # free routes after all updates

    @property
    def log_w(self) -> torch.Tensor:
        """``[B, T]`` the token log-ratio that entered the loss."""
        return self.logp_update - self.logp_old

    def response(self, per_position: torch.Tensor) -> torch.Tensor:
        """``[B, L, ...]`` per input position -> ``[tokens, ...]`` at the response tokens, in row-major order.

        A response token's routes are those of the input position whose logits score it (docs/run-format.md).
        """
        return per_position[:, self.batch.prompt_len - 1 :][self.batch.response_mask]

    def tokens(self, per_token: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` -> ``[tokens]`` at the response tokens, in row-major order."""
        return per_token[self.batch.response_mask]

    def per_token(self, per_sequence: torch.Tensor) -> torch.Tensor:
        """``[B]`` -> ``[tokens]``: each response token gets its sequence's value."""
        mask = self.batch.response_mask
        return per_sequence[:, None].expand(mask.shape)[mask]
