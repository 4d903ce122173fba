"""The per-token Parquet table of one step (docs/run-format.md, "tokens/")."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from moestab.recording.step_fields import POSITIONS, ROUTES, SEQUENCE
from moestab.recording.step_tensors import StepTensors, step_fields
from moestab.run_folder import schema
from moestab.run_folder.route_columns import encode_route_columns, route_layout_for, with_route_layout


def record_rows(batch_size: int, fraction: float, seed: int) -> torch.Tensor:
    """``[n]`` sorted rows of a step written to its per-token table: all of them at ``fraction`` 1, else a random
    ``fraction`` drawn with ``seed``."""
    if fraction >= 1.0:
        return torch.arange(batch_size)
    keep = max(1, round(fraction * batch_size))
    return torch.randperm(batch_size, generator=torch.Generator().manual_seed(seed))[:keep].sort().values


TABLE_ORDER = (
    schema.COL_STEP, schema.COL_SEQ, schema.COL_PROMPT, schema.COL_MINIBATCH, schema.COL_POSITION,
    schema.COL_RESPONSE_LEN, schema.COL_REWARD, schema.COL_ADVANTAGE, schema.COL_LOGP_ROLLOUT, schema.COL_LOGP_OLD,
    schema.COL_LOGP_OLD_FREE, schema.COL_LOGP_UPDATE, schema.COL_LOGP_NEW, schema.COL_LOG_W, schema.COL_CLIPPED,
    *schema.ROUTE_COLUMNS, schema.COL_MARGIN_OLD, schema.COL_CONFIDENCE_OLD,
)
"""The order of a token table's columns (docs/run-format.md); a column a measurement declares comes after them."""


def _fixed_list(values: np.ndarray, width: int) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), width)


def token_table(
    step: int,
    t: StepTensors,
    *,
    rows: torch.Tensor,
    layer_slots: list[int],
    schema_version: int = schema.SCHEMA_VERSION,
) -> pa.Table:
    """One row per response token of the sequences ``rows``; route columns keep ``layer_slots``.

    ``layer_slots`` are positions on the routes' layer axis (not decoder-layer numbers). Route columns are binary,
    each but the first stored as its XOR with the column it shares most bytes with (schema version 4, their layout
    and references in the table's schema metadata: :mod:`moestab.run_folder.route_columns`); ``schema_version=3``
    writes every route column in full and ``schema_version=2`` as ``FixedSizeList<int16>``, only to compare the
    layouts.
    """
    batch = t.batch
    P = batch.prompt_len
    mask = batch.response_mask[rows]  # [b, T]
    b, T = mask.shape
    seq = rows[:, None].expand(b, T)[mask]  # [N]
    position = torch.arange(T)[None, :].expand(b, T)[mask]

    def tok(x: torch.Tensor) -> np.ndarray:  # [B, T] -> [N]
        return x[rows][mask].detach().cpu().numpy()

    def seq_col(x: torch.Tensor) -> np.ndarray:  # [B] -> [N]
        return x[rows][:, None].expand(b, T)[mask].cpu().numpy()

    top_k = batch.routes.indices.shape[-1]
    layout = route_layout_for(t.routes_old_free.num_experts, len(layer_slots), top_k, schema_version=schema_version)

    def routes(indices: torch.Tensor) -> np.ndarray:  # [B, L, layers, k] -> [N, layers', k]
        r = indices[rows][:, P - 1 :][mask][:, layer_slots].to(torch.int16).cpu().numpy()  # [N, layers', k]
        # Stored ids (uint8: half of int16) as soon as made: the five columns are encoded together.
        return r if layout is None else layout.stored_ids(r).reshape(r.shape)

    def per_layer(values: torch.Tensor) -> pa.FixedSizeListArray:  # [B, L, layers] -> [N] lists of layers'
        v = values[rows][:, P - 1 :][mask][:, layer_slots].float().cpu().numpy()  # [N, layers']
        return _fixed_list(v.astype(np.float32), v.shape[1])

    declared: dict[str, pa.Array] = {}
    route_ids = {schema.COL_ROUTES_ROLLOUT: routes(batch.routes.indices)}  # [N, layers', k] each
    for field in step_fields():  # every declared field with a column, as its kind says
        value = t.get(field.name)
        if field.column is None:
            continue
        if field.kind in (POSITIONS, ROUTES):
            route_ids[field.column] = routes(value.indices if field.kind == ROUTES else value)
        elif value is None:  # not known to this trainer (TRL's rewards) or not measured: NaN
            declared[field.column] = pa.array(np.full(len(seq), np.nan, np.float32))
        else:
            values = seq_col(value) if field.kind == SEQUENCE else tok(value)  # [N]
            declared[field.column] = pa.array(values.astype(np.dtype(field.dtype)))
    route_columns, layout = encode_route_columns(route_ids, layout)
    group_size = len(batch.completions) // len(t.examples)
    columns = {
        schema.COL_STEP: pa.array(np.full(len(seq), step, np.int32)),
        schema.COL_SEQ: pa.array(seq.numpy().astype(np.int32)),
        schema.COL_PROMPT: pa.array((seq // group_size).numpy().astype(np.int32)),
        schema.COL_POSITION: pa.array(position.numpy().astype(np.int32)),
        schema.COL_RESPONSE_LEN: pa.array(seq_col(batch.response_mask.sum(-1)).astype(np.int32)),
        schema.COL_LOGP_ROLLOUT: pa.array(tok(batch.logp_rollout).astype(np.float32)),
        schema.COL_LOG_W: pa.array(tok(t.log_w).astype(np.float32)),
        **declared,
        **route_columns,
        schema.COL_MARGIN_OLD: per_layer(t.routes_old_free.margin),
        schema.COL_CONFIDENCE_OLD: per_layer(t.routes_old_free.confidence),
    }
    ordered = [name for name in TABLE_ORDER if name in columns] + [name for name in columns if name not in TABLE_ORDER]
    columns = {name: columns[name] for name in ordered}
    return with_route_layout(pa.table(columns), layout)
