"""Loss aggregation: how per-token loss terms ``[batch, seq]`` become one scalar.

Sequence-level losses (GSPO, GMPO) broadcast each sequence's term to its response tokens first, as TRL does,
so every mode applies to every loss.

- ``seq-mean-token-mean`` (GRPO, arXiv 2402.03300; GSPO Eq. 5 when the term is per sequence):
  ``1/G' sum_i 1/|y_i| sum_t l[i,t]``.
- ``token-mean`` (DAPO, arXiv 2503.14476): ``sum_{i,t} l[i,t] / sum_i |y_i|``.
- ``seq-mean-token-sum-norm`` (Dr. GRPO, arXiv 2503.20783): ``1/G' sum_i (sum_t l[i,t]) / C`` with a constant
  ``C`` passed as ``norm_constant`` (e.g. the maximum response length), independent of the sampled lengths.

``G'`` counts the rows with at least one response token: an all-masked row contributes nothing, neither to
the sum nor to the count, so padding the batch with empty rows never changes the loss. (TRL's ``grpo`` and
``dr_grpo`` divide by the full batch size instead; the two agree whenever no row is empty.)
An entirely empty batch gives a loss of exactly 0 with a zero gradient.

Splitting a batch over data-parallel ranks / micro-batches: the global loss is the sum over shards of
``shard_loss * shard_weight / global_weight``, with weight = response tokens for ``token-mean`` and non-empty
rows for the two ``seq-mean`` modes (metrics ``count/tokens`` and ``count/seqs`` report both).
"""

from __future__ import annotations

import math

import torch

from moestab.rl.errors import UnknownNameError
from moestab.rl.masking import masked_fill_zero, response_lengths

AGGREGATIONS = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")

AGGREGATION_INPUTS: dict[str, tuple[str, ...]] = {"seq-mean-token-sum-norm": ("norm_constant",)}
"""Keyword arguments an aggregation needs from the caller (the trainer fills them from its settings)."""
"""Valid values of the ``aggregation`` argument of every loss."""


def check_aggregation(aggregation: str, norm_constant: float | None) -> None:
    """Raise if ``aggregation`` is unknown, or ``seq-mean-token-sum-norm`` lacks a positive ``norm_constant``."""
    if aggregation not in AGGREGATIONS:
        raise UnknownNameError("aggregation", aggregation, AGGREGATIONS)
    if aggregation == "seq-mean-token-sum-norm" and not (
        isinstance(norm_constant, (int, float)) and math.isfinite(norm_constant) and norm_constant > 0
    ):
        raise ValueError(
            "aggregation 'seq-mean-token-sum-norm' needs norm_constant, a finite number > 0 "
            f"(e.g. the maximum response length in tokens); got {norm_constant!r}"
        )


def aggregate(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    *,
    aggregation: str,
    norm_constant: float | None = None,
) -> torch.Tensor:
    """Reduce per-token loss terms to a scalar.

    Args:
        per_token_loss: ``[batch, seq]``; values at masked positions are ignored (even NaN).
        mask: ``[batch, seq]`` bool response mask.
        aggregation: one of ``AGGREGATIONS``.
        norm_constant: the constant ``C`` of ``seq-mean-token-sum-norm`` (required there, unused otherwise).

    Returns:
        0-dim loss.
    """
    check_aggregation(aggregation, norm_constant)
    terms = masked_fill_zero(per_token_loss, mask)  # [batch, seq]
    lengths = response_lengths(mask)  # [batch]
    if aggregation == "token-mean":
        return terms.sum() / lengths.sum().clamp(min=1).to(terms.dtype)
    num_seqs = (lengths > 0).sum().clamp(min=1).to(terms.dtype)  # non-empty rows
    if aggregation == "seq-mean-token-mean":
        row_means = terms.sum(dim=-1) / lengths.clamp(min=1).to(terms.dtype)  # [batch]
        return row_means.sum() / num_seqs
    return terms.sum() / float(norm_constant) / num_seqs  # seq-mean-token-sum-norm


def shard_weight(mask: torch.Tensor, aggregation: str) -> int:
    """The weight of the shard with response ``mask`` ``[batch, seq]`` in the global loss (module docstring):
    its response tokens for ``token-mean``, its non-empty rows for the ``seq-mean`` modes."""
    if aggregation not in AGGREGATIONS:
        raise UnknownNameError("aggregation", aggregation, AGGREGATIONS)
    if aggregation == "token-mean":
        return int(mask.sum())
    return int((response_lengths(mask) > 0).sum())
