"""Run a model over a probe suite and keep, for every real token, its routes, router margin and next-token log-prob.

Texts are tokenized without special tokens, cut to ``max_tokens``, and run in right-padded batches of
``batch_size`` under :class:`moestab.routing.RoutingRecorder` without grad. Only the per-token record is kept
(a few bytes per token and layer), so memory stays bounded by one batch's activations whatever the suite size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from moestab.probes.errors import ProbeError


@dataclass(frozen=True)
class ProbeRecord:
    """What one model did on a suite, flattened over its real tokens in (text, position) order."""

    routes: np.ndarray
    """``[tokens, layers, top_k]`` int16 experts, best first (slot 0 = the router's top-1)."""
    margin: np.ndarray
    """``[tokens, layers]`` float32 gap between the k-th and (k+1)-th selection score."""
    logp: np.ndarray
    """``[tokens]`` float32 log-prob of the text's next token; NaN at each text's last token."""
    text: np.ndarray
    """``[tokens]`` int32 index of the token's text in the suite."""
    position: np.ndarray
    """``[tokens]`` int32 position of the token in its text."""
    layers: tuple[int, ...]
    """Decoder-layer index of each entry of the layers axis."""
    num_experts: int

    @property
    def top_k(self) -> int:
        return self.routes.shape[2]

    @property
    def tokens(self) -> int:
        return self.routes.shape[0]


def tokenize_suite(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_tokens: int | None) -> list[list[int]]:
    """Token ids of each text (no special tokens), each cut to ``max_tokens``; empty texts are refused."""
    if max_tokens is not None and max_tokens < 2:
        raise ProbeError(f"max_tokens must be >= 2 (a next-token log-prob needs two tokens), got {max_tokens}")
    ids = [tokenizer.encode(text, add_special_tokens=False)[:max_tokens] for text in texts]
    empty = [i for i, row in enumerate(ids) if not row]
    if empty:
        raise ProbeError(f"suite text {empty[0]} has no tokens under this tokenizer")
    return ids


@torch.no_grad()
def collect(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    *,
    batch_size: int = 16,
    max_tokens: int | None = None,
    progress: bool = False,
) -> ProbeRecord:
    """Routes, margins and next-token log-probs of ``model`` on ``texts`` (see :class:`ProbeRecord`).

    ``batch_size=1`` runs one sequence at a time: no padding, the shapes an inference engine serving one
    request would use; comparing it with a batched record measures batch-shape numerics.
    """
    from moestab.routing import RoutingRecorder

    if batch_size < 1:
        raise ProbeError(f"batch_size must be >= 1, got {batch_size}")
    if not texts:
        raise ProbeError("the suite has no texts")
    rows = tokenize_suite(tokenizer, texts, max_tokens)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = next(model.parameters()).device
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("routes", "margin", "logp", "text", "position")}
    layers: tuple[int, ...] = ()
    num_experts = 0
    was_training = model.training
    model.eval()
    starts = range(0, len(rows), batch_size)
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc="probe", unit="batch")
    try:
        for start in starts:
            batch = rows[start : start + batch_size]
            width = max(map(len, batch))
            ids = torch.full((len(batch), width), pad, dtype=torch.long)  # [b, seq]
            mask = torch.zeros_like(ids)  # [b, seq]
            for i, row in enumerate(batch):
                ids[i, : len(row)] = torch.tensor(row)
                mask[i, : len(row)] = 1
            ids, mask = ids.to(device), mask.to(device)
            with RoutingRecorder(model, margin=True, entropy=False, slot_scores=True) as recorder:
                logits = model(input_ids=ids, attention_mask=mask).logits  # [b, seq, vocab]
            routes = recorder.routes.ranked()
            layers, num_experts = routes.layers, routes.num_experts
            logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [b, seq-1, vocab]
            nxt = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)  # [b, seq-1]
            nxt = torch.cat([nxt, torch.full_like(nxt[:, :1], float("nan"))], dim=1)  # [b, seq]
            last = mask.sum(1) - 1  # [b] each text's last real position: no next token
            nxt[torch.arange(len(batch), device=device), last] = float("nan")
            keep = mask.bool()  # [b, seq]
            parts["routes"].append(routes.indices[keep].cpu().numpy().astype(np.int16))  # [t, layers, k]
            parts["margin"].append(routes.margin[keep].cpu().numpy().astype(np.float32))  # [t, layers]
            parts["logp"].append(nxt[keep].cpu().numpy().astype(np.float32))  # [t]
            text = torch.arange(start, start + len(batch), device=device)[:, None].expand_as(ids)  # [b, seq]
            position = torch.arange(width, device=device)[None, :].expand_as(ids)  # [b, seq]
            parts["text"].append(text[keep].cpu().numpy().astype(np.int32))
            parts["position"].append(position[keep].cpu().numpy().astype(np.int32))
    finally:
        model.train(was_training)
    return ProbeRecord(**{k: np.concatenate(v) for k, v in parts.items()}, layers=tuple(layers),
                       num_experts=num_experts)
