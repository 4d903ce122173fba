"""The per-token Parquet table of one step (docs/run-format.md, "tokens/")."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from moestab.recording.step_tensors import StepTensors
from moestab.run_folder import schema
from moestab.run_folder.route_columns import encode_route_columns, route_layout_for, with_route_layout


def record_rows(batch_size: int, fraction: float, seed: int) -> torch.Tensor:
    """``[n]`` sorted rows of a step written to its per-token table: all of them at ``fraction`` 1, else a random
    ``fraction`` drawn with ``seed``."""
    if fraction >= 1.0:
        return torch.arange(batch_size)
    keep = max(1, round(fraction * batch_size))
    return torch.randperm(batch_size, generator=torch.Generator().manual_seed(seed))[:keep].sort().values


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

    route_columns, layout = encode_route_columns({
        schema.COL_ROUTES_ROLLOUT: routes(batch.routes.indices),
        schema.COL_ROUTES_OLD: routes(t.routes_old),
        schema.COL_ROUTES_OLD_FREE: routes(t.routes_old_free.indices),
        schema.COL_ROUTES_UPDATE: routes(t.routes_update),
        schema.COL_ROUTES_NEW: routes(t.routes_new.indices),
    }, layout)
    group_size = len(batch.completions) // len(t.examples)
    columns = {
        schema.COL_STEP: pa.array(np.full(len(seq), step, np.int32)),
        schema.COL_SEQ: pa.array(seq.numpy().astype(np.int32)),
        schema.COL_PROMPT: pa.array((seq // group_size).numpy().astype(np.int32)),
        schema.COL_MINIBATCH: pa.array(seq_col(t.minibatch).astype(np.int16)),
        schema.COL_POSITION: pa.array(position.numpy().astype(np.int32)),
        schema.COL_RESPONSE_LEN: pa.array(seq_col(batch.response_mask.sum(-1)).astype(np.int32)),
        schema.COL_REWARD: pa.array(np.full(len(seq), np.nan, np.float32) if t.rewards is None
                                    else seq_col(t.rewards.float()).astype(np.float32)),  # NaN: not known
        schema.COL_ADVANTAGE: pa.array(seq_col(t.advantages.float()).astype(np.float32)),
        schema.COL_LOGP_ROLLOUT: pa.array(tok(batch.logp_rollout).astype(np.float32)),
        schema.COL_LOGP_OLD: pa.array(tok(t.logp_old).astype(np.float32)),
        schema.COL_LOGP_OLD_FREE: pa.array(tok(t.logp_old_free).astype(np.float32)),
        schema.COL_LOGP_UPDATE: pa.array(tok(t.logp_update).astype(np.float32)),
        schema.COL_LOGP_NEW: pa.array(tok(t.logp_new).astype(np.float32)),
        schema.COL_LOG_W: pa.array(tok(t.log_w).astype(np.float32)),
        schema.COL_CLIPPED: pa.array(tok(t.clipped).astype(bool)),
        **route_columns,
        schema.COL_MARGIN_OLD: per_layer(t.routes_old_free.margin),
        schema.COL_CONFIDENCE_OLD: per_layer(t.routes_old_free.confidence),
    }
    return with_route_layout(pa.table(columns), layout)
