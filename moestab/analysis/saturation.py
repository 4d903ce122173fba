"""Router saturation: how much of a reference's routing another set of routes already agrees with.

OLMoE (arXiv 2409.02060, §"Router saturation"): for probe tokens ``x`` and a layer,
``saturation = (1/N) sum_x |TopK_t(x) ∩ TopK_ref(x)| / k`` (the reference is usually the final
checkpoint), and the top-1 variant, the share of tokens whose top-1 expert matches the reference's.

Top-1 is read from slot 0, so routes given to :func:`router_saturation` must list each decision's
experts best first. :func:`record_probe_routes` makes sure of it for every family: it records the
selection score of each chosen expert and ranks the slots by it (``Routes.ranked``), which matters for
DeepSeek-V3, whose router picks with ``topk(..., sorted=False)`` (its score is the bias-corrected
sigmoid within the selected groups, not the gate weight). The top-k variant compares sets and does not
depend on slot order.

Route arrays are ``[tokens, layers, top_k]`` int16, -1 = not recorded; a token whose routes in a
layer hold a -1 (in either array) is left out of that layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from moestab.metrics.routes import INVALID, check_routes, intersection_sizes


def router_saturation(routes: np.ndarray, reference: np.ndarray, layers: Sequence[int] | None = None) -> pd.DataFrame:
    """Per-layer saturation of ``routes`` against ``reference`` (same probe tokens, same shape).

    Returns one row per layer: ``layer`` (labels from ``layers``, default 0..L-1), ``tokens``
    (recorded in both), ``saturation`` (mean share of the reference's top-k also chosen by
    ``routes``) and ``saturation_top1`` (share of tokens whose slot-0 experts agree). NaN for a
    layer with no recorded token. A route set against itself has saturation 1.
    """
    routes = check_routes(routes, "routes")
    reference = check_routes(reference, "reference")
    inter = intersection_sizes(routes, reference)  # [tokens, layers]
    n_layers, k = routes.shape[1], routes.shape[2]
    labels = np.arange(n_layers) if layers is None else np.asarray(layers)
    if labels.shape != (n_layers,):
        raise ValueError(f"layers must list {n_layers} labels, got {len(labels)}")
    recorded = inter != INVALID  # [tokens, layers]
    count = recorded.sum(axis=0)  # [layers]
    shared = np.where(recorded, inter, 0).sum(axis=0, dtype=np.int64)  # [layers]
    top1 = (routes[:, :, 0] == reference[:, :, 0]) & recorded  # [tokens, layers]
    with np.errstate(invalid="ignore", divide="ignore"):
        return pd.DataFrame(
            {
                "layer": labels,
                "tokens": count.astype(np.int64),
                "saturation": shared / (k * count),
                "saturation_top1": top1.sum(axis=0) / count,
            }
        )


def record_probe_routes(
    model: Any,
    input_ids: Any,
    attention_mask: Any | None = None,
    *,
    batch_size: int = 32,
) -> tuple[np.ndarray, tuple[int, ...]]:
    """Routes of ``model`` on a probe set, flattened to the real (non-padding) tokens.

    Runs ``model(input_ids=..., attention_mask=...)`` in batches under
    :class:`moestab.routing.RoutingRecorder` (no grad). ``input_ids``, ``attention_mask``:
    ``[probes, seq]``. Returns int16 routes ``[tokens, layers, top_k]`` for the tokens where the mask
    is 1, in row-major (probe, position) order, each decision's slots ranked by the router's selection
    score (slot 0 = its top-1), and the decoder-layer index of each layer.
    """
    import torch

    from moestab.routing import RoutingRecorder

    ids = torch.as_tensor(input_ids)
    mask = torch.ones_like(ids) if attention_mask is None else torch.as_tensor(attention_mask)
    if ids.dim() != 2 or mask.shape != ids.shape:
        raise ValueError(f"input_ids and attention_mask must be [probes, seq], got {ids.shape} and {mask.shape}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = next(model.parameters()).device
    parts: list[np.ndarray] = []
    layers: tuple[int, ...] = ()
    was_training = model.training
    model.eval()
    try:
        for start in range(0, ids.shape[0], batch_size):
            batch_ids = ids[start : start + batch_size].to(device)  # [b, seq]
            batch_mask = mask[start : start + batch_size].to(device)  # [b, seq]
            with torch.no_grad(), RoutingRecorder(model, margin=False, entropy=False, slot_scores=True) as recorder:
                model(input_ids=batch_ids, attention_mask=batch_mask)
            routes = recorder.routes.ranked()
            layers = routes.layers
            indices = routes.indices.cpu()  # [b, seq, layers, top_k]
            keep = batch_mask.cpu().bool()  # [b, seq]
            parts.append(indices[keep].numpy())  # [tokens_b, layers, top_k]
    finally:
        model.train(was_training)
    return np.concatenate(parts, axis=0).astype(np.int16, copy=False), tuple(layers)


def checkpoint_saturation(
    checkpoints: Sequence[str | Path],
    reference: str | Path,
    input_ids: Any,
    attention_mask: Any | None = None,
    *,
    batch_size: int = 32,
    device: str = "cpu",
) -> pd.DataFrame:
    """Saturation of several Hugging Face checkpoint folders against a reference checkpoint.

    Each folder is loaded with ``AutoModelForCausalLM.from_pretrained`` and run on the same probe
    set (``input_ids`` / ``attention_mask``, ``[probes, seq]``) under the routing recorder (see
    :func:`record_probe_routes`); routes are compared with :func:`router_saturation`. Returns the
    per-layer rows of every checkpoint with a leading ``checkpoint`` column (the folder path as given).
    """
    import torch
    from transformers import AutoModelForCausalLM

    def routes_of(path: str | Path) -> tuple[np.ndarray, tuple[int, ...]]:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
        try:
            return record_probe_routes(model, input_ids, attention_mask, batch_size=batch_size)
        finally:
            del model

    ref_routes, ref_layers = routes_of(reference)
    frames = []
    for path in checkpoints:
        routes, layers = routes_of(path)
        if layers != ref_layers or routes.shape != ref_routes.shape:
            raise ValueError(
                f"{path}: routes {routes.shape} over layers {layers} do not match the reference "
                f"{ref_routes.shape} over layers {ref_layers} (different architecture?)"
            )
        frame = router_saturation(routes, ref_routes, layers=layers)
        frame.insert(0, "checkpoint", str(path))
        frames.append(frame)
    columns = ["checkpoint", "layer", "tokens", "saturation", "saturation_top1"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
