"""Diagnostics returned with every policy loss: ratio statistics, clip fractions, old -> new KL, counts.

All values are detached 0-dim tensors. Statistics are pooled over the whole batch: token statistics over
all response tokens, sequence statistics over the rows with at least one response token. A statistic of an
empty set (no response token in the batch) is NaN. Standard deviations and variances are population ones
(divide by ``n``), so a single token or sequence gives 0, not NaN.
The key table, with meanings, is in docs/objectives.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moestab.metrics.clipping import clipped_fraction
from moestab.rl.kl import kl_k1, kl_k3
from moestab.rl.masking import response_lengths
from moestab.rl.ratios import sequence_log_ratios, token_log_ratios


@dataclass(frozen=True)
class ClipFlags:
    """Which ratios a loss clipped, at the level where it clips ("units") and per token.

    Attributes:
        unit_low: bool, ``[batch, seq]`` (token units) or ``[batch]`` (sequence units): clipped at the lower bound.
        unit_high: same shape: clipped at the upper bound.
        unit_valid: same shape: the unit exists (a response token, or a non-empty row).
        token_low: ``[batch, seq]`` bool: the ratio governing this response token was clipped low
            (for sequence units, every response token of a clipped sequence); False at masked positions.
        token_high: ``[batch, seq]`` bool, likewise for the upper bound.
    """

    unit_low: torch.Tensor
    unit_high: torch.Tensor
    unit_valid: torch.Tensor
    token_low: torch.Tensor
    token_high: torch.Tensor

    @property
    def token_clipped(self) -> torch.Tensor:
        """``[batch, seq]`` bool: the token's governing ratio was clipped (either side)."""
        return self.token_low | self.token_high

    @staticmethod
    def from_tokens(low: torch.Tensor, high: torch.Tensor, mask: torch.Tensor) -> ClipFlags:
        """Flags of a token-level clip; ``low``/``high`` are ``[batch, seq]`` and get masked here."""
        low, high = low & mask, high & mask  # [batch, seq]
        return ClipFlags(low, high, mask, low, high)

    @staticmethod
    def from_sequences(low: torch.Tensor, high: torch.Tensor, mask: torch.Tensor) -> ClipFlags:
        """Flags of a sequence-level clip; ``low``/``high`` are ``[batch]``, broadcast to the row's tokens."""
        valid = response_lengths(mask) > 0  # [batch]
        low, high = low & valid, high & valid  # [batch]
        return ClipFlags(low, high, valid, low[:, None] & mask, high[:, None] & mask)


def _fraction(flags: torch.Tensor, valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return clipped_fraction(flags, valid).to(dtype)  # the one definition of a clip fraction; NaN when nothing is valid


def clip_metrics(flags: ClipFlags, mask: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Clip fractions at the loss's clipping level and token-weighted.

    Keys: ``clip/low_frac``, ``clip/high_frac``, ``clip/frac`` (fractions of units: tokens for token-level
    clipping, non-empty sequences for sequence-level clipping) and ``clip/token_low_frac``,
    ``clip/token_high_frac``, ``clip/token_frac`` (fractions of response tokens whose governing ratio was
    clipped, comparable across levels as in GSPO §5.2). Each is :func:`moestab.metrics.clipping.clipped_fraction`
    over this minibatch, the definition the step's ``clip/*`` metrics use over all its tokens.
    """
    unit_any = flags.unit_low | flags.unit_high
    return {
        "clip/low_frac": _fraction(flags.unit_low, flags.unit_valid, dtype),
        "clip/high_frac": _fraction(flags.unit_high, flags.unit_valid, dtype),
        "clip/frac": _fraction(unit_any, flags.unit_valid, dtype),
        "clip/token_low_frac": _fraction(flags.token_low, mask, dtype),
        "clip/token_high_frac": _fraction(flags.token_high, mask, dtype),
        "clip/token_frac": _fraction(flags.token_clipped, mask, dtype),
    }


def _summary(values: torch.Tensor, prefix: str) -> dict[str, torch.Tensor]:
    """mean / std / min / max of a 1-D tensor (NaN when empty)."""
    if values.numel() == 0:
        nan = torch.full((), float("nan"), dtype=values.dtype, device=values.device)
        return {f"{prefix}_mean": nan, f"{prefix}_std": nan, f"{prefix}_min": nan, f"{prefix}_max": nan}
    return {
        f"{prefix}_mean": values.mean(),
        f"{prefix}_std": values.std(correction=0),
        f"{prefix}_min": values.min(),
        f"{prefix}_max": values.max(),
    }


def _variance(values: torch.Tensor) -> torch.Tensor:
    if values.numel() == 0:
        return torch.full((), float("nan"), dtype=values.dtype, device=values.device)
    return values.var(correction=0)


@torch.no_grad()
def ratio_metrics(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Token and sequence ratio statistics, old -> new KL and counts.

    Args:
        logp: ``[batch, seq]`` log-probs under ``pi``.
        old_logp: ``[batch, seq]`` log-probs under ``pi_old``.
        mask: ``[batch, seq]`` bool response mask.

    Returns:
        ``ratio/token_{mean,std,min,max}`` of ``w``; ``ratio/seq_{mean,std,min,max}`` of ``s``;
        ``ratio/token_log_var`` (variance of ``log w``), ``ratio/seq_log_var`` (variance of ``log s``);
        ``kl/old_new_k1``, ``kl/old_new_k3`` (``p = pi_old``, ``q = pi``); ``count/tokens``, ``count/seqs``.
    """
    log_w = token_log_ratios(logp, old_logp, mask)[mask]  # [tokens]
    seq_valid = response_lengths(mask) > 0  # [batch]
    log_s = sequence_log_ratios(logp, old_logp, mask)[seq_valid]  # [seqs]
    dtype = log_w.dtype
    out: dict[str, torch.Tensor] = {}
    out.update(_summary(torch.exp(log_w), "ratio/token"))
    out.update(_summary(torch.exp(log_s), "ratio/seq"))
    out["ratio/token_log_var"] = _variance(log_w)
    out["ratio/seq_log_var"] = _variance(log_s)
    out["kl/old_new_k1"] = kl_k1(old_logp.detach(), logp.detach(), mask)
    out["kl/old_new_k3"] = kl_k3(old_logp.detach(), logp.detach(), mask)
    out["count/tokens"] = mask.sum().to(dtype)
    out["count/seqs"] = seq_valid.sum().to(dtype)
    return out
