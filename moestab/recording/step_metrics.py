"""A step's metrics.jsonl line, from what any trainer can supply: the functions the key table names.

:func:`step_metrics` calls each function that :data:`moestab.metrics.keys.TABLE` names for a computed key, once per
step, with one :class:`StepView` (the step's tensors, the replay mode and the trainer's update reports, with the
arrays several functions read built once), and returns their keys and the trainer's measured ones in metrics.jsonl's
order. A function returns only keys its rows declare, and only those that apply (``{}`` for what the trainer did not
supply). Every number is computed by :mod:`moestab.metrics`, which the analyzers also call on the per-token tables,
so a logged value and its offline recomputation cannot drift apart.

Under a measurement budget (``StepTensors.measured``), a metric that reads a column of ``StepTensors.sampled`` is
computed on the measured tokens only; the route-change rates of such pairs also get their sampling error
(``routing/<pair>/*_se``, :func:`moestab.metrics.sampling.ratio_se`), and an unmeasured step logs none of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from moestab import rl
from moestab.metrics import keys
from moestab.metrics.experts import expert_counts, load_stats
from moestab.metrics.integrity import route_integrity
from moestab.metrics.mismatch import mismatch_stats
from moestab.metrics.ratios import clip_fractions, ratio_stats
from moestab.metrics.routes import intersection_sizes, route_change, token_changes
from moestab.metrics.routing_share import routing_share, routing_share_by_minibatch
from moestab.metrics.sampling import ratio_se
from moestab.recording.step_fields import POSITIONS, ROUTES, SEQUENCE
from moestab.recording.step_tensors import StepTensors, step_fields
from moestab.run_folder import schema

LOSS_DIAGNOSTIC_PREFIXES = ("objective/", "kl/", "rspo/")
"""Loss diagnostics logged as their mean over minibatches (``loss/<key>``). The loss's ratio and clip statistics are
not: per minibatch they would be averaged maxima and a diluted clip share, so the step reports ``ratio/*`` and
``clip/*`` over all its tokens instead."""


@dataclass(frozen=True)
class Updates:
    """What a trainer's minibatch updates report, one entry per minibatch (``moestab train``; TRL logs its own)."""

    losses: list[float]
    """The loss each update minimised."""
    grad_norms: list[float]
    """Gradient norm before clipping, each update."""
    diagnostics: list[dict[str, torch.Tensor]]
    """The loss's metrics (``rl.compute_loss_parts(...).metrics``), each update."""


class StepView:
    """One step as its metric functions read it. Arrays are numpy, at the step's response tokens in row-major order
    (``[tokens, ...]``), built on first use and shared."""

    def __init__(self, tensors: StepTensors, *, replay: str, updates: Updates | None = None) -> None:
        self.tensors = tensors
        self.replay = replay
        """The routing replay mode (``schema.REPLAY_MODES``; ``off`` for a trainer that replays nothing)."""
        self.updates = updates
        """The trainer's update reports, or None when it gives none."""
        self._columns: dict[str, np.ndarray] = {}
        self._intersections: dict[str, np.ndarray] = {}
        self._changes: dict[str, dict[str, np.ndarray]] = {}

    def column(self, name: str) -> np.ndarray:
        """Token-table column ``name`` at the step's response tokens (``[tokens]``; route columns ``[tokens, layers,
        k]``): a declared step field's (``step_fields``), or the rollout's own routes and log-probs."""
        if name not in self._columns:
            t = self.tensors
            if name == schema.COL_ROUTES_ROLLOUT:
                value = t.response(t.batch.routes.indices)
            elif name == schema.COL_LOGP_ROLLOUT:
                value = t.tokens(t.batch.logp_rollout)
            else:
                field = next((f for f in step_fields() if f.column == name), None)
                if field is None:
                    raise KeyError(f"no step field writes the token-table column {name!r}")
                raw = t.get(field.name)
                if field.kind == ROUTES:
                    value = t.response(raw.indices)
                elif field.kind == POSITIONS:
                    value = t.response(raw)
                elif field.kind == SEQUENCE:
                    value = t.per_token(raw)
                else:
                    value = t.tokens(raw)
            self._columns[name] = _numpy(value)
        return self._columns[name]

    @cached_property
    def routes(self) -> dict[str, np.ndarray]:
        """Route sets ``[tokens, layers, k]`` by token-table column (``schema.ROUTE_COLUMNS``)."""
        return {column: self.column(column) for column in schema.ROUTE_COLUMNS}

    @cached_property
    def logp(self) -> dict[str, np.ndarray]:
        """Log-probs ``[tokens]`` of the rollout and of pi_old on both sides, by token-table column."""
        return {column: self.column(column)
                for column in (schema.COL_LOGP_ROLLOUT, schema.COL_LOGP_OLD, schema.COL_LOGP_OLD_FREE)}

    @cached_property
    def sequence(self) -> np.ndarray:
        """``[tokens]`` each token's row in the batch."""
        return _numpy(self.tensors.per_token(torch.arange(self.tensors.batch.batch_size)))

    @cached_property
    def minibatch(self) -> np.ndarray:
        """``[tokens]`` the 0-based minibatch that updated each token's sequence."""
        return _numpy(self.tensors.per_token(self.tensors.minibatch))

    @cached_property
    def group(self) -> np.ndarray:
        """``[tokens]`` each token's group (the prompt its sequence answers)."""
        t = self.tensors
        return _numpy(t.per_token(torch.arange(t.batch.batch_size) // t.group_size))

    @cached_property
    def measured(self) -> np.ndarray:
        """``[tokens]`` bool: the tokens the measure-only forwards scored (all of them without a budget)."""
        t = self.tensors
        if t.measured is None:
            return np.ones(int(t.batch.response_mask.sum()), bool)
        return _numpy(t.per_token(t.measured.to(torch.bool)))

    def sampled(self, *columns: str) -> bool:
        """Whether any of ``columns`` is known on the measured tokens only."""
        return any(self.tensors.is_sampled(c) for c in columns)

    def keep(self, *columns: str) -> np.ndarray | slice | None:
        """Index of the tokens a metric of ``columns`` is computed on: the measured ones when any is sampled, None
        when that is none (an unmeasured step: the metric is not logged)."""
        if not self.sampled(*columns):
            return slice(None)
        return self.measured if self.measured.any() else None

    @property
    def top_k(self) -> int:
        return self.tensors.routes_old_free.top_k

    def intersections(self, pair: str) -> np.ndarray:
        """``|E_a ∩ E_b|`` ``[tokens, layers]`` of route pair ``pair`` (``schema.ROUTE_PAIRS``), computed once a step
        however many metric functions read it."""
        if pair not in self._intersections:
            col_a, col_b = schema.ROUTE_PAIRS[pair]
            self._intersections[pair] = intersection_sizes(self.routes[col_a], self.routes[col_b], threads=1)
        return self._intersections[pair]

    def changes(self, pair: str) -> dict[str, np.ndarray] | None:
        """``route_change`` of ``pair`` over the tokens :meth:`keep` gives it (None on a step that measured none),
        computed once a step for the metric functions that read it (routing change, route integrity)."""
        keep = self.keep(*schema.ROUTE_PAIRS[pair])
        if keep is None:
            return None
        if pair not in self._changes:
            self._changes[pair] = route_change(self.intersections(pair)[keep], self.top_k)
        return self._changes[pair]


def _numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().numpy()


# ---- the metric functions (each named by rows of moestab.metrics.keys) ----------------------------------------
@keys.computes(keys.REWARD_MEAN, keys.REWARD_STD, keys.ACCURACY)
def reward_metrics(v: StepView) -> dict[str, float]:
    """Reward and accuracy of the step's sequences, when the trainer knows them."""
    t = v.tensors
    if t.rewards is None:
        return {}
    out = {keys.REWARD_MEAN: t.rewards.mean().item(),
           keys.REWARD_STD: t.rewards.std().item() if len(t.rewards) > 1 else 0.0}
    if t.correct is not None:
        out[keys.ACCURACY] = t.correct.float().mean().item()
    return out


@keys.computes(keys.RESPONSE_LENGTH_MEAN, keys.RESPONSE_LENGTH_MAX, keys.ADVANTAGE_NONZERO, keys.ENTROPY)
def response_metrics(v: StepView) -> dict[str, float]:
    """Response length, share of non-zero advantages and pi_old's mean token entropy (when recorded) of a step."""
    t = v.tensors
    mask = t.batch.response_mask  # [B, T]
    lengths = mask.sum(-1)  # [B]
    out = {
        keys.RESPONSE_LENGTH_MEAN: lengths.float().mean().item(),
        keys.RESPONSE_LENGTH_MAX: int(lengths.max()),
        keys.ADVANTAGE_NONZERO: (t.advantages != 0).float().mean().item(),
    }
    keep = v.keep(schema.COL_LOGP_OLD_FREE)  # the entropy comes from the free pi_old forward
    if t.entropy is not None and keep is not None:
        rows = t.measured if isinstance(keep, np.ndarray) else slice(None)
        out[keys.ENTROPY] = rl.masked_mean(t.entropy[rows], mask[rows]).item()
    return out


@keys.computes(keys.LOSS, keys.GRAD_NORM, keys.GRAD_NORM_MAX)
def update_metrics(v: StepView) -> dict[str, float]:
    """The updates' loss and gradient norm: means over the minibatches, and the largest norm."""
    if v.updates is None:
        return {}
    losses, norms = v.updates.losses, v.updates.grad_norms
    return {keys.LOSS: sum(losses) / len(losses), keys.GRAD_NORM: sum(norms) / len(norms),
            keys.GRAD_NORM_MAX: max(norms)}


@keys.computes(keys.LOSS_KL_OLD_NEW_K1, keys.LOSS_KL_OLD_NEW_K3, keys.LOSS_KL_REF_K3, keys.LOSS_POLICY,
               keys.LOSS_KL_PENALTY, keys.LOSS_RSPO_GAMMA_MEAN, keys.LOSS_RSPO_GAMMA_MIN, keys.LOSS_RSPO_FLOOR,
               keys.LOSS_ROUTER_AUX)
def loss_metrics(v: StepView) -> dict[str, float]:
    """Mean over minibatches of the loss diagnostics of :data:`LOSS_DIAGNOSTIC_PREFIXES`, under ``loss/``.

    NaN-valued entries (e.g. ``kl/ref_k3`` without a reference) are skipped; all-NaN gives NaN.
    """
    if v.updates is None:
        return {}
    per_minibatch = v.updates.diagnostics
    out: dict[str, float] = {}
    for key in per_minibatch[0]:
        if not key.startswith(LOSS_DIAGNOSTIC_PREFIXES):
            continue
        values = [float(m[key]) for m in per_minibatch if math.isfinite(float(m[key]))]
        out[f"loss/{key}"] = sum(values) / len(values) if values else float("nan")
    return out


@keys.computes(keys.ROUTING_CHANGED, keys.ROUTING_ROUTER_FLIP, keys.ROUTING_TOKEN_FLIP,
               keys.ROUTING_CHANGED_BY_LAYER, keys.ROUTING_CHANGED_SE, keys.ROUTING_ROUTER_FLIP_SE)
def routing_metrics(v: StepView) -> dict[str, object]:
    """Routing change of every pair of :data:`~moestab.metrics.keys.ROUTE_METRIC_PAIRS` over the step's tokens (a
    sampled pair: over the measured tokens, with the sampling error of ``changed`` and ``router_flip``; nothing on a
    step that measured none)."""
    out: dict[str, object] = {}
    for pair in keys.ROUTE_METRIC_PAIRS:
        columns = schema.ROUTE_PAIRS[pair]
        keep = v.keep(*columns)
        if keep is None:
            continue
        rates = v.changes(pair)  # one group: every value [1]
        for stat, pattern in keys.ROUTE_CHANGE_KEYS.items():
            value = rates[stat][0]
            out[pattern.format(pair=pair)] = value.tolist() if value.ndim else float(value)
        if v.sampled(*columns):
            n_groups = len(v.tensors.examples)
            by_group = route_change(v.intersections(pair)[keep], v.top_k, v.group[keep], n_groups)
            scored = by_group["routers"] > 0  # [groups] the sampled ones
            for stat, pattern in keys.ROUTE_CHANGE_SE_KEYS.items():
                decisions = by_group["routers"][scored]  # [m]
                out[pattern.format(pair=pair)] = ratio_se(by_group[stat][scored] * decisions, decisions, n_groups)
    return out


@keys.computes(keys.INTEGRITY_COVERAGE, keys.INTEGRITY_COVERAGE_BY_LAYER, keys.INTEGRITY_INVALID_BY_LAYER,
               keys.INTEGRITY_CONSTANT_BY_LAYER, keys.INTEGRITY_WRAPPED, keys.INTEGRITY_AGREEMENT_BY_LAYER,
               keys.INTEGRITY_CHANCE, keys.INTEGRITY_LIFT, keys.INTEGRITY_DISAGREEING, keys.INTEGRITY_FAILED)
def integrity_metrics(v: StepView) -> dict[str, object]:
    """``routes/integrity/*`` of the rollout's routes, against the trainer's free pi_old routes of the same tokens
    where they are known (a sampled pair: on the measured tokens; none on an unmeasured step). Under a base-routed
    replay the rollout's routes are the base's by design: their agreement is reported, not judged."""
    rollout = v.routes[schema.COL_ROUTES_ROLLOUT]
    keep = v.keep(schema.COL_ROUTES_ROLLOUT, schema.COL_ROUTES_OLD_FREE)
    num_experts = v.tensors.routes_old_free.num_experts
    judged = v.replay not in schema.BASE_ROUTED_MODES
    if keep is None:
        return route_integrity(rollout, num_experts=num_experts, agreement=judged)
    pair = "rollout_old_free"  # the routing change's own counts, and each token's change beside them
    changes = {"changed_by_layer": v.changes(pair)["changed_by_layer"],
               "changed_by_token": token_changes(v.intersections(pair)[keep], v.top_k)}
    return route_integrity(rollout[keep], v.routes[schema.COL_ROUTES_OLD_FREE][keep], num_experts=num_experts,
                           agreement=judged, changes=changes)


@keys.computes(keys.ROUTING_UPDATE_DRIFT)
def drift_metrics(v: StepView) -> dict[str, object]:
    """Per minibatch, how far the free routes at update time had drifted from pi_old's. Under replay the update
    forward does not choose its routes, so there is nothing to measure (null)."""
    by_mb = None
    if v.replay == "off":
        n_mb = int(v.tensors.minibatch.max()) + 1
        by_mb = route_change(v.intersections("update_old"), v.top_k, v.minibatch, n_mb)["changed"].tolist()
    return {keys.ROUTING_UPDATE_DRIFT: by_mb}  # NaN (-> null) for an empty minibatch


@keys.computes(keys.ROUTING_REPLACE_RATE)
def replay_metrics(v: StepView) -> dict[str, float]:
    """Under routing replay, the share of replayed slots the update forwards replaced (score-threshold replay; 0 for
    plain replay): the slot-level change between the routes they used and the routes they replayed (``update_old``)."""
    if v.replay == "off":
        return {}
    return {keys.ROUTING_REPLACE_RATE: float(route_change(v.intersections("update_old"), v.top_k)["changed"][0])}


@keys.computes(keys.MISMATCH_K1, keys.MISMATCH_K3, keys.MISMATCH_F2)
def mismatch_metrics(v: StepView) -> dict[str, float]:
    """Rollout -> trainer log-prob mismatch of every pair of ``schema.LOGP_PAIRS``."""
    out: dict[str, float] = {}
    for pair, (rollout, trainer) in schema.LOGP_PAIRS.items():
        keep = v.keep(rollout, trainer)
        if keep is None:
            continue
        stats = mismatch_stats(v.logp[trainer][keep], v.logp[rollout][keep])
        out.update({pattern.format(pair=pair): stats[stat] for stat, pattern in keys.MISMATCH_KEYS.items()})
    return out


@keys.computes(keys.RATIO_TOKEN_MIN, keys.RATIO_TOKEN_MAX, keys.RATIO_TOKEN_Q, keys.RATIO_TOKEN_LOG_VAR,
               keys.RATIO_SEQ_MIN, keys.RATIO_SEQ_MAX, keys.RATIO_SEQ_Q, keys.RATIO_SEQ_LOG_VAR)
def ratio_metrics(v: StepView) -> dict[str, float]:
    """Distribution of the token ratio ``w`` and the sequence ratio ``s`` that entered the loss."""
    log_w = _numpy(v.tensors.tokens(v.tensors.log_w))  # [tokens]
    return {keys.RATIO_KEYS[stat]: value for stat, value in ratio_stats(log_w, v.sequence).items()}


@keys.computes(keys.CLIP_TOKEN_FRAC, keys.CLIP_SEQ_FRAC, keys.CLIP_TOKEN_FRAC_LATER, keys.CLIP_SEQ_FRAC_LATER)
def clip_metrics(v: StepView) -> dict[str, float]:
    """Clipped shares of the step's tokens and sequences, over all minibatches and over minibatches 2..n."""
    clipped = _numpy(v.tensors.tokens(v.tensors.clipped))  # [tokens]
    return {keys.CLIP_KEYS[stat]: value for stat, value in clip_fractions(clipped, v.sequence, v.minibatch).items()}


@keys.computes(keys.ROUTING_SHARE_VAR, keys.ROUTING_SHARE_LOG_VAR_FREE, keys.ROUTING_SHARE_LOG_VAR_REPLAYED,
               keys.ROUTING_SHARE_CLIP_FREE, keys.ROUTING_SHARE_CLIP_REPLAYED, keys.ROUTING_SHARE_ABS_FREE,
               keys.ROUTING_SHARE_ABS_REPLAYED, keys.ROUTING_SHARE_BY_MINIBATCH)
def routing_share_metrics(v: StepView) -> dict[str, object]:
    """Routing's share of the ratio (:mod:`moestab.metrics.routing_share`) over the step's tokens and per minibatch,
    when the trainer measured the counterfactual log-probs. The update forward is the free side under ``off`` and
    the replayed side under every replay mode; the counterfactual is the other."""
    t = v.tensors
    if t.logp_update_counterfactual is None or t.clipped_counterfactual is None or not v.measured.any():
        return {}
    keep = v.measured  # [tokens] the counterfactual forward scores the budget's sample
    actual = (_numpy(t.tokens(t.log_w))[keep], _numpy(t.tokens(t.clipped))[keep])  # [tokens'] each
    other = (_numpy(t.tokens(t.log_w_counterfactual))[keep], _numpy(t.tokens(t.clipped_counterfactual))[keep])
    (free_w, free_clip), (replayed_w, replayed_clip) = (actual, other) if v.replay == "off" else (other, actual)
    arrays = (free_w, replayed_w, free_clip, replayed_clip)
    out: dict[str, object] = {keys.ROUTING_SHARE_KEYS[stat]: value for stat, value in routing_share(*arrays).items()}
    by_mb = routing_share_by_minibatch(*arrays, v.minibatch[keep], int(t.minibatch.max()) + 1)
    out.update({keys.ROUTING_SHARE_BY_MINIBATCH.format(stat=stat): values for stat, values in by_mb.items()})
    return out


@keys.computes(keys.EXPERTS_LOAD, keys.EXPERTS_LOAD_ENTROPY, keys.EXPERTS_ROUTER_ENTROPY, keys.EXPERTS_CONFIDENCE,
               keys.EXPERTS_CONFIDENCE_MEAN)
def expert_metrics(v: StepView) -> dict[str, object]:
    """Expert load under pi_old (free) and, when recorded, its routers' entropy and confidence, per layer."""
    t = v.tensors
    free = t.routes_old_free
    keep = v.keep(schema.COL_ROUTES_OLD_FREE)
    if keep is None:
        return {}
    counts = expert_counts(v.routes[schema.COL_ROUTES_OLD_FREE][keep], free.num_experts)  # [layers, experts]
    out: dict[str, object] = {
        keys.EXPERTS_LOAD: (counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)).round(6).tolist(),
        keys.EXPERTS_LOAD_ENTROPY: [float(x) for x in load_stats(counts)["load_entropy"]],
    }
    rows = torch.as_tensor(keep) if isinstance(keep, np.ndarray) else keep
    if free.entropy is not None:
        out[keys.EXPERTS_ROUTER_ENTROPY] = t.response(free.entropy)[rows].mean(0).tolist()  # [layers]
    if free.confidence is not None:
        confidence = t.response(free.confidence)[rows]  # [tokens', layers]
        out[keys.EXPERTS_CONFIDENCE] = confidence.mean(0).tolist()
        out[keys.EXPERTS_CONFIDENCE_MEAN] = confidence.mean().item()
    return out


@keys.computes(keys.MEASURE_FRACTION)
def measure_metrics(v: StepView) -> dict[str, float]:
    """Under a measurement budget, the share of the step's sequences the measure-only forwards scored."""
    measured = v.tensors.measured
    return {} if measured is None else {keys.MEASURE_FRACTION: measured.float().mean().item()}


# ---- the line ---------------------------------------------------------------------------------------------------
STEP_METRICS: tuple[Callable[[StepView], dict[str, object]], ...] = (
    reward_metrics, response_metrics, update_metrics, loss_metrics, routing_metrics, measure_metrics, drift_metrics,
    replay_metrics, mismatch_metrics, ratio_metrics, clip_metrics, routing_share_metrics, integrity_metrics,
    expert_metrics,
)
"""The functions of a step's computed keys, each marked with the rows it computes (``keys.computes``)."""


def step_metrics(
    t: StepTensors, *, replay: str, updates: Updates | None = None, measured: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """A step's metrics.jsonl line but ``step``: every computed key of the key table that applies, from ``t``,
    ``replay`` and ``updates``, with the trainer's ``measured`` keys (times, minibatches, sampling counts: keys the
    table declares as measured), in metrics.jsonl's order.

    Raises :class:`~moestab.metrics.keys.UndeclaredKeyError` for a key the table does not declare, and
    ``ValueError`` for a key that a function other than its row's returned, or a computed key given as measured.
    """
    measured = dict(measured or {})
    computed_measured = [key for key in measured if key in keys.KEYS and keys.KEYS[key].computed]
    if computed_measured:
        raise ValueError(f"{computed_measured} are computed by the recording layer, not measured by the trainer")
    view = StepView(t.to("cpu"), replay=replay, updates=updates)  # host-side work; a no-op for a host record
    values: dict[str, object] = dict(measured)
    for function in STEP_METRICS:
        out = function(view)
        keys.in_table_order(out)  # every key declared
        strays = [key for key in out if keys.KEYS[key].pattern not in keys.owned_keys(function)]
        if strays:
            raise ValueError(f"{keys.owner_name(function)} returned {strays}, which it is not marked to compute "
                             "(keys.computes)")
        values.update(out)
    return keys.in_table_order(values)
