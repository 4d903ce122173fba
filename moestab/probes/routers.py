"""Router statistics of each checkpoint on a probe suite (:mod:`moestab.analysis.router_stats`)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from moestab.analysis.router_stats import router_statistics
from moestab.probes.checkpoints import Checkpoint, load_checkpoint
from moestab.probes.collect import collect


def routers(
    checkpoints: Sequence[Checkpoint], texts: Sequence[str], *, dtype: str = "float32", batch_size: int = 16,
    max_tokens: int | None = None, device: str = "cpu", progress: bool = False,
) -> pd.DataFrame:
    """Per checkpoint and layer: top-k margin quantiles, normalised routing entropy, load ``max_vio`` and idle
    experts on the suite's tokens (:func:`~moestab.analysis.router_stats.router_statistics`). The checkpoints may
    differ in architecture: each is read on its own."""
    frames = []
    for checkpoint in checkpoints:
        model, tokenizer = load_checkpoint(checkpoint, dtype=dtype, device=device)
        record = collect(model, tokenizer, texts, batch_size=batch_size, max_tokens=max_tokens, progress=progress)
        frame = router_statistics(record.routes, record.margin, record.entropy, record.num_experts, record.layers)
        frame.insert(0, "checkpoint", checkpoint.label)
        frames.append(frame)
        del model
    return pd.concat(frames, ignore_index=True)
