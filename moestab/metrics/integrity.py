"""Does a route capture tell the truth? Checks of a capture's routes ``[tokens, layers, top_k]``, per MoE layer.

A replay of wrong routes trains on wrong routes, and the field's failures are silent (docs/integrations.md, "Route
integrity"): an engine returning all-zero routes from one kernel, dropped or misaligned rows, routes of another turn,
layer order or model. A well-formed wrong capture passes every shape check; what gives it away is the routes
themselves, and above all their **agreement with the trainer's own routing on the same tokens**: a right capture
agrees far above chance (the rollout -> trainer change is a few percent), a capture of other tokens, layers or
weights falls to about chance, ``top_k / num_experts`` per slot.

Per layer, over the capture's rows (one per response token):

- ``coverage``: share of rows with a route (every slot recorded; -1 marks a slot not recorded, which importers also
  put where an engine zero-filled a row);
- ``invalid``: share of recorded rows naming an expert outside the model (>= ``num_experts``) or one expert twice;
- ``constant``: 1.0 when every recorded row names the same experts (at least :data:`MIN_ROWS` of them): a layer
  zeroed, or filled with one decision;
- ``wrapped`` (a model of more than 256 experts): 1 when no id reaches 256, ids stored as uint8 having wrapped;
- ``agreement`` (with a reference, the trainer's routes of the same tokens): mean share of a row's slots whose expert
  the reference also chose, ``1 - changed`` of :func:`moestab.metrics.routes.change_rates`; ``lift`` rescales it
  so that chance (``top_k / num_experts``) is 0 and full agreement 1; ``disagreeing``: the share of tokens whose
  agreement over their layers has a lift below the threshold (a fault confined to some tokens, e.g. one turn).

A layer fails a check when it is past the check's threshold (:class:`Thresholds`, docs/metrics.md states them);
:func:`failures` names each failing (layer, check) from the logged keys, so every consumer (``moestab train``, the
TRL integration, ``DiagnosticsRun``) words a broken capture the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from moestab.metrics import keys
from moestab.metrics.routes import repeated_experts, route_change_of

WRAP = 256
"""Ids of a model with more experts than this do not fit a uint8: a capture stored as uint8 wraps them around."""
MIN_WRAP_SLOTS = 256
"""Recorded slots a capture needs before ids that never reach :data:`WRAP` say the ids wrapped (a router that never
picks one of the experts above 255 in this many slots is not a real router's)."""
MIN_ROWS = 16
"""Recorded rows a layer needs before ``constant`` can call it filled with one decision (a few tokens may share
their experts by chance)."""


@dataclass(frozen=True)
class Thresholds:
    """Where a layer fails: ``coverage`` below, ``invalid`` above, ``constant`` at 1, ``lift`` below."""

    coverage: float = 0.99
    invalid: float = 0.0
    lift: float = 0.5
    """Agreement rescaled from chance (0) to full (1), per layer and per token (docs/integrations.md, "Route
    integrity", scripts/integrity_faults.py, measures both on clean captures and planted faults)."""
    disagreeing: float = 0.05
    """Share of tokens whose agreement over their layers has a lift below :attr:`lift`."""


THRESHOLDS = Thresholds()



class BrokenCaptureError(RuntimeError):
    """A route capture failed an integrity check under the ``refuse`` policy; the message names the step, the layer
    and the check."""


def route_integrity(captured: np.ndarray, reference: np.ndarray | None = None, *, num_experts: int | None = None,
                    agreement: bool = True, changes: Mapping[str, np.ndarray] | None = None,
                    distinct: bool = False) -> dict[str, object]:
    """``routes/integrity/*`` of a capture ``[tokens, layers, top_k]`` (int16, -1 = not recorded) against an optional
    ``reference`` of the same tokens (the trainer's own routes), for a model of ``num_experts`` experts (None: the
    out-of-model check and the lift are skipped). ``agreement=False``: the agreement is reported but not counted as
    a failure (:func:`failures`). A caller that has them already passes ``changes`` (``route_change(...,
    by_token=True)`` or ``route_change_of(captured, reference, by_token=True)`` of the pair) and ``distinct=True`` (it
    has refused any decision naming an expert twice), so neither is computed again."""
    tokens, layers, k = captured.shape
    recorded = _recorded(captured)  # [tokens, layers] every slot recorded; None: every decision
    rows = np.full(layers, tokens) if recorded is None else recorded.sum(axis=0)  # [layers]
    bad = None if distinct else repeated_experts(np.ascontiguousarray(captured))  # [tokens, layers]
    top = int(captured.max(initial=-1)) if num_experts is not None else -1  # one pass: the largest id
    if num_experts is not None and top >= num_experts:
        outside = captured.max(axis=2) >= num_experts  # [tokens, layers] only when some id is outside the model
        bad = outside if bad is None else bad | outside
    if bad is not None and recorded is not None:
        bad &= recorded
    with np.errstate(invalid="ignore", divide="ignore"):
        coverage = rows / tokens if tokens else np.full(layers, np.nan)  # [layers]
        invalid = (np.zeros(layers) if bad is None else bad.sum(axis=0)) / rows  # [layers] NaN: nothing recorded
    constant = np.array([_constant(captured[:, j], None if recorded is None else recorded[:, j], int(rows[j]))
                         for j in range(layers)])  # [layers]
    out: dict[str, object] = {
        keys.INTEGRITY_COVERAGE: float(rows.sum() / (tokens * layers)) if tokens and layers else None,
        keys.INTEGRITY_COVERAGE_BY_LAYER: _values(coverage),
        keys.INTEGRITY_INVALID_BY_LAYER: _values(invalid),
        keys.INTEGRITY_CONSTANT_BY_LAYER: _values(constant),
    }
    if num_experts is not None:
        slots = int(rows.sum()) * k
        out[keys.INTEGRITY_WRAPPED] = int(num_experts > WRAP and slots >= MIN_WRAP_SLOTS
                                          and top < WRAP)
    if reference is not None:
        if reference.shape != captured.shape:
            raise ValueError(f"reference {tuple(reference.shape)} must be the capture's tokens, layers and top_k "
                             f"{tuple(captured.shape)}")
        # An unrecorded slot on either side leaves that decision out of the agreement.
        if changes is None:
            changes = route_change_of(captured, np.ascontiguousarray(reference, dtype=np.int16), threads=1,
                                      by_token=True)
        agree = 1.0 - np.asarray(changes["changed_by_layer"]).reshape(layers)  # [layers]
        chance = k / num_experts if num_experts else None
        out[keys.INTEGRITY_AGREEMENT_BY_LAYER] = _values(agree)
        if chance is not None:
            out[keys.INTEGRITY_CHANCE] = chance
        if chance is not None and chance < 1:
            lift = (agree - chance) / (1 - chance)  # [layers]
            out[keys.INTEGRITY_LIFT] = float(np.nanmin(lift)) if np.isfinite(lift).any() else None
            out[keys.INTEGRITY_DISAGREEING] = _disagreeing(np.asarray(changes["changed_by_token"]), chance,
                                                           THRESHOLDS.lift)
    out[keys.INTEGRITY_FAILED] = len(failures(out, agreement=agreement))
    return keys.in_table_order(out)


def _recorded(captured: np.ndarray) -> np.ndarray | None:
    """bool ``[tokens, layers]``: decisions with every slot recorded; None when every decision is. One pass over the
    whole array says whether any slot is unrecorded (the usual capture has none); only then is every row reduced."""
    if not captured.size or int(captured.min()) >= 0:
        return None
    return captured.min(axis=2) >= 0


def with_model(metrics: Mapping[str, object], top_k: int, num_experts: int) -> dict[str, object]:
    """``metrics`` with the agreement's chance, lift and failure count filled in from the model (``top_k`` of
    ``num_experts``) when the integrity keys came without them (``route_diagnostics`` called without
    ``num_experts``); unchanged otherwise."""
    agreement = metrics.get(keys.INTEGRITY_AGREEMENT_BY_LAYER)
    if not isinstance(agreement, list) or metrics.get(keys.INTEGRITY_CHANCE) is not None:
        return dict(metrics)
    chance = top_k / num_experts
    out = dict(metrics)
    out[keys.INTEGRITY_CHANCE] = chance
    lifts = [(v - chance) / (1 - chance) for v in agreement if v is not None] if chance < 1 else []
    out[keys.INTEGRITY_LIFT] = min(lifts) if lifts else None
    out[keys.INTEGRITY_FAILED] = len(failures(out))
    return keys.in_table_order(out)


def _disagreeing(changed_by_token: np.ndarray, chance: float, lift: float) -> float | None:
    """Share of the tokens compared (a layer recorded on both sides; ``changed_by_token`` NaN otherwise) whose
    agreement over their layers has a lift below ``lift``: a fault confined to some tokens (a misaligned turn) that
    the layers' means dilute."""
    compared = np.isfinite(changed_by_token)  # [tokens]
    if not compared.any():
        return None
    agree = 1.0 - changed_by_token[compared]  # [tokens']
    return float(((agree - chance) / (1 - chance) < lift).mean())


def _constant(rows: np.ndarray, recorded: np.ndarray | None, count: int) -> float:
    """1.0 when at least :data:`MIN_ROWS` recorded rows (``rows`` ``[n, k]`` where ``recorded``, ``count`` of them;
    ``recorded`` None: every row) all name the same experts, in any slot order, else 0.0. A real router differs
    within its first few rows, so most layers are decided there without reading the rest."""
    if count < MIN_ROWS:
        return 0.0
    head = np.arange(min(len(rows), 4 * MIN_ROWS)) if recorded is None else np.flatnonzero(recorded[: 4 * MIN_ROWS])
    first = rows[0] if recorded is None else rows[int(np.argmax(recorded))]  # the first recorded row
    if not np.isin(rows[head], first).all():
        return 0.0
    return float(np.isin(rows if recorded is None else rows[recorded], first).all())


def _values(values: np.ndarray) -> list[float | None]:
    return [None if not np.isfinite(v) else float(v) for v in np.asarray(values, dtype=np.float64)]


def failures(metrics: Mapping[str, object], thresholds: Thresholds = THRESHOLDS, *,
             agreement: bool = True) -> list[str]:
    """Each (layer, check) of a step's ``routes/integrity/*`` keys past its threshold, as ``"layer 2: coverage 0.50
    < 0.99"``; ``agreement=False`` leaves the agreement check out (a run whose captured routes are not the policy's
    own by design: ``--routing-replay base``)."""
    out = []

    def layer_values(key: str) -> list:
        value = metrics.get(key)
        return value if isinstance(value, list) else []

    for j, v in enumerate(layer_values(keys.INTEGRITY_COVERAGE_BY_LAYER)):
        if v is not None and v < thresholds.coverage:
            out.append(f"layer {j}: coverage {v:.3f} < {thresholds.coverage} (rows without a route)")
    for j, v in enumerate(layer_values(keys.INTEGRITY_INVALID_BY_LAYER)):
        if v is not None and v > thresholds.invalid:
            out.append(f"layer {j}: invalid {v:.3f} > {thresholds.invalid} (ids outside the model or repeated in "
                       "one top-k)")
    for j, v in enumerate(layer_values(keys.INTEGRITY_CONSTANT_BY_LAYER)):
        if v == 1.0:
            out.append(f"layer {j}: constant (every row names the same experts)")
    if metrics.get(keys.INTEGRITY_WRAPPED) == 1:
        out.append(f"every layer: no id reaches {WRAP} although the model has more experts (ids wrapped around a "
                   "uint8)")
    chance = metrics.get(keys.INTEGRITY_CHANCE)
    share = metrics.get(keys.INTEGRITY_DISAGREEING)
    if agreement and isinstance(share, float) and share > thresholds.disagreeing:
        out.append(f"every layer: {share:.1%} of tokens disagree with the trainer (token lift < {thresholds.lift}; "
                   f"at most {thresholds.disagreeing:.0%}): a turn or span misaligned")
    if agreement and isinstance(chance, float) and chance < 1:
        for j, v in enumerate(layer_values(keys.INTEGRITY_AGREEMENT_BY_LAYER)):
            if v is not None and (v - chance) / (1 - chance) < thresholds.lift:
                out.append(f"layer {j}: agreement with the trainer {v:.3f}, lift {(v - chance) / (1 - chance):.3f} "
                           f"< {thresholds.lift} over chance {chance:.3f} (shifted, misaligned, other layers or "
                           "another model)")
    return out
