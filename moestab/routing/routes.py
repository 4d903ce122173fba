"""``Routes``: which experts every token was sent to, per MoE layer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

INDEX_DTYPE = torch.int16  # 2 bytes a slot; -1 marks padding / not recorded


@dataclass(frozen=True)
class Routes:
    """Recorded (or to-be-replayed) routing decisions of a batch of sequences.

    Positions are aligned with the model's input positions; ``-1`` marks padding and anything not
    recorded. Slots within a layer are in the router's own order, which replay reproduces exactly;
    compare them as sets. That order is not always best first (DeepSeek-V3 picks with
    ``topk(sorted=False)``): to read the top-1, record ``slot_scores`` and use :meth:`ranked`.
    """

    indices: torch.Tensor
    """``[batch, seq, layers, top_k]`` int16 expert ids, -1 at padding."""
    layers: tuple[int, ...]
    """Decoder-layer index of each entry of the ``layers`` axis."""
    num_experts: int
    margin: torch.Tensor | None = None
    """``[batch, seq, layers]`` float32 gap between the k-th and (k+1)-th selection score; NaN at padding."""
    entropy: torch.Tensor | None = None
    """``[batch, seq, layers]`` float32 entropy (nats) of softmax(router logits); NaN at padding."""
    confidence: torch.Tensor | None = None
    """``[batch, seq, layers]`` float32 routing confidence: the mass of softmax(router logits) on the chosen
    experts (prime-rl, after the StepFun 3.5 Flash report); NaN at padding."""
    router_logprobs: torch.Tensor | None = None
    """``[batch, seq, layers, num_experts]`` float32 log-softmax of the router logits (opt-in; large)."""
    slot_scores: torch.Tensor | None = None
    """``[batch, seq, layers, top_k]`` float32 selection score of each chosen expert: what the family ranked to
    pick it (``RouterAdapter.selection_scores``: the router logit for softmax families, the bias-corrected
    sigmoid for DeepSeek-V3); NaN at padding (opt-in)."""
    gates: torch.Tensor | None = None
    """``[batch, seq, layers, top_k]`` float32 combine weight of each chosen expert, slot for slot with ``indices``:
    the weights the router handed its experts, after the family's normalisation (and DeepSeek-V3's scaling); NaN
    at padding (opt-in). ``RoutingReplay(force_gates=True)`` replays them as given ("Total Router Recall")."""
    rows: torch.Tensor | None = None
    """``[batch]`` int64 row of each sequence among all inputs recorded (set when sampling sequences)."""

    def __post_init__(self) -> None:
        if self.indices.dim() != 4:
            raise ValueError(f"indices must be [batch, seq, layers, top_k], got shape {tuple(self.indices.shape)}")
        if self.indices.shape[2] != len(self.layers):
            raise ValueError(f"indices has {self.indices.shape[2]} layers but layers lists {len(self.layers)}")
        if self.gates is not None and self.gates.shape != self.indices.shape:
            raise ValueError(f"gates must match indices {tuple(self.indices.shape)}, got {tuple(self.gates.shape)}")

    @property
    def batch_size(self) -> int:
        return self.indices.shape[0]

    @property
    def seq_len(self) -> int:
        return self.indices.shape[1]

    @property
    def top_k(self) -> int:
        return self.indices.shape[3]

    @property
    def valid(self) -> torch.Tensor:
        """``[batch, seq]`` bool: positions routed in every recorded layer."""
        return (self.indices >= 0).all(dim=-1).all(dim=-1)

    def select(self, rows: torch.Tensor | Sequence[int] | slice) -> Routes:
        """The routes of a subset of sequences (e.g. one minibatch)."""
        if not isinstance(rows, slice):
            rows = torch.as_tensor(rows, dtype=torch.long, device=self.indices.device)

        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[rows]

        return replace(
            self,
            indices=self.indices[rows],
            margin=pick(self.margin),
            entropy=pick(self.entropy),
            confidence=pick(self.confidence),
            router_logprobs=pick(self.router_logprobs),
            slot_scores=pick(self.slot_scores),
            gates=pick(self.gates),
            rows=pick(self.rows),
        )

    def ranked(self) -> Routes:
        """These routes with each decision's slots sorted by ``slot_scores``, best first: slot 0 is the
        router's top-1 in every family. For analysis only: replaying ranked routes forces the same
        experts, but in another slot order than the router's, which can change float rounding."""
        if self.slot_scores is None:
            raise ValueError("ranking slots needs slot_scores: record with RoutingRecorder(..., slot_scores=True)")
        order = self.slot_scores.nan_to_num(float("-inf")).argsort(dim=-1, descending=True, stable=True)
        gates = None if self.gates is None else self.gates.gather(-1, order)  # gates stay with their experts
        return replace(self, indices=self.indices.gather(-1, order), slot_scores=self.slot_scores.gather(-1, order),
                       gates=gates)

    def to(self, device: torch.device | str) -> Routes:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return replace(
            self,
            indices=self.indices.to(device),
            margin=move(self.margin),
            entropy=move(self.entropy),
            confidence=move(self.confidence),
            router_logprobs=move(self.router_logprobs),
            slot_scores=move(self.slot_scores),
            gates=move(self.gates),
            rows=move(self.rows),
        )

    def masked(self, keep: torch.Tensor) -> Routes:
        """These routes with every position outside ``keep`` (``[batch, seq]`` bool) marked unrecorded (-1 / NaN),
        e.g. the positions ``generate()`` fed after a sequence's EOS, which are not part of its sample."""
        drop = ~keep.to(self.indices.device).bool()  # [batch, seq]

        def fill(t: torch.Tensor | None, value) -> torch.Tensor | None:
            if t is None:
                return None
            return t.masked_fill(drop.reshape(*drop.shape, *([1] * (t.dim() - 2))), value)

        nan = float("nan")
        return replace(self, indices=fill(self.indices, -1), margin=fill(self.margin, nan),
                       entropy=fill(self.entropy, nan), confidence=fill(self.confidence, nan),
                       router_logprobs=fill(self.router_logprobs, nan), slot_scores=fill(self.slot_scores, nan),
                       gates=fill(self.gates, nan))

    def shift(self, positions: int) -> Routes:
        """These routes ``positions`` places later: unrecorded positions (-1 / NaN) prepended, e.g. to lay a batch
        out on a wider left-padded prompt."""

        def pad(t: torch.Tensor | None, fill) -> torch.Tensor | None:
            if t is None or positions == 0:
                return t
            return torch.cat([t.new_full((t.shape[0], positions, *t.shape[2:]), fill), t], dim=1)

        nan = float("nan")
        return replace(self, indices=pad(self.indices, -1), margin=pad(self.margin, nan),
                       entropy=pad(self.entropy, nan), confidence=pad(self.confidence, nan),
                       router_logprobs=pad(self.router_logprobs, nan), slot_scores=pad(self.slot_scores, nan),
                       gates=pad(self.gates, nan))

    @staticmethod
    def cat(parts: Sequence[Routes]) -> Routes:
        """Concatenate along the batch axis, right-padding shorter sequences with -1 / NaN."""
        if not parts:
            raise ValueError("Routes.cat needs at least one Routes")
        first = parts[0]
        for p in parts[1:]:
            if p.layers != first.layers or p.top_k != first.top_k or p.num_experts != first.num_experts:
                raise ValueError("Routes.cat: parts disagree on layers, top_k or num_experts")
        seq = max(p.seq_len for p in parts)

        def padded(get, fill) -> torch.Tensor | None:
            tensors = [get(p) for p in parts]
            if any(t is None for t in tensors):
                return None
            out = []
            for t in tensors:
                pad_shape = (t.shape[0], seq - t.shape[1], *t.shape[2:])
                out.append(torch.cat([t, t.new_full(pad_shape, fill)], dim=1))
            return torch.cat(out, dim=0)

        rows = [p.rows for p in parts]
        return Routes(
            indices=padded(lambda p: p.indices, -1),
            layers=first.layers,
            num_experts=first.num_experts,
            margin=padded(lambda p: p.margin, float("nan")),
            entropy=padded(lambda p: p.entropy, float("nan")),
            confidence=padded(lambda p: p.confidence, float("nan")),
            router_logprobs=padded(lambda p: p.router_logprobs, float("nan")),
            slot_scores=padded(lambda p: p.slot_scores, float("nan")),
            gates=padded(lambda p: p.gates, float("nan")),
            rows=None if any(r is None for r in rows) else torch.cat(rows),
        )


def gather_router_logprobs(router_logprobs: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Router log-probs of given experts (e.g. the old policy's choice under the new router).

    ``router_logprobs [batch, seq, layers, experts]``, ``indices [batch, seq, layers, top_k]`` (-1
    allowed) -> ``[batch, seq, layers, top_k]``, NaN where the index is -1.
    """
    idx = indices.long()
    out = router_logprobs.gather(-1, idx.clamp_min(0))  # [batch, seq, layers, top_k]
    return out.masked_fill(idx < 0, float("nan"))
