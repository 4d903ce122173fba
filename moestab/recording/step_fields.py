"""The one declaration of a step's record (``StepTensors``): per field its shape kind (which says how it is padded and
merged across processes), its token-table column, its padding, and whether a trainer may leave it out. Whether a
measurement budget samples a field follows from who fills it: the columns a measurement fills
(``Measurement.fills``) are the sampled ones.

A measurement that fills a field of its own declares it beside itself (``Measurement.declares``); every field is
then carried by the same code: moved, merged, written to the token table, viewed by the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

from moestab.run_folder import schema

# Shape kinds of a step field, and how each is merged across processes (cat_step_tensors).
BATCH = "batch"  # the RolloutBatch: cat_batches lays the processes' batches on the widest prompt, longest response
EXAMPLES = "examples"  # list[Example] [prompts]: joined in order
SEQUENCE = "sequence"  # [B]: rows stacked
TOKEN = "token"  # [B, T] per response token: right-padded with the field's fill to the longest response
POSITIONS = "positions"  # [B, L, layers, k] route ids per input position: laid on the widest prompt, -1 around
ROUTES = "routes"  # Routes (ids with router statistics) per input position: shifted and padded as POSITIONS
COLUMNS = "columns"  # frozenset[str] of token-table columns: the same on every process (the first one's kept)
KINDS = (BATCH, EXAMPLES, SEQUENCE, TOKEN, POSITIONS, ROUTES, COLUMNS)


@dataclass(frozen=True)
class StepField:
    """One field of a step's record, declared once."""

    name: str
    kind: str
    """One of :data:`KINDS`."""
    fill: float | bool = 0.0
    """What pads a ``TOKEN`` field past a response when processes' rows are merged (route kinds: -1)."""
    column: str | None = None
    """Its token-table column (``schema.COL_*``), or None when the table does not hold it."""
    optional: bool = False
    """A trainer may leave it ``None`` (not measured, or unknown to it); its column then holds NaN."""
    dtype: str = "float32"
    """The numpy type its ``SEQUENCE`` or ``TOKEN`` column is written in (route columns: their route layout's)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"step field {self.name!r}: kind {self.kind!r} is not one of {KINDS}")
        if self.column is not None and self.kind not in (SEQUENCE, TOKEN, POSITIONS, ROUTES):
            raise ValueError(f"step field {self.name!r}: a {self.kind} field has no token-table column")


STEP_FIELDS: tuple[StepField, ...] = (
    StepField("batch", BATCH),
    StepField("examples", EXAMPLES),
    StepField("rewards", SEQUENCE, column=schema.COL_REWARD, optional=True),
    StepField("correct", SEQUENCE, optional=True),
    StepField("advantages", SEQUENCE, column=schema.COL_ADVANTAGE),
    StepField("minibatch", SEQUENCE, column=schema.COL_MINIBATCH, dtype="int16"),
    StepField("logp_old", TOKEN, column=schema.COL_LOGP_OLD),
    StepField("logp_old_free", TOKEN, column=schema.COL_LOGP_OLD_FREE),
    StepField("logp_update", TOKEN, column=schema.COL_LOGP_UPDATE),
    StepField("logp_new", TOKEN, column=schema.COL_LOGP_NEW),
    StepField("clipped", TOKEN, fill=False, column=schema.COL_CLIPPED, dtype="bool"),
    StepField("routes_old", POSITIONS, column=schema.COL_ROUTES_OLD),
    StepField("routes_old_free", ROUTES, column=schema.COL_ROUTES_OLD_FREE),
    StepField("routes_update", POSITIONS, column=schema.COL_ROUTES_UPDATE),
    StepField("routes_new", ROUTES, column=schema.COL_ROUTES_NEW),
    StepField("entropy", TOKEN, optional=True),
    StepField("logp_update_counterfactual", TOKEN, optional=True),
    StepField("clipped_counterfactual", TOKEN, fill=False, optional=True),
    StepField("measured", SEQUENCE, optional=True),
    StepField("sampled", COLUMNS),
)
"""The fields of ``StepTensors``, in its order (a test keeps the two in step)."""
