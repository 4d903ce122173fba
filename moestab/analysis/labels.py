"""How the dashboard names and writes a metrics.jsonl number: a title and an axis label in words with a unit, percent
where README writes percent, and a value at float precision written as zero.

One owner for each: :func:`metric_label` (title and axis label of a key), :func:`is_percent` (shares README writes
as ``14.2%``: routing change, router and token flips, accuracy, clip fractions), :func:`at_float_precision` (a value
that is zero up to float rounding, e.g. k3 ~ 1e-13 under R3) and :func:`format_value` (the text a table shows).
Pure functions, no Streamlit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from moestab.metrics import keys

FLOAT_PRECISION = 1e-9
"""Below this magnitude a metrics.jsonl value is zero up to float rounding. Its quantities (shares, nats per token,
variances of log-ratios, their differences) have a natural scale of 1; the recording layer computes them in float64
from float32 or bf16 log-probs and routes, so exactly equal inputs give 0 and rounding leaves values of ~1e-13 (k3 of
R3's replayed pi_old against the rollout), far below any measured difference (~1e-6 and up)."""

AT_PRECISION = "0 (at float precision)"
"""How a table writes a value at float precision."""

PAIR_WORDS = {
    "old_new": "old → new",
    "rollout_old": "rollout → trainer (pi_old as used)",
    "rollout_old_free": "rollout → trainer (free pi_old)",
}
"""A route or log-prob pair of a key, in words."""


@dataclass(frozen=True)
class MetricLabel:
    """How a chart names a metrics.jsonl key."""

    title: str
    """What the number is, in words (no formula, no backticks)."""
    unit: str
    """The axis label: the unit in words (``% of routed slots``, ``nats per token``)."""

    @property
    def percent(self) -> bool:
        """Whether the value is a share written in percent."""
        return self.unit.startswith("%")


_PCT_SLOTS, _PCT_ROUTERS, _PCT_TOKENS = "% of routed slots", "% of routers (token × layer)", "% of tokens"
_NATS, _NATS2 = "nats per token", "nats²"

LABELS: dict[str, tuple[str, str]] = {
    keys.TIME_STEP: ("Wall time per step", "seconds"),
    keys.TIME_ROLLOUT: ("Rollout time per step", "seconds"),
    keys.TIME_UPDATE: ("Update time per step", "seconds"),
    keys.REWARD_MEAN: ("Reward, mean over the rollout batch", "reward"),
    keys.REWARD_STD: ("Reward, standard deviation over the rollout batch", "reward"),
    keys.ACCURACY: ("Rollout accuracy", "% of responses correct"),
    keys.RESPONSE_LENGTH_MEAN: ("Response length, mean", "tokens"),
    keys.RESPONSE_LENGTH_MAX: ("Response length, longest", "tokens"),
    keys.ADVANTAGE_NONZERO: ("Sequences with a nonzero advantage", "% of sequences"),
    keys.ENTROPY: ("Policy entropy on response tokens", _NATS),
    keys.REWARD_TASK_MEAN: ("Task reward before overlong shaping", "reward"),
    keys.REWARD_OVERLONG_PENALTY: ("Overlong penalty, mean", "reward"),
    keys.REWARD_OVERLONG_FRAC: ("Responses penalised as overlong", "% of responses"),
    keys.SAMPLING_DRAWN: ("Prompt groups drawn", "groups"),
    keys.SAMPLING_DROPPED: ("Prompt groups dropped (equal rewards)", "groups"),
    keys.SAMPLING_EXTRA: ("Extra rollouts drawn", "rollouts"),
    keys.SAMPLING_FILLED: ("Dropped groups kept to fill the batch", "groups"),
    keys.MINIBATCHES: ("Minibatch updates per step", "updates"),
    keys.LOSS: ("Loss, mean over minibatches", "loss"),
    keys.GRAD_NORM: ("Gradient norm before clipping, mean over minibatches", "L2 norm"),
    keys.GRAD_NORM_MAX: ("Gradient norm before clipping, largest minibatch", "L2 norm"),
    keys.LOSS_KL_OLD_NEW_K1: ("KL from pi_old to the updated policy, k1 estimate", _NATS),
    keys.LOSS_KL_OLD_NEW_K3: ("KL from pi_old to the updated policy, k3 estimate", _NATS),
    keys.LOSS_KL_REF_K3: ("KL to the reference policy, k3 estimate", _NATS),
    keys.LOSS_POLICY: ("Policy loss term, mean over minibatches", "loss"),
    keys.LOSS_KL_PENALTY: ("KL penalty term, mean over minibatches", "loss"),
    keys.LOSS_RSPO_GAMMA_MEAN: ("RSPO router-shift weight, mean", "weight"),
    keys.LOSS_RSPO_GAMMA_MIN: ("RSPO router-shift weight, smallest", "weight"),
    keys.LOSS_RSPO_FLOOR: ("Tokens with RSPO's weight at its floor", _PCT_TOKENS),
    keys.LOSS_ROUTER_AUX: ("Router load-balancing loss", "loss"),
    keys.ROUTING_CHANGED: ("Routing change {pair}", _PCT_SLOTS),
    keys.ROUTING_ROUTER_FLIP: ("Routers flipped {pair}", _PCT_ROUTERS),
    keys.ROUTING_TOKEN_FLIP: ("Tokens with a flipped layer {pair}", _PCT_TOKENS),
    keys.ROUTING_CHANGED_SE: ("Sampling error of the routing change {pair}", _PCT_SLOTS),
    keys.ROUTING_ROUTER_FLIP_SE: ("Sampling error of the routers flipped {pair}", _PCT_ROUTERS),
    keys.MEASURE_FRACTION: ("Sequences measured (budget)", "% of sequences"),
    keys.ROUTING_REPLACE_RATE: ("Replayed expert slots the update did not use", _PCT_SLOTS),
    keys.ROUTING_BASE_CHANGED: ("Routing change from the warm-started base, rollout", _PCT_SLOTS),
    keys.INTEGRITY_COVERAGE: ("Captured routes present", "% of routers (token × layer)"),
    keys.INTEGRITY_CHANCE: ("Agreement of unrelated routes (chance)", "% of routed slots"),
    keys.INTEGRITY_LIFT: ("Captured routes' agreement with the trainer above chance, worst layer", "lift (0 chance, 1 "
                          "full)"),
    keys.INTEGRITY_DISAGREEING: ("Tokens whose captured routes disagree with the trainer", _PCT_TOKENS),
    keys.INTEGRITY_WRAPPED: ("Captured expert ids wrapped around a uint8", "1 yes, 0 no"),
    keys.INTEGRITY_FAILED: ("Route-integrity checks failed", "checks (layer × check)"),
    keys.MISMATCH_K1: ("Mismatch {pair}, k1 estimate", _NATS),
    keys.MISMATCH_K3: ("Mismatch {pair}, k3 estimate", _NATS),
    keys.MISMATCH_F2: ("Tokens whose probability ratio {pair} is beyond 2×", _PCT_TOKENS),
    keys.MISMATCH_ABS_D: ("Mean absolute log-prob difference {pair}", _NATS),
    keys.MISMATCH_SQ_D: ("Mean squared log-prob difference {pair}", "nats² per token"),
    keys.MISMATCH_F5: ("Tokens whose probability ratio {pair} is beyond 5×", _PCT_TOKENS),
    keys.MISMATCH_PROB_DIFF_MEAN: ("Token probability difference {pair}, mean", "probability"),
    keys.MISMATCH_PROB_DIFF_MAX: ("Token probability difference {pair}, largest", "probability"),
    keys.MISMATCH_PROB_DIFF_STD: ("Token probability difference {pair}, standard deviation", "probability"),
    keys.RATIO_TOKEN_MIN: ("Token ratio w, smallest", "ratio"),
    keys.RATIO_TOKEN_MAX: ("Token ratio w, largest", "ratio"),
    keys.RATIO_TOKEN_Q: ("Token ratio w, quantile {q}", "ratio"),
    keys.RATIO_TOKEN_LOG_VAR: ("Variance of the token log-ratio log w", _NATS2),
    keys.RATIO_SEQ_MIN: ("Sequence ratio s, smallest", "ratio"),
    keys.RATIO_SEQ_MAX: ("Sequence ratio s, largest", "ratio"),
    keys.RATIO_SEQ_Q: ("Sequence ratio s, quantile {q}", "ratio"),
    keys.RATIO_SEQ_LOG_VAR: ("Variance of the sequence log-ratio log s", _NATS2),
    keys.CLIP_TOKEN_FRAC: ("Clipped tokens", _PCT_TOKENS),
    keys.CLIP_SEQ_FRAC: ("Sequences with a clipped token", "% of sequences"),
    keys.CLIP_TOKEN_FRAC_LATER: ("Clipped tokens, minibatches 2..n", _PCT_TOKENS),
    keys.CLIP_SEQ_FRAC_LATER: ("Sequences with a clipped token, minibatches 2..n", "% of sequences"),
    keys.ROUTING_SHARE_VAR: ("Routing's share of the variance of log w", "% of the variance of log w"),
    keys.ROUTING_SHARE_LOG_VAR_FREE: ("Variance of log w, free routing at the update", _NATS2),
    keys.ROUTING_SHARE_LOG_VAR_REPLAYED: ("Variance of log w, pi_old's routes replayed", _NATS2),
    keys.ROUTING_SHARE_CLIP_FREE: ("Clipped tokens, free routing at the update", _PCT_TOKENS),
    keys.ROUTING_SHARE_CLIP_REPLAYED: ("Clipped tokens, pi_old's routes replayed", _PCT_TOKENS),
    keys.ROUTING_SHARE_ABS_FREE: ("Mean absolute log w, free routing at the update", _NATS),
    keys.ROUTING_SHARE_ABS_REPLAYED: ("Mean absolute log w, pi_old's routes replayed", _NATS),
    keys.EXPERTS_CONFIDENCE_MEAN: ("Router mass on the chosen experts", "share of router mass"),
    keys.HISTORY_SKIPPED: ("Prompts skipped as solved", "% of drawn prompts"),
    keys.HISTORY_KEPT_SOLVED: ("Solved prompts kept", "% of drawn prompts"),
    keys.EVAL_ACCURACY: ("Eval accuracy (greedy, fixed eval set)", "% correct"),
    keys.COLLAPSE_SCORE: ("Collapse warning rule's score", "score (warns above the rule's threshold)"),
    keys.COLLAPSE_WARNING: ("Collapse warning", "1 at a warning"),
    keys.COLLAPSE_WARNING_ON: ("Collapse warning on {signal}", "1 at a warning"),
}
"""Scalar key pattern of :data:`moestab.metrics.keys.TABLE` -> (title, unit); ``{pair}`` in a title is the pair in
words (:data:`PAIR_WORDS`), ``{q}`` the quantile. Every scalar row has one (tests/analysis/test_labels.py)."""


def _pattern_of(key: str) -> tuple[str, dict[str, str]] | None:
    """The row pattern of ``key`` and its field's value, ``None`` for a key the table does not declare."""
    row = keys.KEYS.get(key)
    if row is None:
        return None
    if row.field is None:
        return row.pattern, {}
    value = next(v for v in row.over if row.key(v) == key)
    return row.pattern, {row.field: value}


def metric_label(key: str) -> MetricLabel:
    """The title and axis label of a metrics.jsonl key. A key no row declares (another trainer's) keeps its name as
    the title and ``value`` as the unit: nothing is made up about it."""
    found = _pattern_of(key)
    if found is None or found[0] not in LABELS:
        return MetricLabel(key, "value")
    pattern, fields = found
    title, unit = LABELS[pattern]
    words = {name: PAIR_WORDS.get(value, value) for name, value in fields.items()}
    return MetricLabel(title.format_map(words) if words else title, unit)


def is_percent(key: str) -> bool:
    """Whether a key's value is a share README writes in percent (:attr:`MetricLabel.percent`)."""
    return metric_label(key).percent


def at_float_precision(value: float) -> bool:
    """Whether ``value`` is zero up to float rounding without being 0 (:data:`FLOAT_PRECISION`); NaN is not."""
    return math.isfinite(value) and 0 < abs(value) < FLOAT_PRECISION


def format_value(value: float | None, percent: bool = False, *, difference: bool = False) -> str:
    """The text a table shows for a value: ``""`` for a missing one (NaN, None: nothing applies), ``0 (at float
    precision)`` below :data:`FLOAT_PRECISION` (0 itself is ``0``), else three significant digits (``14.2%`` for a
    share when ``percent``, ``4.65e-04`` below 0.001). ``difference``: a signed difference (``+1.23``; of shares in
    percentage points, ``+1.23 pp``)."""
    if value is None or not math.isfinite(value):
        return ""
    if at_float_precision(value):
        return AT_PRECISION
    shown = value * 100 if percent else value
    text = f"{shown:.3g}"
    if "e" in text or (not percent and 0 < abs(shown) < 1e-3):
        text = f"{shown:.2e}"
    unit = (" pp" if difference else "%") if percent else ""
    return f"{'+' if difference and value > 0 else ''}{text}{unit}"

