"""``StepTensors``: everything one RL step computed per sequence and response token, for metrics and records. Its
fields are declared once (:data:`moestab.recording.step_fields.STEP_FIELDS`); moving, merging across processes,
writing the token table and the metrics' views iterate over the declaration, and a measurement that fills a field of
its own declares it (``Measurement.declares``) and the same code carries it (:attr:`StepTensors.extra`)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from moestab.recording import measurements
from moestab.recording.batch import RolloutBatch, cat_batches, pad_positions, relay_positions
from moestab.recording.step_fields import BATCH, EXAMPLES, POSITIONS, ROUTES, SEQUENCE, STEP_FIELDS, TOKEN, StepField
from moestab.routing import Routes
from moestab.tasks import Example


@dataclass(frozen=True)
class StepTensors:
    """One step's per-token results. Token tensors are ``[B, T]`` (response positions); route tensors
    ``[B, L, layers, top_k]`` over the trainer's input positions (see :mod:`moestab.recording.batch`).

    pi_old is kept on both sides: *as used in the ratio* (``logp_old`` / ``routes_old``: the rollout
    engine's routes under R3) and with the trainer's *free* routing (``logp_old_free`` /
    ``routes_old_free``); without R3 the two are identical.
    """

    batch: RolloutBatch
    examples: list[Example]
    rewards: torch.Tensor | None  # [B] task reward plus any shaping; None when the trainer does not know it (TRL)
    correct: torch.Tensor | None  # [B] bool: the task scores the response correct; None when unknown (TRL)
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
    entropy: torch.Tensor | None = None  # [B, T] pi_old's token entropy (free routing)
    logp_update_counterfactual: torch.Tensor | None = None
    """``[B, T]`` the update weights' log-probs (before the minibatch's optimizer step) with the *other* routing than
    ``logp_update``'s: the routes that produced ``logp_old`` replayed when the update routed freely (replay ``off``),
    free routing when it replayed (R2 / R3 / TRR). None when not measured (``--routing-share``, or the TRL
    integration's ``RecordSettings.routing_share``, off)."""
    clipped_counterfactual: torch.Tensor | None = None
    """``[B, T]`` bool: the token's governing ratio would have been clipped with ``logp_update_counterfactual``
    (the loss's clip rule, every other input as in the update); None when not measured."""
    measured: torch.Tensor | None = None
    """``[B]`` bool: the sequences the measure-only forwards scored (a ``MeasureBudget``'s sample of whole groups,
    :mod:`moestab.recording.measure_budget`); None: every sequence. The fields named in ``sampled`` hold values on these
    rows only (log-probs NaN, routes -1 elsewhere), and so do the counterfactual log-probs when present."""
    sampled: frozenset[str] = frozenset()
    """Token-table columns (``schema.COL_*``) produced by a measure-only forward, hence known on ``measured`` rows
    only: ``routes_new`` / ``logp_new`` always, ``routes_old_free`` / ``logp_old_free`` (and the token entropy, from
    the same forward) under R3 / TRR, whose ratio uses a replayed pi_old."""
    extra: dict[str, Any] | None = None
    """Fields declared by a measurement (``Measurement.declares``) rather than here: name -> value."""

    @classmethod
    def of(cls, values: dict[str, Any]) -> StepTensors:
        """A step's record from its fields by name: the declared fields of :data:`STEP_FIELDS` as they are, those a
        measurement declares into :attr:`extra`; ``ValueError`` for a name nothing declares."""
        own = {f.name for f in fields(cls)} - {"extra"}
        declared = {f.name for f in measurement_fields()}
        stray = sorted(set(values) - own - declared)
        if stray:
            raise ValueError(f"{stray}: no step field of that name is declared (STEP_FIELDS, Measurement.declares)")
        extra = {name: value for name, value in values.items() if name not in own}
        return cls(**{name: value for name, value in values.items() if name in own}, extra=extra or None)

    def get(self, name: str) -> Any:
        """Field ``name``'s value, declared here or by a measurement (``None``: not filled this step)."""
        if name in _OWN_NAMES:
            return getattr(self, name)
        return (self.extra or {}).get(name)

    @property
    def group_size(self) -> int:
        """Sequences per prompt (the batch holds ``len(examples)`` whole groups)."""
        return self.batch.batch_size // len(self.examples)

    def is_sampled(self, column: str) -> bool:
        """Whether ``column``'s values exist only on the ``measured`` rows (a strict subset of the batch)."""
        return self.measured is not None and column in self.sampled and not bool(self.measured.all())

    def to(self, device: torch.device | str) -> StepTensors:
        """These tensors on ``device`` (e.g. the CPU, before they are sent to another process)."""
        values = {f.name: self.get(f.name) for f in step_fields()}
        return StepTensors.of({name: value.to(device) if isinstance(value, torch.Tensor | Routes | RolloutBatch)
                               else value for name, value in values.items()})

    @property
    def log_w(self) -> torch.Tensor:
        """``[B, T]`` the token log-ratio that entered the loss."""
        return self.logp_update - self.logp_old

    @property
    def log_w_counterfactual(self) -> torch.Tensor | None:
        """``[B, T]`` the token log-ratio with the other routing (``logp_update_counterfactual - logp_old``)."""
        cf = self.logp_update_counterfactual
        return None if cf is None else cf - self.logp_old

    def response(self, per_position: torch.Tensor) -> torch.Tensor:
        """``[B, L, ...]`` per input position -> ``[tokens, ...]`` at the response tokens, in row-major order.

        A response token's routes are those of the input position whose logits score it (docs/run-format.md).
        """
        return self.batch.response(per_position)

    def tokens(self, per_token: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` -> ``[tokens]`` at the response tokens, in row-major order."""
        return per_token[self.batch.response_mask]

    def per_token(self, per_sequence: torch.Tensor) -> torch.Tensor:
        """``[B]`` -> ``[tokens]``: each response token gets its sequence's value."""
        mask = self.batch.response_mask
        return per_sequence[:, None].expand(mask.shape)[mask]


def cat_step_tensors(parts: list[StepTensors], pad_token_id: int) -> StepTensors:
    """Several processes' step tensors as one step's: rows stacked in order, laid out on the widest prompt and the
    longest response (as :func:`moestab.recording.batch.cat_batches` lays out the batches), every declared field
    (:func:`step_fields`) merged as its kind says. A field left ``None`` by the first process is ``None``."""
    batch = cat_batches([p.batch for p in parts], pad_token_id)
    P, T = batch.prompt_len, batch.targets.shape[1]
    length = batch.input_ids.shape[1]

    def merged(field: StepField) -> Any:
        values = [p.get(field.name) for p in parts]
        if field.kind == BATCH:
            return batch
        if values[0] is None:
            return None
        if field.kind == EXAMPLES:
            return [e for v in values for e in v]
        if field.kind == SEQUENCE:  # [B_r] -> [B]
            return torch.cat(values)
        if field.kind == TOKEN:  # [B_r, T_r] -> [B, T]
            return torch.cat([pad_positions(v, T, field.fill) for v in values])
        if field.kind == POSITIONS:  # [B_r, L_r, layers, k] -> [B, L, layers, k]
            return torch.cat([relay_positions(v, P - p.batch.prompt_len, length, -1)
                              for v, p in zip(values, parts, strict=True)])
        if field.kind == ROUTES:
            return Routes.cat([v.shift(P - p.batch.prompt_len) for v, p in zip(values, parts, strict=True)])
        return values[0]  # COLUMNS: the same on every process

    return StepTensors.of({field.name: merged(field) for field in step_fields()})


def cat_loss_inputs(parts: list[dict]) -> dict:
    """Several processes' keyword arguments of one loss call as one call's: tensors stacked along rows
    (response-aligned ones right-padded to the longest response, outside the mask), settings taken as they are."""
    out = dict(parts[0])
    for key, value in parts[0].items():
        if not torch.is_tensor(value):
            continue
        values = [p[key] for p in parts]  # [b_r] or [b_r, T_r, ...]
        if value.dim() >= 2:
            width = max(v.shape[1] for v in values)
            values = [pad_positions(v, width, False if v.dtype == torch.bool else 0) for v in values]
        out[key] = torch.cat(values)
    return out


_OWN_NAMES = frozenset(f.name for f in STEP_FIELDS)


def measurement_fields() -> tuple[StepField, ...]:
    """The fields the declared measurements add (``Measurement.declares`` of ``measurements.MEASUREMENTS``, read at
    the call: a measurement added to the list is carried at once)."""
    return tuple(f for cls in measurements.MEASUREMENTS for f in cls.declares)


def step_fields() -> tuple[StepField, ...]:
    """Every field of a step's record: :data:`STEP_FIELDS` and those the measurements declare."""
    return STEP_FIELDS + measurement_fields()
