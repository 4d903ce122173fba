"""Policy losses: PPO-style clipped surrogate at token / sequence / sequence-token level, CISPO, GMPO, RSPO.

Every loss is a pure function of explicit tensors and keyword arguments, with the common signature

    fn(logp, old_logp, advantages, mask, *, level, clip_low, clip_high, aggregation,
       norm_constant=None, kl_coef=0.0, ref_logp=None, **loss_specific) -> (loss, metrics)

- ``logp`` ``[batch, seq]``: log-probs of the response tokens under the current policy (carries the gradient).
- ``old_logp`` ``[batch, seq]``: the same tokens under ``pi_old`` (constant).
- ``advantages``: ``[batch]`` (one per sequence) or ``[batch, seq]`` (one per token); constant.
- ``mask`` ``[batch, seq]``: response mask (bool, or 0/1).
- ``level``: which ratio is clipped, ``token`` | ``sequence`` | ``sequence-token`` (``LEVELS``).
- ``clip_low``, ``clip_high``: asymmetric clip range (DAPO clip-higher): the ratio is clipped to
  ``[1 - clip_low, 1 + clip_high]`` (GMPO: the log-ratio to ``[-clip_low, clip_high]``).
- ``aggregation``, ``norm_constant``: see ``moestab.rl.aggregation``.
- ``kl_coef``, ``ref_logp``: optional k3 penalty against a reference policy, ``kl_coef * k3(pi -> pi_ref)``
  added per token before aggregation (DeepSeekMath GRPO Eq. 3-4); ``kl_coef = 0`` (default) needs no
  reference. When ``ref_logp`` is given the metric ``kl/ref_k3`` reports the token-mean k3.

``loss`` is the 0-dim quantity to minimise (the negated objective); ``metrics`` maps namespaced keys to detached
0-dim tensors (see ``moestab.rl.metrics`` and docs/objectives.md).

Each ``*_parts`` function also returns the per-token ``clipped`` flags (``LossParts``); the registry exposes them
as ``compute_clipped_mask``. All computation runs in ``promote_types(logp.dtype, float32)``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from moestab.rl.aggregation import aggregate, check_aggregation
from moestab.rl.errors import UnknownNameError
from moestab.rl.kl import kl_k3, kl_k3_per_token
from moestab.rl.masking import as_bool_mask, masked_fill_zero, masked_mean, masked_row_mean, response_lengths
from moestab.rl.metrics import ClipFlags, clip_metrics, ratio_metrics
from moestab.rl.ratios import sequence_ratios, sequence_token_ratios, token_log_ratios, token_ratios
from moestab.rl.router_shift import check_gamma_min, router_shift_weights

LEVELS = ("token", "sequence", "sequence-token")
"""Valid values of ``level``: the ratio a loss clips (GRPO token ratio, GSPO sequence ratio, GSPO-token)."""


@dataclass(frozen=True)
class LossParts:
    """Everything one loss evaluation produces.

    Attributes:
        loss: 0-dim loss to minimise.
        metrics: namespaced detached 0-dim tensors.
        clipped: ``[batch, seq]`` bool, True on response tokens whose governing ratio was clipped (for a
            sequence-level clip, every token of the clipped sequence); False on masked positions. This is the
            per-token ``clipped`` column of the run format.
    """

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor]
    clipped: torch.Tensor


@dataclass(frozen=True)
class _Inputs:
    logp: torch.Tensor  # [batch, seq], compute dtype, with grad
    old_logp: torch.Tensor  # [batch, seq], detached
    mask: torch.Tensor  # [batch, seq] bool
    adv_token: torch.Tensor  # [batch, seq], detached (per-sequence advantages broadcast)
    adv_seq: torch.Tensor | None  # [batch] when advantages were given per sequence, else None


def _check_finite_on(x: torch.Tensor, where: torch.Tensor, name: str) -> None:
    if not bool(torch.isfinite(x.detach()[where]).all()):
        raise ValueError(f"{name} has NaN or inf values on response tokens")


def _prepare(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> _Inputs:
    if not isinstance(logp, torch.Tensor) or logp.dim() != 2 or not logp.is_floating_point():
        shape = tuple(logp.shape) if isinstance(logp, torch.Tensor) else type(logp).__name__
        raise ValueError(f"logp must be a floating [batch, seq] tensor, got {shape}")
    dtype = torch.promote_types(logp.dtype, torch.float32)
    if tuple(old_logp.shape) != tuple(logp.shape):
        raise ValueError(f"old_logp has shape {tuple(old_logp.shape)}; expected {tuple(logp.shape)} (that of logp)")
    mask = as_bool_mask(mask, logp.shape)
    if advantages.dim() == 1 and advantages.shape[0] == logp.shape[0]:
        adv_seq = advantages.detach().to(dtype)  # [batch]
        _check_finite_on(adv_seq, response_lengths(mask) > 0, "advantages")
        adv_token = adv_seq[:, None].expand(logp.shape)  # [batch, seq]
    elif tuple(advantages.shape) == tuple(logp.shape):
        adv_seq = None
        adv_token = advantages.detach().to(dtype)  # [batch, seq]
        _check_finite_on(adv_token, mask, "advantages")
    else:
        raise ValueError(
            f"advantages has shape {tuple(advantages.shape)}; expected [batch] = ({logp.shape[0]},) "
            f"or [batch, seq] = {tuple(logp.shape)}"
        )
    logp = logp.to(dtype)
    old_logp = old_logp.detach().to(dtype)
    _check_finite_on(logp, mask, "logp")
    _check_finite_on(old_logp, mask, "old_logp")
    return _Inputs(logp, old_logp, mask, adv_token, adv_seq)


def _check_level(level: str, supported: tuple[str, ...], loss_name: str) -> None:
    if level not in supported:
        raise UnknownNameError(f"level for loss {loss_name!r}", level, supported)


def _check_clip(clip_low: float, clip_high: float, *, log_space: bool) -> None:
    for name, value in (("clip_low", clip_low), ("clip_high", clip_high)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if not log_space and clip_low > 1:
        raise ValueError(f"clip_low must be <= 1 (the ratio's lower bound 1 - clip_low is >= 0), got {clip_low}")


def _check_kl(kl_coef: float, ref_logp: torch.Tensor | None, shape: torch.Size) -> None:
    if not (isinstance(kl_coef, (int, float)) and math.isfinite(kl_coef) and kl_coef >= 0):
        raise ValueError(f"kl_coef must be a finite number >= 0, got {kl_coef!r}")
    if kl_coef > 0 and ref_logp is None:
        raise ValueError("kl_coef > 0 needs ref_logp, the [batch, seq] log-probs under the reference policy")
    if ref_logp is not None and tuple(ref_logp.shape) != tuple(shape):
        raise ValueError(f"ref_logp has shape {tuple(ref_logp.shape)}; expected {tuple(shape)} (that of logp)")


def _check_common(
    clip_low: float,
    clip_high: float,
    aggregation: str,
    norm_constant: float | None,
    kl_coef: float,
    ref_logp: torch.Tensor | None,
    shape: torch.Size,
    *,
    log_space: bool = False,
) -> None:
    _check_clip(clip_low, clip_high, log_space=log_space)
    check_aggregation(aggregation, norm_constant)
    _check_kl(kl_coef, ref_logp, shape)


def _surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate, negated: ``-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)``.

    Returns the loss terms and the (low, high) flags of the units whose clipped branch is the active one,
    which are exactly the units with zero gradient: ``r < 1 - clip_low`` with ``A < 0``, ``r > 1 + clip_high``
    with ``A > 0``. Shapes: all as ``ratio`` (``[batch, seq]`` or ``[batch]``).
    """
    clipped_ratio = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    terms = -torch.min(ratio * adv, clipped_ratio * adv)
    low = (ratio < 1.0 - clip_low) & (adv < 0)
    high = (ratio > 1.0 + clip_high) & (adv > 0)
    return terms, low, high


def _clipped_surrogate_terms(
    inp: _Inputs, *, level: str, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, ClipFlags]:
    """Per-token loss terms ``[batch, seq]`` of the clipped surrogate at ``level``, and its clip flags."""
    mask = inp.mask
    if level == "token":
        ratio = token_ratios(inp.logp, inp.old_logp, mask)  # [batch, seq]
        terms, low, high = _surrogate(ratio, inp.adv_token, clip_low, clip_high)  # [batch, seq]
        return terms, ClipFlags.from_tokens(low, high, mask)
    if level == "sequence":
        if inp.adv_seq is None:
            raise ValueError(
                "level 'sequence' (GSPO) needs one advantage per sequence, advantages of shape [batch]; "
                "for per-token advantages use level 'sequence-token' (GSPO-token)"
            )
        ratio = sequence_ratios(inp.logp, inp.old_logp, mask)  # [batch]
        seq_terms, low, high = _surrogate(ratio, inp.adv_seq, clip_low, clip_high)  # [batch]
        return seq_terms[:, None].expand(mask.shape), ClipFlags.from_sequences(low, high, mask)
    # sequence-token (GSPO-token): ratio value s_i, gradient through each token's own log-prob.
    ratio = sequence_token_ratios(inp.logp, inp.old_logp, mask)  # [batch, seq]
    terms, low, high = _surrogate(ratio, inp.adv_token, clip_low, clip_high)  # [batch, seq]
    return terms, ClipFlags.from_tokens(low, high, mask)


def _finish(
    inp: _Inputs,
    per_token_loss: torch.Tensor,
    flags: ClipFlags,
    *,
    aggregation: str,
    norm_constant: float | None,
    kl_coef: float,
    ref_logp: torch.Tensor | None,
    extra_metrics: dict[str, torch.Tensor] | None = None,
) -> LossParts:
    """Aggregate, add the reference KL penalty, and assemble the metrics."""
    mask = inp.mask
    dtype = inp.logp.dtype
    policy = aggregate(per_token_loss, mask, aggregation=aggregation, norm_constant=norm_constant)
    loss = policy
    penalty = torch.zeros((), dtype=dtype, device=inp.logp.device)
    ref_k3 = torch.full((), float("nan"), dtype=dtype, device=inp.logp.device)
    if ref_logp is not None:
        ref = ref_logp.detach().to(dtype)  # [batch, seq]
        _check_finite_on(ref, mask, "ref_logp")
        # k3 with p = pi (samples), q = pi_ref: exp(ref - logp) - (ref - logp) - 1 per token.
        ref_k3 = kl_k3(inp.logp.detach(), ref, mask)
        if kl_coef > 0:
            kl_terms = kl_coef * kl_k3_per_token(inp.logp, ref, mask)  # [batch, seq]
            penalty = aggregate(kl_terms, mask, aggregation=aggregation, norm_constant=norm_constant)
            loss = policy + penalty
    metrics = ratio_metrics(inp.logp, inp.old_logp, mask)
    metrics.update(clip_metrics(flags, mask, dtype))
    metrics["kl/ref_k3"] = ref_k3
    metrics["objective/policy_loss"] = policy.detach()
    metrics["objective/kl_penalty"] = penalty.detach()
    if extra_metrics:
        metrics.update(extra_metrics)
    return LossParts(loss=loss, metrics=metrics, clipped=flags.token_clipped)


# --------------------------------------------------------------------------------------------------------------
# PPO-style clipped surrogate: GRPO / DAPO / Dr. GRPO (token), GSPO (sequence), GSPO-token (sequence-token)
# --------------------------------------------------------------------------------------------------------------


LossAndMetrics = tuple[torch.Tensor, dict[str, torch.Tensor]]


def _loss_and_metrics(parts_fn: Callable[..., LossParts]) -> Callable[..., LossAndMetrics]:
    """The registered form of a loss: ``parts_fn`` returning ``(loss, metrics)`` (same arguments and docs)."""

    @functools.wraps(parts_fn)
    def loss_fn(*args: Any, **kwargs: Any) -> LossAndMetrics:
        parts = parts_fn(*args, **kwargs)
        return parts.loss, parts.metrics

    loss_fn.__name__ = loss_fn.__qualname__ = parts_fn.__name__.removesuffix("_parts")
    return loss_fn


def policy_loss_parts(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str,
    clip_low: float,
    clip_high: float,
    aggregation: str,
    norm_constant: float | None = None,
    kl_coef: float = 0.0,
    ref_logp: torch.Tensor | None = None,
) -> LossParts:
    """PPO-style clipped surrogate (registered as ``ppo-clip``), at the token, sequence or sequence-token level.

    Per unit with ratio ``r`` and advantage ``A`` the loss term is ``-min(r A, clip(r, 1 - clip_low,
    1 + clip_high) A)``:

    - ``level="token"`` (GRPO, DeepSeekMath arXiv 2402.03300; DAPO arXiv 2503.14476; Dr. GRPO arXiv
      2503.20783): ``r = w[i,t] = exp(logp - old_logp)``, ``A = A[i]`` or ``A[i,t]``.
    - ``level="sequence"`` (GSPO, arXiv 2507.18071 Eq. 5, 7): ``r = s[i] = exp(mean_t log w[i,t])``;
      needs per-sequence advantages ``[batch]``. The term is broadcast to the row's tokens before aggregation,
      so ``seq-mean-token-mean`` gives exactly Eq. 5.
    - ``level="sequence-token"`` (GSPO-token, Eq. 13-14): ``r = s[i,t] = sg[s_i] pi(y_t) / sg[pi(y_t)]``,
      per-token advantages allowed; equal to GSPO in value, clipping and gradient when each row's advantages
      are equal.

    Args:
        logp: ``[batch, seq]`` current-policy log-probs (gradient flows here).
        old_logp: ``[batch, seq]`` behaviour-policy log-probs.
        advantages: ``[batch]`` or ``[batch, seq]``.
        mask: ``[batch, seq]`` response mask.
        level: ``token`` | ``sequence`` | ``sequence-token``.
        clip_low: ratio lower bound is ``1 - clip_low`` (``0 <= clip_low <= 1``).
        clip_high: ratio upper bound is ``1 + clip_high``.
        aggregation: ``seq-mean-token-mean`` | ``token-mean`` | ``seq-mean-token-sum-norm``.
        norm_constant: the constant of ``seq-mean-token-sum-norm`` (e.g. max response tokens).
        kl_coef: coefficient of the k3 penalty against ``ref_logp`` (0: none).
        ref_logp: ``[batch, seq]`` reference-policy log-probs (required when ``kl_coef > 0``).

    Returns:
        ``LossParts(loss, metrics, clipped)``: 0-dim loss, the metrics of docs/objectives.md and the per-token
        clipped flags; the registered ``policy_loss`` returns ``(loss, metrics)``.
    """
    inp = _prepare(logp, old_logp, advantages, mask)
    _check_level(level, LEVELS, "ppo-clip")
    _check_common(clip_low, clip_high, aggregation, norm_constant, kl_coef, ref_logp, inp.logp.shape)
    terms, flags = _clipped_surrogate_terms(inp, level=level, clip_low=clip_low, clip_high=clip_high)
    return _finish(
        inp, terms, flags, aggregation=aggregation, norm_constant=norm_constant, kl_coef=kl_coef, ref_logp=ref_logp
    )


policy_loss = _loss_and_metrics(policy_loss_parts)


# --------------------------------------------------------------------------------------------------------------
# CISPO
# --------------------------------------------------------------------------------------------------------------


def cispo_loss_parts(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str,
    clip_low: float,
    clip_high: float,
    aggregation: str,
    norm_constant: float | None = None,
    kl_coef: float = 0.0,
    ref_logp: torch.Tensor | None = None,
) -> LossParts:
    """CISPO (MiniMax-M1, arXiv 2506.13585): clip the importance weight, not the update.

    ``J = 1/sum|y| sum_{i,t} sg(clip(w[i,t], 1 - clip_low, 1 + clip_high)) A log pi(y_t)`` (with the
    ``token-mean`` aggregation; any aggregation is accepted). Every token keeps a gradient
    ``sg(clip(w)) A grad log pi``: clipping bounds its size instead of zeroing it. The loss *value* is
    ``-sg(clip(w)) A logp``, which is not an estimate of the objective; only its gradient is meaningful.

    ``level`` must be ``"token"``. A token counts as clipped (metrics, ``clipped`` flags) when its weight was
    truncated, ``w < 1 - clip_low`` or ``w > 1 + clip_high``, whatever the advantage's sign (the truncation
    changes the gradient for either sign). ``clip_low = 1`` disables the lower bound (``w >= 0`` always), as in
    MiniMax-M1 and ScaleRL's CISPO which only cap the weight from above.

    Arguments and return value as ``policy_loss``.
    """
    inp = _prepare(logp, old_logp, advantages, mask)
    _check_level(level, ("token",), "cispo")
    _check_common(clip_low, clip_high, aggregation, norm_constant, kl_coef, ref_logp, inp.logp.shape)
    w = token_ratios(inp.logp, inp.old_logp, inp.mask)  # [batch, seq]
    weight = w.clamp(1.0 - clip_low, 1.0 + clip_high).detach()  # [batch, seq]
    terms = -weight * inp.adv_token * masked_fill_zero(inp.logp, inp.mask)  # [batch, seq]
    low = w.detach() < 1.0 - clip_low  # [batch, seq]
    high = w.detach() > 1.0 + clip_high  # [batch, seq]
    flags = ClipFlags.from_tokens(low, high, inp.mask)
    return _finish(
        inp, terms, flags, aggregation=aggregation, norm_constant=norm_constant, kl_coef=kl_coef, ref_logp=ref_logp
    )


cispo_loss = _loss_and_metrics(cispo_loss_parts)


# --------------------------------------------------------------------------------------------------------------
# GMPO
# --------------------------------------------------------------------------------------------------------------


def gmpo_loss_parts(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str,
    clip_low: float,
    clip_high: float,
    aggregation: str,
    norm_constant: float | None = None,
    kl_coef: float = 0.0,
    ref_logp: torch.Tensor | None = None,
) -> LossParts:
    """GMPO (Geometric-Mean Policy Optimization, arXiv 2507.20673).

    ``J = 1/G sum_i sgn(A_i) (prod_t |min(w_it A_i, clip(w_it) A_i)|) ** (1/|y_i|)``
    ``  = 1/G sum_i A_i exp(mean_t sgn(A_i) min(sgn(A_i) log w_it, sgn(A_i) clip(log w_it, -clip_low, clip_high)))``

    i.e. each token's ratio is clipped in log space (``w`` to ``[e^-clip_low, e^clip_high]``) on the side that
    matters for the sign of ``A_i`` (PPO's pessimism), and the sequence uses the geometric mean of the
    token ratios. The per-sequence term is broadcast to its tokens; ``seq-mean-token-mean`` gives ``1/G sum_i``.

    ``level`` must be ``"token"`` (clipping is per token); advantages must be per sequence ``[batch]``.
    Clipped tokens (zero gradient): ``log w > clip_high`` with ``A > 0``, ``log w < -clip_low`` with ``A < 0``.

    Arguments and return value as ``policy_loss`` (``clip_low``/``clip_high`` are log-space bounds, e.g. 0.4).
    """
    inp = _prepare(logp, old_logp, advantages, mask)
    _check_level(level, ("token",), "gmpo")
    _check_common(clip_low, clip_high, aggregation, norm_constant, kl_coef, ref_logp, inp.logp.shape, log_space=True)
    if inp.adv_seq is None:
        raise ValueError("gmpo needs one advantage per sequence (advantages of shape [batch]); got [batch, seq]")
    mask = inp.mask
    log_w = token_log_ratios(inp.logp, inp.old_logp, mask)  # [batch, seq]
    sign = torch.sign(inp.adv_seq)[:, None]  # [batch, 1]
    log_w_clipped = log_w.clamp(-clip_low, clip_high)  # [batch, seq]
    # Pessimistic choice in log space: min(sgn(A) log w, sgn(A) clip(log w)), then undo the sign.
    log_w_eff = sign * torch.min(sign * log_w, sign * log_w_clipped)  # [batch, seq]
    seq_ratio = torch.exp(masked_row_mean(log_w_eff, mask))  # [batch], geometric mean of the clipped w
    seq_terms = -inp.adv_seq * seq_ratio  # [batch]
    terms = seq_terms[:, None].expand(mask.shape)  # [batch, seq]
    low = (log_w.detach() < -clip_low) & (inp.adv_token < 0)  # [batch, seq]
    high = (log_w.detach() > clip_high) & (inp.adv_token > 0)  # [batch, seq]
    flags = ClipFlags.from_tokens(low, high, mask)
    return _finish(
        inp, terms, flags, aggregation=aggregation, norm_constant=norm_constant, kl_coef=kl_coef, ref_logp=ref_logp
    )


gmpo_loss = _loss_and_metrics(gmpo_loss_parts)


# --------------------------------------------------------------------------------------------------------------
# RSPO
# --------------------------------------------------------------------------------------------------------------


def rspo_loss_parts(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str,
    clip_low: float,
    clip_high: float,
    aggregation: str,
    router_logp_new: torch.Tensor,
    router_logp_old: torch.Tensor,
    gamma_min: float,
    norm_constant: float | None = None,
    kl_coef: float = 0.0,
    ref_logp: torch.Tensor | None = None,
) -> LossParts:
    """Router-shift-weighted clipped surrogate (after RSPO, arXiv 2510.23027).

    What is implemented: the clipped surrogate of ``policy_loss`` at ``level``, with each token's loss term
    multiplied by the router-shift weight ``gamma[i,t]`` (``moestab.rl.router_shift.router_shift_weights``;
    stop-gradient, floored at ``gamma_min``) before aggregation:

        loss = aggregate( gamma[i,t] * -min(r A, clip(r) A) ).

    Why this form: ``gamma`` then acts purely as a per-token trust weight on the update, and the clip
    decisions (hence the clip metrics and ``clipped`` flags) are exactly those of the base GRPO / GSPO
    objective, so runs with and without router-shift weighting stay comparable. For an unclipped token at the
    token level the gradient, ``gamma w A grad log pi``, is the same as rescaling the ratio to ``gamma w``.
    Difference from the paper: RSPO's abstract (v2) rescales the importance ratio *before* clipping and its
    headline variant builds on GMPO (geometric mean, token-level log-space clip); rescaling before clipping
    also moves the clip boundaries (a token is clipped high at ``w > (1 + clip_high) / gamma`` instead of
    ``w > 1 + clip_high``). That variant is not implemented here.

    Extra arguments:
        router_logp_new: ``[batch, seq, layers, top_k]`` current router log-probs of the experts chosen under
            the old policy.
        router_logp_old: ``[batch, seq, layers, top_k]`` old router log-probs of the same experts.
        gamma_min: floor of ``gamma`` in ``[0, 1]``.

    Extra metrics: ``rspo/gamma_mean``, ``rspo/gamma_min`` (over response tokens, after the floor) and
    ``rspo/floor_frac`` (fraction of response tokens where the floor was active).

    Other arguments and return value as ``policy_loss``; the KL penalty, if any, is not weighted by gamma.
    """
    inp = _prepare(logp, old_logp, advantages, mask)
    _check_level(level, LEVELS, "rspo")
    _check_common(clip_low, clip_high, aggregation, norm_constant, kl_coef, ref_logp, inp.logp.shape)
    check_gamma_min(gamma_min)
    # Unfloored weight (to report how often the floor binds), then the floor: the same values as
    # router_shift_weights(..., gamma_min=gamma_min).
    raw = router_shift_weights(router_logp_new, router_logp_old, inp.mask, gamma_min=0.0)  # [batch, seq]
    raw = raw.to(inp.logp.dtype)
    gamma = raw.clamp(min=gamma_min)  # [batch, seq], no gradient
    terms, flags = _clipped_surrogate_terms(inp, level=level, clip_low=clip_low, clip_high=clip_high)
    with torch.no_grad():
        extra = {
            "rspo/gamma_mean": masked_mean(gamma, inp.mask),
            "rspo/gamma_min": _token_min(gamma, inp.mask),
            "rspo/floor_frac": masked_mean((raw < gamma_min).to(gamma.dtype), inp.mask),
        }
    return _finish(
        inp,
        terms * gamma,
        flags,
        aggregation=aggregation,
        norm_constant=norm_constant,
        kl_coef=kl_coef,
        ref_logp=ref_logp,
        extra_metrics=extra,
    )


def _token_min(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    values = x[mask]
    return values.min() if values.numel() else torch.full((), float("nan"), dtype=x.dtype, device=x.device)


rspo_loss = _loss_and_metrics(rspo_loss_parts)
