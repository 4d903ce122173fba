"""What ``RoutingRecorder`` keeps of each forward, and how a segment of forwards becomes one ``Routes``.

The recorder runs on the hot path of every forward, and on a small model its cost is a count of tensor operations
and Python calls, each run with caches made cold by the model's own work (docs/benchmarks.md, "Routing hooks"). So
the work is done where it is fewest: a router hook only keeps references to the router's own outputs (no copy, no
cast); at the end of the forward each field is stacked over all layers in one operation on the flat ``[tokens, ...]``
tensors, and cast once; padding is marked once per segment (a prefill and its decode steps), when its routes are
first read, instead of once per forward and field. Every value is the one the per-layer, per-forward recipe gave:
stacking, indexing, casts and ``where`` are exact, and each statistic runs on a tensor of the same shape and
layout as before (tests/routing/test_recorder_reference.py holds it to a plain reference, bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from moestab.routing.forward_call import ForwardCall
from moestab.routing.routes import INDEX_DTYPE, Routes


@dataclass(frozen=True)
class Fields:
    """What is recorded besides the expert ids (``RoutingRecorder``'s switches)."""

    margin: bool
    entropy: bool
    router_logprobs: bool
    slot_scores: bool
    gates: bool
    top_k: int

    @property
    def logits(self) -> bool:
        """Router logits are kept during the forward (every statistic derives from them)."""
        return self.margin or self.entropy or self.router_logprobs

    @property
    def scores(self) -> bool:
        """Selection scores are computed in the hook (the margin ranks them; slot scores gather them)."""
        return self.margin or self.slot_scores

    @property
    def extras(self) -> bool:
        return self.logits or self.slot_scores or self.gates


@dataclass
class Frame:
    """One top-level forward's router outputs, per layer, as the routers returned them (references, not copies)."""

    call: ForwardCall
    rows: torch.Tensor | None  # [kept] rows of the batch being recorded; None = all
    chosen: list[torch.Tensor | None]  # per layer [N, top_k] expert ids, N = batch * seq
    logits: list[torch.Tensor | None]  # per layer [N, experts] detached; filled only when statistics are recorded
    scores: list[torch.Tensor | None]  # per layer [N, experts] selection scores; only for margins
    slot_scores: list[torch.Tensor | None]  # per layer [N, top_k] chosen experts' selection scores; only when asked
    gates: list[torch.Tensor | None]  # per layer [N, top_k] detached combine weights; only when asked
    seen: int = 0
    """Layers recorded so far."""

    @classmethod
    def empty(cls, call: ForwardCall, rows: torch.Tensor | None, layers: int) -> Frame:
        return cls(call, rows, [None] * layers, [None] * layers, [None] * layers, [None] * layers, [None] * layers)


@dataclass(frozen=True, slots=True)
class Recorded:
    """One forward's fields over all layers, padding not yet marked (``Segment.routes`` marks it)."""

    indices: torch.Tensor  # [kept, seq, layers, top_k] INDEX_DTYPE
    real: torch.Tensor | None  # [kept, seq] bool, True at real tokens; None = no padding mask given
    margin: torch.Tensor | None = None  # [kept, seq, layers]
    entropy: torch.Tensor | None = None  # [kept, seq, layers]
    confidence: torch.Tensor | None = None  # [kept, seq, layers]
    router_logprobs: torch.Tensor | None = None  # [kept, seq, layers, experts]
    slot_scores: torch.Tensor | None = None  # [kept, seq, layers, top_k] float32
    gates: torch.Tensor | None = None  # [kept, seq, layers, top_k] float32


def finish(frame: Frame, fields: Fields) -> Recorded:
    """Stack ``frame``'s layers into one ``Recorded`` (every router of the model ran once)."""
    call, rows = frame.call, frame.rows
    layers = len(frame.chosen)

    def stacked(per_layer: list[torch.Tensor | None]) -> torch.Tensor:
        """``layers x [N, d] -> [kept, seq, layers, d]`` in one copy (plus the row gather when sampling)."""
        t = torch.stack(per_layer, dim=1).view(call.batch, call.seq, layers, -1)  # [batch, seq, layers, d]
        return t if rows is None else t[rows.to(t.device, non_blocking=True)]

    chosen = stacked(frame.chosen)  # [kept, seq, layers, top_k] in the routers' own dtype
    real = call.attention_mask  # [batch, seq] bool
    if real is not None and rows is not None:
        # rows live on the host: a blocking copy to the GPU would wait for it (moestab.routing.host_sync).
        real = real[rows.to(real.device, non_blocking=True)]  # [kept, seq]
    if not fields.extras:
        return Recorded(chosen.to(INDEX_DTYPE), real)
    with torch.no_grad():  # selection scores may carry a bias parameter's graph
        margin = entropy = confidence = logprobs = slot_scores = gates = None
        if fields.logits:
            raw = stacked(frame.logits)  # [kept, seq, layers, experts]
            if fields.margin:
                # Families that rank by the float32 logits hand back the logits themselves: stack them once.
                same = all(s is x for s, x in zip(frame.scores, frame.logits, strict=True))
                margin = _margin(raw if same else stacked(frame.scores), fields.top_k)  # [kept, seq, layers]
            if fields.entropy or fields.router_logprobs:
                logp = torch.log_softmax(raw.float(), dim=-1)  # [kept, seq, layers, experts]
                if fields.entropy:
                    probs = logp.exp()  # [kept, seq, layers, experts]
                    entropy = -(probs * logp).sum(-1)  # [kept, seq, layers]
                    # The routers' own ids: at padding they differ from the -1 of Routes, but padding becomes NaN.
                    confidence = probs.gather(-1, chosen.long()).sum(-1)  # [kept, seq, layers]
                if fields.router_logprobs:
                    logprobs = logp
        if fields.slot_scores:
            slot_scores = stacked(frame.slot_scores).float()  # [kept, seq, layers, top_k]
        if fields.gates:
            gates = stacked(frame.gates).float()  # [kept, seq, layers, top_k]
    return Recorded(chosen.to(INDEX_DTYPE), real, margin, entropy, confidence, logprobs, slot_scores, gates)


@dataclass
class Segment:
    """Consecutive forwards over the same sequences: one prefill plus its KV-cached decode steps."""

    rows: torch.Tensor | None
    row_offset: int
    batch: int
    forwards: list[Recorded] = field(default_factory=list)
    _routes: Routes | None = None

    def add(self, recorded: Recorded) -> None:
        self.forwards.append(recorded)
        self._routes = None

    def routes(self, layers: tuple[int, ...], num_experts: int) -> Routes:
        """The segment's forwards along the sequence axis, -1 / NaN at padding (built once, on first read)."""
        if self._routes is None:
            routes = _stitch(self.forwards, layers, num_experts, self.rows, self.row_offset)
            # The stitched tensors replace the forwards (one copy held, not two); a later decode step is appended
            # to them, padding already marked.
            self.forwards = [Recorded(routes.indices, None, **{name: getattr(routes, name) for name, _ in _FILLS[1:]})]
            self._routes = routes
        return self._routes


_FILLS = (("indices", -1), *((name, float("nan")) for name in
                              ("margin", "entropy", "confidence", "router_logprobs", "slot_scores", "gates")))
"""``Recorded`` fields and the value ``Routes`` holds at padding."""


def _stitch(forwards: list[Recorded], layers: tuple[int, ...], num_experts: int, rows: torch.Tensor | None,
            row_offset: int) -> Routes:
    first = forwards[0]
    real = None  # [kept, seq] bool, True at real tokens
    if any(f.real is not None for f in forwards):
        device = first.indices.device
        parts = [_all_real(f) if f.real is None else f.real.to(device) for f in forwards]
        real = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    fields = {}
    for name, fill in _FILLS:
        if getattr(first, name) is None:
            continue
        t = getattr(first, name) if len(forwards) == 1 else torch.cat([getattr(f, name) for f in forwards], dim=1)
        # where(real, t, fill) keeps t's dtype (a Python scalar does not promote) and is one operation.
        fields[name] = t if real is None else torch.where(real.view(*real.shape, *[1] * (t.dim() - 2)), t, fill)
    return Routes(layers=layers, num_experts=num_experts, rows=None if rows is None else rows + row_offset, **fields)


def _all_real(recorded: Recorded) -> torch.Tensor:
    return torch.ones(recorded.indices.shape[:2], dtype=torch.bool, device=recorded.indices.device)  # [kept, seq]


def _margin(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """``scores [..., E] -> [...]``: the k-th best score minus the (k+1)-th (NaN when k == E)."""
    if top_k >= scores.shape[-1]:
        return scores.new_full(scores.shape[:-1], float("nan"), dtype=torch.float)
    top = scores.float().topk(top_k + 1, dim=-1).values  # [..., k+1]
    return top[..., top_k - 1] - top[..., top_k]
