"""The training-inference gap of one checkpoint, measurable on a CPU: the same weights under two precisions, and
batched against one-sequence-at-a-time forwards (what an inference engine's batch shapes change)."""

from __future__ import annotations

from collections.abc import Sequence

from moestab.probes.checkpoints import Checkpoint, load_checkpoint
from moestab.probes.collect import collect
from moestab.probes.compare import Comparison, compare_records


def numerics(
    checkpoint: Checkpoint, texts: Sequence[str], *, dtypes: tuple[str, str] = ("float32", "bfloat16"),
    batch_size: int = 16, max_tokens: int | None = None, device: str = "cpu", progress: bool = False,
) -> dict[str, Comparison]:
    """``{label: comparison}``: ``dtypes[1]`` against ``dtypes[0]`` (both batched), and one sequence at a time
    against batched in ``dtypes[0]``. The reference side (margins, log-prob baseline) is ``dtypes[0]`` batched."""
    reference, other = dtypes

    def record(dtype: str, size: int):  # a fresh load and forward each time, even when two sides share a dtype
        model, tokenizer = load_checkpoint(checkpoint, dtype=dtype, device=device)
        return collect(model, tokenizer, texts, batch_size=size, max_tokens=max_tokens, progress=progress)

    base = record(reference, batch_size)
    return {
        f"{other} vs {reference} (batch {batch_size})": compare_records(base, record(other, batch_size)),
        f"one sequence at a time vs batch {batch_size} ({reference})": compare_records(base, record(reference, 1)),
    }
