"""The registered policy losses: PPO-style clipped surrogate (token / sequence / sequence-token level), CISPO, GMPO,
RSPO.

Each is one pure function of the shared inputs (``LossInputs``: ``logp``, ``old_logp``, ``advantages``, ``mask``
``[batch, seq]`` and the clip, aggregation and KL settings) and its own keyword arguments, returning its per-token
terms and clip flags (``LossTerms``). ``@objective`` registers it by name and binds the module name to the
callable loss, ``fn(logp, old_logp, advantages, mask, *, level, clip_low, clip_high, aggregation, ...) ->
(loss, metrics)``: validation, aggregation, the reference KL penalty and the shared metrics are written once, in
``moestab.rl.objectives`` (whose docstring describes the common arguments).
"""

from __future__ import annotations

import torch

from moestab.rl.masking import masked_fill_zero, masked_mean, masked_row_mean
from moestab.rl.metrics import ClipFlags
from moestab.rl.objectives import LEVELS, LossInputs, LossParts, LossTerms, objective
from moestab.rl.ratios import sequence_ratios, sequence_token_ratios, token_log_ratios, token_ratios
from moestab.rl.router_shift import check_gamma_min, router_shift_weights

__all__ = ["LEVELS", "LossParts", "cispo_loss", "gmpo_loss", "policy_loss", "rspo_loss"]


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


def _clipped_surrogate_terms(x: LossInputs) -> LossTerms:
    """Per-token loss terms ``[batch, seq]`` of the clipped surrogate at ``x.level``, and its clip flags."""
    mask = x.mask
    if x.level == "token":
        ratio = token_ratios(x.logp, x.old_logp, mask)  # [batch, seq]
        terms, low, high = _surrogate(ratio, x.advantages, x.clip_low, x.clip_high)  # [batch, seq]
        return LossTerms(terms, ClipFlags.from_tokens(low, high, mask))
    if x.level == "sequence":
        if x.sequence_advantages is None:
            raise ValueError(
                "level 'sequence' (GSPO) needs one advantage per sequence, advantages of shape [batch]; "
                "for per-token advantages use level 'sequence-token' (GSPO-token)"
            )
        ratio = sequence_ratios(x.logp, x.old_logp, mask)  # [batch]
        seq_terms, low, high = _surrogate(ratio, x.sequence_advantages, x.clip_low, x.clip_high)  # [batch]
        return LossTerms(seq_terms[:, None].expand(mask.shape), ClipFlags.from_sequences(low, high, mask))
    # sequence-token (GSPO-token): ratio value s_i, gradient through each token's own log-prob.
    ratio = sequence_token_ratios(x.logp, x.old_logp, mask)  # [batch, seq]
    terms, low, high = _surrogate(ratio, x.advantages, x.clip_low, x.clip_high)  # [batch, seq]
    return LossTerms(terms, ClipFlags.from_tokens(low, high, mask))


# --------------------------------------------------------------------------------------------------------------
# PPO-style clipped surrogate: GRPO / DAPO / Dr. GRPO (token), GSPO (sequence), GSPO-token (sequence-token)
# --------------------------------------------------------------------------------------------------------------


@objective("ppo-clip")
def policy_loss(x: LossInputs) -> LossTerms:
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

    Args (of the registered loss):
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
        ``(loss, metrics)``: 0-dim loss and the metrics of docs/objectives.md; ``policy_loss.parts(...)`` returns
        ``LossParts(loss, metrics, clipped)`` with the per-token clipped flags.
    """
    return _clipped_surrogate_terms(x)


# --------------------------------------------------------------------------------------------------------------
# CISPO
# --------------------------------------------------------------------------------------------------------------


@objective("cispo", levels=("token",))
def cispo_loss(x: LossInputs) -> LossTerms:
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
    w = token_ratios(x.logp, x.old_logp, x.mask)  # [batch, seq]
    weight = w.clamp(1.0 - x.clip_low, 1.0 + x.clip_high).detach()  # [batch, seq]
    terms = -weight * x.advantages * masked_fill_zero(x.logp, x.mask)  # [batch, seq]
    low = w.detach() < 1.0 - x.clip_low  # [batch, seq]
    high = w.detach() > 1.0 + x.clip_high  # [batch, seq]
    return LossTerms(terms, ClipFlags.from_tokens(low, high, x.mask))


# --------------------------------------------------------------------------------------------------------------
# GMPO
# --------------------------------------------------------------------------------------------------------------


@objective("gmpo", levels=("token",), log_space=True)
def gmpo_loss(x: LossInputs) -> LossTerms:
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
    if x.sequence_advantages is None:
        raise ValueError("gmpo needs one advantage per sequence (advantages of shape [batch]); got [batch, seq]")
    mask = x.mask
    log_w = token_log_ratios(x.logp, x.old_logp, mask)  # [batch, seq]
    sign = torch.sign(x.sequence_advantages)[:, None]  # [batch, 1]
    log_w_clipped = log_w.clamp(-x.clip_low, x.clip_high)  # [batch, seq]
    # Pessimistic choice in log space: min(sgn(A) log w, sgn(A) clip(log w)), then undo the sign.
    log_w_eff = sign * torch.min(sign * log_w, sign * log_w_clipped)  # [batch, seq]
    seq_ratio = torch.exp(masked_row_mean(log_w_eff, mask))  # [batch], geometric mean of the clipped w
    seq_terms = -x.sequence_advantages * seq_ratio  # [batch]
    terms = seq_terms[:, None].expand(mask.shape)  # [batch, seq]
    low = (log_w.detach() < -x.clip_low) & (x.advantages < 0)  # [batch, seq]
    high = (log_w.detach() > x.clip_high) & (x.advantages > 0)  # [batch, seq]
    return LossTerms(terms, ClipFlags.from_tokens(low, high, mask))


# --------------------------------------------------------------------------------------------------------------
# RSPO
# --------------------------------------------------------------------------------------------------------------


@objective("rspo", runtime_inputs=("router_logp_new", "router_logp_old"))
def rspo_loss(
    x: LossInputs, *, router_logp_new: torch.Tensor, router_logp_old: torch.Tensor, gamma_min: float
) -> LossTerms:
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
            the old policy (computed by the trainer per call).
        router_logp_old: ``[batch, seq, layers, top_k]`` old router log-probs of the same experts (likewise).
        gamma_min: floor of ``gamma`` in ``[0, 1]`` (fixed by the preset).

    Extra metrics: ``rspo/gamma_mean``, ``rspo/gamma_min`` (over response tokens, after the floor) and
    ``rspo/floor_frac`` (fraction of response tokens where the floor was active).

    Other arguments and return value as ``policy_loss``; the KL penalty, if any, is not weighted by gamma.
    """
    check_gamma_min(gamma_min)
    # Unfloored weight (to report how often the floor binds), then the floor: the same values as
    # router_shift_weights(..., gamma_min=gamma_min).
    raw = router_shift_weights(router_logp_new, router_logp_old, x.mask, gamma_min=0.0)  # [batch, seq]
    raw = raw.to(x.logp.dtype)
    gamma = raw.clamp(min=gamma_min)  # [batch, seq], no gradient
    base = _clipped_surrogate_terms(x)
    with torch.no_grad():
        extra = {
            "rspo/gamma_mean": masked_mean(gamma, x.mask),
            "rspo/gamma_min": _token_min(gamma, x.mask),
            "rspo/floor_frac": masked_mean((raw < gamma_min).to(gamma.dtype), x.mask),
        }
    return LossTerms(base.per_token * gamma, base.clip, extra)


def _token_min(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    values = x[mask]
    return values.min() if values.numel() else torch.full((), float("nan"), dtype=x.dtype, device=x.device)
