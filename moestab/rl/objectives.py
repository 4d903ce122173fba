"""How a policy loss is declared: one decorated function fills the registry and everything keyed by its name.

An objective is one pure function of the shared, already validated inputs returning its per-token loss terms::

    @objective("cispo", levels=("token",))
    def cispo_loss(x: LossInputs) -> LossTerms:
        ...  # the math only: x.logp, x.old_logp, x.advantages, x.mask [batch, seq], x.clip_low, ...

``@objective`` registers it in ``LOSSES`` and returns an ``Objective``: the registered loss, called with explicit
tensors and settings by keyword (the common signature below plus the function's own keyword arguments) and
returning ``(loss, metrics)``. What is common to every loss is written once here: the validation of the inputs
and their compute dtype (``LossInputs.validated``), and, after the objective's terms, the aggregation, the
optional reference KL penalty and the ratio / clip / objective metrics (``_finish``). The declaration carries
everything the rest of moestab reads by loss name: the levels it supports, whether its clip bounds are in log
space (``TrainConfig`` allows ``clip_low > 1`` for those), the tensors the trainer computes for it
(``runtime_inputs``) and the settings its preset fixes (its other keyword arguments, e.g. ``gamma_min``).

Common signature of every registered loss::

    loss(logp, old_logp, advantages, mask, *, level, clip_low, clip_high, aggregation,
         <its own keyword arguments>, norm_constant=None, kl_coef=0.0, ref_logp=None) -> (loss, metrics)

- ``logp`` ``[batch, seq]``: log-probs of the response tokens under the current policy (carries the gradient).
- ``old_logp`` ``[batch, seq]``: the same tokens under ``pi_old`` (constant).
- ``advantages``: ``[batch]`` (one per sequence) or ``[batch, seq]`` (one per token); constant.
- ``mask`` ``[batch, seq]``: response mask (bool, or 0/1).
- ``level``: which ratio is clipped, ``token`` | ``sequence`` | ``sequence-token`` (``LEVELS``).
- ``clip_low``, ``clip_high``: asymmetric clip range (DAPO clip-higher): the ratio is clipped to
  ``[1 - clip_low, 1 + clip_high]`` (log-space objectives such as GMPO: the log-ratio to ``[-clip_low, clip_high]``).
- ``aggregation``, ``norm_constant``: see ``moestab.rl.aggregation``.
- ``kl_coef``, ``ref_logp``: optional k3 penalty against a reference policy, ``kl_coef * k3(pi -> pi_ref)``
  added per token before aggregation (DeepSeekMath GRPO Eq. 3-4); ``kl_coef = 0`` (default) needs no
  reference. When ``ref_logp`` is given the metric ``kl/ref_k3`` reports the token-mean k3.

``loss`` is the 0-dim quantity to minimise (the negated objective); ``metrics`` maps namespaced keys to detached
0-dim tensors (see ``moestab.rl.metrics`` and docs/objectives.md). ``Objective.parts`` also returns the per-token
``clipped`` flags (``LossParts``). All computation runs in ``promote_types(logp.dtype, float32)``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from moestab.rl.aggregation import aggregate, check_aggregation
from moestab.rl.errors import UnknownNameError
from moestab.rl.kl import kl_k3, kl_k3_per_token
from moestab.rl.masking import as_bool_mask, response_lengths
from moestab.rl.metrics import ClipFlags, clip_metrics, ratio_metrics

LEVELS = ("token", "sequence", "sequence-token")
"""Valid values of ``level``: the ratio a loss clips (GRPO token ratio, GSPO sequence ratio, GSPO-token)."""


@dataclass(frozen=True)
class LossInputs:
    """The inputs every policy loss shares, validated and in the compute dtype ``promote_types(logp.dtype,
    float32)``: what an objective's function reads. Values at masked positions are never read."""

    logp: torch.Tensor  # [batch, seq] current-policy log-probs, compute dtype, carries the gradient
    old_logp: torch.Tensor  # [batch, seq] behaviour-policy log-probs, compute dtype, detached
    advantages: torch.Tensor  # [batch, seq] detached; advantages given per sequence are broadcast over the row
    sequence_advantages: torch.Tensor | None  # [batch] when the advantages were given per sequence, else None
    mask: torch.Tensor  # [batch, seq] bool response mask
    ref_logp: torch.Tensor | None  # [batch, seq] reference-policy log-probs, compute dtype, detached; or None
    level: str
    """The ratio that is clipped, one of the objective's ``levels``."""
    clip_low: float
    """Lower clip parameter: ratio bound ``1 - clip_low`` (log-space objectives: log-ratio bound ``-clip_low``)."""
    clip_high: float
    """Upper clip parameter: ratio bound ``1 + clip_high`` (log-space objectives: log-ratio bound ``clip_high``)."""
    aggregation: str
    """How per-token terms become the loss (``moestab.rl.aggregation.AGGREGATIONS``)."""
    norm_constant: float | None
    """The constant of ``seq-mean-token-sum-norm``; None for the other aggregations."""
    kl_coef: float
    """Coefficient of the k3 penalty against ``ref_logp`` (0: none)."""

    @staticmethod
    def validated(
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
        declared: Objective,
    ) -> LossInputs:
        """The common arguments of a registered loss checked (``ValueError`` / ``UnknownNameError`` saying what
        is expected) and converted; ``declared`` supplies the levels the objective supports and its clip space."""
        if isinstance(logp, torch.Tensor):
            _check_devices(logp, ref_logp=ref_logp)
        tensors = _tensors(logp, old_logp, advantages, mask)
        if level not in declared.levels:
            raise UnknownNameError(f"level for loss {declared.name!r}", level, declared.levels)
        _check_clip(clip_low, clip_high, log_space=declared.log_space)
        check_aggregation(aggregation, norm_constant)
        _check_kl(kl_coef, ref_logp, tensors.logp.shape)
        ref = None
        if ref_logp is not None:
            ref = ref_logp.detach().to(tensors.logp.dtype)  # [batch, seq]
            _check_finite_on(ref, tensors.mask, "ref_logp")
        return LossInputs(
            tensors.logp, tensors.old_logp, tensors.advantages, tensors.sequence_advantages, tensors.mask, ref,
            level=level, clip_low=clip_low, clip_high=clip_high, aggregation=aggregation,
            norm_constant=norm_constant, kl_coef=kl_coef,
        )


@dataclass(frozen=True)
class LossTerms:
    """What an objective's function returns; the registered loss aggregates it and adds the shared metrics."""

    per_token: torch.Tensor  # [batch, seq] loss terms (the negated objective) before aggregation
    clip: ClipFlags  # which ratios were clipped, per clip unit and per token
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)  # the objective's own detached 0-dim metrics


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


TermsFn = Callable[..., LossTerms]
"""An objective's math: ``(x: LossInputs, *, <its own keyword arguments>) -> LossTerms``."""

_P = inspect.Parameter
_COMMON_HEAD = (
    *(_P(name, _P.POSITIONAL_OR_KEYWORD, annotation="torch.Tensor") for name in ("logp", "old_logp", "advantages",
                                                                                  "mask")),
    _P("level", _P.KEYWORD_ONLY, annotation="str"),
    _P("clip_low", _P.KEYWORD_ONLY, annotation="float"),
    _P("clip_high", _P.KEYWORD_ONLY, annotation="float"),
    _P("aggregation", _P.KEYWORD_ONLY, annotation="str"),
)
_COMMON_TAIL = (
    _P("norm_constant", _P.KEYWORD_ONLY, default=None, annotation="float | None"),
    _P("kl_coef", _P.KEYWORD_ONLY, default=0.0, annotation="float"),
    _P("ref_logp", _P.KEYWORD_ONLY, default=None, annotation="torch.Tensor | None"),
)
COMMON_ARGUMENTS = tuple(p.name for p in (*_COMMON_HEAD, *_COMMON_TAIL))
"""The arguments every registered loss takes (``LossInputs.validated``), in signature order."""


@dataclass(frozen=True)
class Objective:
    """One registered policy loss: its math and what the rest of moestab reads about it by name.

    Calling it, ``loss(logp, old_logp, advantages, mask, *, level, ..., <own inputs>) -> (loss, metrics)``, runs
    the shared validation, its ``terms`` and the shared aggregation and metrics; ``parts`` returns ``LossParts``.
    ``inspect.signature`` shows the full signature; a missing or unexpected argument is a ``TypeError`` naming it.
    """

    name: str
    """Registry key, named by presets (``AlgorithmPreset.loss``)."""
    terms: TermsFn
    """The math: ``terms(x: LossInputs, **own) -> LossTerms``, a pure function."""
    levels: tuple[str, ...] = LEVELS
    """The values of ``level`` it supports."""
    log_space: bool = False
    """True when ``clip_low`` / ``clip_high`` bound the log-ratio (GMPO), so ``clip_low`` may exceed 1."""
    runtime_inputs: tuple[str, ...] = ()
    """Its own keyword arguments that the trainer computes for every call (tensors such as router log-probs; the
    trainer's table of providers is ``moestab.train.step_update.RUNTIME_INPUTS``)."""

    inputs: tuple[str, ...] = field(init=False)
    """Its own keyword arguments (beyond ``COMMON_ARGUMENTS``), in the order of ``terms``' signature."""

    def __post_init__(self) -> None:
        for level in self.levels:
            if level not in LEVELS:
                raise UnknownNameError(f"level of objective {self.name!r}", level, LEVELS)
        own = _own_parameters(self.name, self.terms)
        object.__setattr__(self, "inputs", tuple(p.name for p in own))
        for name in self.runtime_inputs:
            if name not in self.inputs:
                raise ValueError(f"objective {self.name!r}: runtime input {name!r} is not a keyword-only argument of "
                                 f"{self.terms.__qualname__} (its own arguments: {', '.join(self.inputs) or 'none'})")
        # The signature callers see (help(), inspect.signature, argument binding), and the docstring of the math;
        # instance attributes, so that inspect.signature(Objective) still describes the class.
        object.__setattr__(self, "__signature__", inspect.Signature([*_COMMON_HEAD, *own, *_COMMON_TAIL]))
        object.__setattr__(self, "__doc__", self.terms.__doc__)

    @property
    def settings(self) -> tuple[str, ...]:
        """Its own keyword arguments that its preset fixes (each an ``AlgorithmPreset`` field, e.g. ``gamma_min``)."""
        return tuple(name for name in self.inputs if name not in self.runtime_inputs)

    def parts(self, *args: Any, **kwargs: Any) -> LossParts:
        """The loss, its metrics and the per-token clipped flags (``LossParts``), from the arguments of a call."""
        bound = self.__signature__.bind(*args, **kwargs)  # TypeError naming a missing or unexpected argument
        bound.apply_defaults()
        given = bound.arguments
        x = LossInputs.validated(**{name: given[name] for name in COMMON_ARGUMENTS}, declared=self)
        return _finish(x, self.terms(x, **{name: given[name] for name in self.inputs}))

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        parts = self.parts(*args, **kwargs)
        return parts.loss, parts.metrics


def _own_parameters(name: str, terms: TermsFn) -> list[inspect.Parameter]:
    """The keyword-only parameters of ``terms`` after its ``LossInputs``; ``TypeError`` for any other shape."""
    params = list(inspect.signature(terms).parameters.values())
    if not params or params[0].kind not in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD):
        raise TypeError(f"objective {name!r}: {terms.__qualname__} must take the LossInputs as its first argument")
    for p in params[1:]:
        if p.kind is not _P.KEYWORD_ONLY:
            raise TypeError(f"objective {name!r}: argument {p.name!r} of {terms.__qualname__} must be keyword-only")
        if p.name in COMMON_ARGUMENTS:
            raise TypeError(f"objective {name!r}: {p.name!r} is a common argument; {terms.__qualname__} reads it "
                            f"from its LossInputs")
    return params[1:]


LOSSES: dict[str, Objective] = {}
"""The policy losses by name, filled by ``@objective`` (the registry; ``moestab.rl.registry`` calls by name)."""


def objective(
    name: str, *, levels: tuple[str, ...] = LEVELS, log_space: bool = False, runtime_inputs: tuple[str, ...] = ()
) -> Callable[[TermsFn], Objective]:
    """Register the decorated function as the policy loss ``name``; the name is bound to its ``Objective``.

    Args:
        name: the registry key presets name (``AlgorithmPreset.loss``); registering a name twice is an error.
        levels: the values of ``level`` it supports (default all of ``LEVELS``).
        log_space: its ``clip_low`` / ``clip_high`` bound the log-ratio (``clip_low`` may exceed 1).
        runtime_inputs: those of its keyword-only arguments that the trainer computes per call; the others are
            settings its preset fixes (an ``AlgorithmPreset`` field of the same name).
    """

    def register(terms: TermsFn) -> Objective:
        if name in LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered ({LOSSES[name].terms.__qualname__})")
        declared = Objective(name, terms, levels=tuple(levels), log_space=log_space,
                             runtime_inputs=tuple(runtime_inputs))
        LOSSES[name] = declared
        return declared

    return register


@contextmanager
def scoped_objectives() -> Iterator[None]:
    """Objectives registered inside the ``with`` block are unregistered when it exits, even when it raises: trying
    an objective out (a test, a notebook) leaves ``LOSSES`` as it was."""
    before = dict(LOSSES)
    try:
        yield
    finally:
        for name in [name for name in LOSSES if name not in before]:
            del LOSSES[name]


# ----------------------------------------------------------------------------------------------------------------
# The shared prologue (validation) and epilogue (aggregation, reference KL, metrics)
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tensors:
    logp: torch.Tensor  # [batch, seq], compute dtype, with grad
    old_logp: torch.Tensor  # [batch, seq], detached
    advantages: torch.Tensor  # [batch, seq], detached (per-sequence advantages broadcast)
    sequence_advantages: torch.Tensor | None  # [batch] when advantages were given per sequence, else None
    mask: torch.Tensor  # [batch, seq] bool


def _check_finite_on(x: torch.Tensor, where: torch.Tensor, name: str) -> None:
    if not bool(torch.isfinite(x.detach()[where]).all()):
        raise ValueError(f"{name} has NaN or inf values on response tokens")


def _check_devices(logp: torch.Tensor, **others: torch.Tensor | None) -> None:
    """Every tensor of a loss on logp's device: a trainer that keeps one on the host (rewards, advantages) gets this
    error instead of torch's indexing error from deep inside the loss."""
    wrong = {name: t.device for name, t in others.items() if isinstance(t, torch.Tensor) and t.device != logp.device}
    if wrong:
        listed = ", ".join(f"{name} on {device}" for name, device in wrong.items())
        raise ValueError(f"every tensor of a loss must be on logp's device ({logp.device}); got {listed}")


def _tensors(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> _Tensors:
    if not isinstance(logp, torch.Tensor) or logp.dim() != 2 or not logp.is_floating_point():
        shape = tuple(logp.shape) if isinstance(logp, torch.Tensor) else type(logp).__name__
        raise ValueError(f"logp must be a floating [batch, seq] tensor, got {shape}")
    dtype = torch.promote_types(logp.dtype, torch.float32)
    _check_devices(logp, old_logp=old_logp, advantages=advantages, mask=mask)
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
    return _Tensors(logp, old_logp, adv_token, adv_seq, mask)


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


def _finish(x: LossInputs, terms: LossTerms) -> LossParts:
    """Aggregate the objective's terms, add the reference KL penalty, and assemble the metrics."""
    mask = x.mask
    dtype = x.logp.dtype
    policy = aggregate(terms.per_token, mask, aggregation=x.aggregation, norm_constant=x.norm_constant)
    loss = policy
    penalty = torch.zeros((), dtype=dtype, device=x.logp.device)
    ref_k3 = torch.full((), float("nan"), dtype=dtype, device=x.logp.device)
    if x.ref_logp is not None:
        # k3 with p = pi (samples), q = pi_ref: exp(ref - logp) - (ref - logp) - 1 per token.
        ref_k3 = kl_k3(x.logp.detach(), x.ref_logp, mask)
        if x.kl_coef > 0:
            kl_terms = x.kl_coef * kl_k3_per_token(x.logp, x.ref_logp, mask)  # [batch, seq]
            penalty = aggregate(kl_terms, mask, aggregation=x.aggregation, norm_constant=x.norm_constant)
            loss = policy + penalty
    metrics = ratio_metrics(x.logp, x.old_logp, mask)
    metrics.update(clip_metrics(terms.clip, mask, dtype))
    metrics["kl/ref_k3"] = ref_k3
    metrics["objective/policy_loss"] = policy.detach()
    metrics["objective/kl_penalty"] = penalty.detach()
    metrics.update(terms.metrics)
    return LossParts(loss=loss, metrics=metrics, clipped=terms.clip.token_clipped)
