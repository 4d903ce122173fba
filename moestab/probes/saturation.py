"""OLMoE-style router saturation of any list of checkpoints against a reference one, on a probe suite."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from moestab.analysis.saturation import pairwise_saturation, router_saturation
from moestab.probes.checkpoints import Checkpoint, check_same_architecture, load_checkpoint
from moestab.probes.collect import collect
from moestab.probes.compare import check_same_tokens
from moestab.probes.errors import ProbeError


def saturation(
    checkpoints: Sequence[Checkpoint], texts: Sequence[str], *, reference: int = -1, dtype: str = "float32",
    batch_size: int = 16, max_tokens: int | None = None, device: str = "cpu", progress: bool = False,
) -> pd.DataFrame:
    """Per checkpoint and layer: ``saturation`` (top-k) and ``saturation_top1`` (top-1 ranked by the router's own
    score) against ``checkpoints[reference]`` (default: the last), on the same suite tokens."""
    if not -len(checkpoints) <= reference < len(checkpoints):
        raise ProbeError(f"reference {reference} is not one of the {len(checkpoints)} checkpoints")
    ref = checkpoints[reference]
    ref_model, tokenizer = load_checkpoint(ref, dtype=dtype, device=device)
    ref_record = collect(ref_model, tokenizer, texts, batch_size=batch_size, max_tokens=max_tokens)
    frames = []
    for checkpoint in checkpoints:
        model, tok = load_checkpoint(checkpoint, dtype=dtype, device=device)
        check_same_architecture((ref.label, ref_model), (checkpoint.label, model))
        record = collect(model, tok, texts, batch_size=batch_size, max_tokens=max_tokens, progress=progress)
        check_same_tokens(ref_record, record)
        frame = router_saturation(record.routes, ref_record.routes, layers=record.layers)
        frame.insert(0, "checkpoint", checkpoint.label)
        frames.append(frame)
        del model
    return pd.concat(frames, ignore_index=True)


def saturation_pairs(
    checkpoints: Sequence[Checkpoint], texts: Sequence[str], steps: Sequence[int], *, dtype: str = "float32",
    batch_size: int = 16, max_tokens: int | None = None, device: str = "cpu",
) -> pd.DataFrame:
    """Saturation of every pair of ``checkpoints`` (at training ``steps``, one each) on the same suite tokens, per
    layer (:func:`moestab.analysis.saturation.pairwise_saturation`): what
    :func:`moestab.analysis.saturation.proximity_null` reads saturation against the final checkpoint against.
    Each checkpoint is run once."""
    if len(checkpoints) != len(steps):
        raise ProbeError(f"give one step per checkpoint: {len(checkpoints)} checkpoints, {len(steps)} steps")
    records, first = [], None
    for checkpoint in checkpoints:
        model, tok = load_checkpoint(checkpoint, dtype=dtype, device=device)
        if first is None:
            first = (checkpoint.label, model)
        check_same_architecture(first, (checkpoint.label, model))
        records.append(collect(model, tok, texts, batch_size=batch_size, max_tokens=max_tokens))
        check_same_tokens(records[0], records[-1])
    return pairwise_saturation([r.routes for r in records], steps, layers=records[0].layers if records else None)
