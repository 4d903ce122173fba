"""``RoutingRecorder``: forward hooks that record every token's top-k experts, per MoE layer."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from moestab.routing.discovery import RouterSite, find_routers
from moestab.routing.errors import RecordingError
from moestab.routing.forward_call import ForwardCall, read_forward_call
from moestab.routing.routes import INDEX_DTYPE, Routes


@dataclass
class _Frame:
    """Per-layer outputs of one top-level forward, before stacking."""

    call: ForwardCall
    rows: torch.Tensor | None  # [kept] rows of the batch being recorded; None = all
    indices: list[torch.Tensor | None]  # per layer [kept, seq, top_k]
    logits: list[torch.Tensor | None]  # per layer [kept, seq, experts], kept only when stats are asked
    scores: list[torch.Tensor | None]  # per layer [kept, seq, experts] selection scores, kept only for margins
    slot_scores: list[torch.Tensor | None]  # per layer [kept, seq, top_k], kept only when asked
    gates: list[torch.Tensor | None]  # per layer [kept, seq, top_k] float32, kept only when asked


@dataclass
class _Segment:
    """Consecutive forwards over the same sequences: one prefill plus its KV-cached decode steps."""

    rows: torch.Tensor | None
    row_offset: int
    batch: int
    frames: list[Routes] = field(default_factory=list)


class RoutingRecorder:
    """Record, for every forward inside the context, which experts each token was routed to.

    >>> with RoutingRecorder(model) as rec:
    ...     model(input_ids=ids, attention_mask=mask)
    >>> rec.routes.indices  # [batch, seq, layers, top_k], -1 at padding

    Works with and without grad, with left or right padding, and during ``generate()``: the prefill
    and every KV-cached decode step are stitched into one sequence of positions (the last sampled
    token is never fed to the model, so it has no route). Separate forwards are concatenated along
    the batch axis (``.segments`` keeps them apart). Router calls outside a top-level forward of
    ``model`` (e.g. activation-checkpoint recomputation in backward) are not recorded.

    Args:
        model: a Hugging Face MoE model (any family in ``SUPPORTED_FAMILIES``).
        layers: decoder-layer indices to record (default: every MoE layer).
        sequence_fraction: share of each forward's sequences to keep, chosen at random per segment
            with ``seed``; the kept input rows are in ``Routes.rows``.
        margin: also record the selection-score gap between the k-th and (k+1)-th expert.
        entropy: also record the entropy of softmax(router logits) and the routing confidence, the
            probability mass softmax(router logits) puts on the chosen experts.
        router_logprobs: also record log-softmax of the router logits over all experts (large).
        slot_scores: also record each chosen expert's selection score (``Routes.slot_scores``), the
            ranking its family used; ``Routes.ranked()`` then puts the top-1 in slot 0 for every family.
        gates: also record the combine weights the router handed its chosen experts (``Routes.gates``, float32),
            for ``RoutingReplay(force_gates=True)``. Exact (float32 holds them) unless the router computes its
            gates in float64 (GPT-OSS in a float64 model): then rounded to float32.
        verify: check every router against its family's adapter first (``moestab.routing.verify``, about 0.1 ms
            per router); code that already checked this model (``find_routers(model)``) passes False.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        layers: Iterable[int] | None = None,
        sequence_fraction: float = 1.0,
        seed: int = 0,
        margin: bool = True,
        entropy: bool = True,
        router_logprobs: bool = False,
        slot_scores: bool = False,
        gates: bool = False,
        verify: bool = True,
    ) -> None:
        if not 0.0 < sequence_fraction <= 1.0:
            raise ValueError(f"sequence_fraction must be in (0, 1], got {sequence_fraction}")
        sites = find_routers(model, verify=verify)
        if layers is not None:
            wanted = sorted(set(layers))
            available = [s.layer for s in sites]
            missing = [layer for layer in wanted if layer not in available]
            if missing:
                raise ValueError(f"layers {missing} have no MoE router; MoE layers are {available}")
            sites = [s for s in sites if s.layer in wanted]
        self.model = model
        self.sites: list[RouterSite] = sites
        self.sequence_fraction = sequence_fraction
        self.seed = seed
        self.record_margin = margin
        self.record_entropy = entropy
        self.record_logprobs = router_logprobs
        self.record_slot_scores = slot_scores
        self.record_gates = gates
        self._handles: list[RemovableHandle] = []
        self._frame: _Frame | None = None
        self._segments: list[_Segment] = []
        self._rows_seen = 0
        self._routes: Routes | None = None

    # ---- context manager -------------------------------------------------------------------
    def __enter__(self) -> RoutingRecorder:
        if self._handles:
            raise RuntimeError("RoutingRecorder is already active")
        self._segments, self._rows_seen, self._routes = [], 0, None
        self._handles.append(self.model.register_forward_pre_hook(self._begin, with_kwargs=True))
        self._handles.append(self.model.register_forward_hook(self._end))
        for ordinal, site in enumerate(self.sites):
            self._handles.append(site.module.register_forward_hook(self._router_hook(ordinal, site)))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._frame = None

    # ---- results ---------------------------------------------------------------------------
    @property
    def segments(self) -> list[Routes]:
        """One ``Routes`` per recorded segment (a forward, or a prefill with its decode steps)."""
        return [self._stitch(seg) for seg in self._segments if seg.frames]

    @property
    def routes(self) -> Routes:
        """All segments concatenated along the batch axis (right-padded with -1)."""
        if self._routes is None:
            segments = self.segments
            if not segments:
                raise RecordingError("nothing was recorded: no forward of the model ran inside the recorder")
            self._routes = segments[0] if len(segments) == 1 else Routes.cat(segments)
        return self._routes

    # ---- hooks -----------------------------------------------------------------------------
    def _begin(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        call = read_forward_call(args, kwargs)
        segment = self._segments[-1] if self._segments else None
        if not (call.continuation and segment is not None and segment.batch == call.batch):
            segment = _Segment(rows=self._sample_rows(call.batch), row_offset=self._rows_seen, batch=call.batch)
            self._segments.append(segment)
            self._rows_seen += call.batch
        n = len(self.sites)
        self._frame = _Frame(call, segment.rows, *([None] * n for _ in range(5)))
        self._routes = None

    def _sample_rows(self, batch: int) -> torch.Tensor | None:
        if self.sequence_fraction >= 1.0:
            return None
        keep = max(1, round(self.sequence_fraction * batch))
        generator = torch.Generator().manual_seed(self.seed + len(self._segments))
        return torch.randperm(batch, generator=generator)[:keep].sort().values

    def _router_hook(self, ordinal: int, site: RouterSite):
        def hook(module: nn.Module, args: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
            frame = self._frame
            if frame is None:
                return  # router called outside a top-level forward (see class docstring)
            if frame.indices[ordinal] is not None:
                raise RecordingError(f"router {site.name} ran twice in one forward")
            logits, weights, chosen = site.adapter.read(output, site.top_k)  # [N, experts], [N, top_k], [N, top_k]
            batch, seq = frame.call.batch, frame.call.seq
            if chosen.shape[0] != batch * seq:
                raise RecordingError(
                    f"router {site.name} saw {chosen.shape[0]} tokens, expected batch*seq = {batch}*{seq}"
                )
            rows = frame.rows
            idx = chosen.view(batch, seq, -1)  # [batch, seq, top_k]
            frame.indices[ordinal] = idx if rows is None else idx[rows.to(idx.device)]
            if self.record_slot_scores or self.record_margin:
                # The ranking the family used; some families take their correction bias as a forward argument.
                scores = site.adapter.selection_scores(module, logits.detach(), args)  # [N, experts]
                if self.record_margin:
                    full = scores.view(batch, seq, -1)  # [batch, seq, experts]
                    frame.scores[ordinal] = full if rows is None else full[rows.to(full.device)]
                if self.record_slot_scores:
                    slot = scores.gather(-1, chosen).float().view(batch, seq, -1)  # [batch, seq, top_k]
                    frame.slot_scores[ordinal] = slot if rows is None else slot[rows.to(slot.device)]
            if self.record_gates:
                # The router's own output, what its experts are weighted by: no family's math is redone here.
                gates = weights.detach().float().view(batch, seq, -1)  # [batch, seq, top_k]
                frame.gates[ordinal] = gates if rows is None else gates[rows.to(gates.device)]
            if self._wants_logits:
                # Statistics are computed once per forward over all layers in _end (fewer kernel launches).
                logits = logits.detach().view(batch, seq, -1)  # [batch, seq, experts]
                frame.logits[ordinal] = logits if rows is None else logits[rows.to(logits.device)]

        return hook

    @property
    def _wants_logits(self) -> bool:
        return self.record_margin or self.record_entropy or self.record_logprobs

    def _end(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        frame, self._frame = self._frame, None
        if frame is None:
            return
        missing = [s.name for s, idx in zip(self.sites, frame.indices, strict=True) if idx is None]
        if missing:
            raise RecordingError(f"routers {missing} did not run in this forward")
        with torch.no_grad():
            indices = torch.stack(frame.indices, dim=2).to(INDEX_DTYPE)  # [kept, seq, layers, top_k]
            mask = frame.call.attention_mask
            pad = None
            if mask is not None:
                pad = ~(mask if frame.rows is None else mask[frame.rows.to(mask.device)])  # [kept, seq]
                pad = pad.to(indices.device)
                indices = indices.masked_fill(pad[:, :, None, None], -1)
            margin = entropy = confidence = logprobs = slot_scores = gates = None
            if self._wants_logits:
                margin, entropy, confidence, logprobs = self._stats(frame.logits, frame.scores, indices, pad)
            if self.record_slot_scores:
                slot_scores = torch.stack(frame.slot_scores, dim=2)  # [kept, seq, layers, top_k]
                if pad is not None:
                    slot_scores = slot_scores.masked_fill(pad[:, :, None, None], float("nan"))
            if self.record_gates:
                gates = torch.stack(frame.gates, dim=2)  # [kept, seq, layers, top_k]
                if pad is not None:
                    gates = gates.masked_fill(pad[:, :, None, None], float("nan"))
        self._segments[-1].frames.append(
            Routes(
                indices=indices,
                layers=tuple(s.layer for s in self.sites),
                num_experts=self.sites[0].num_experts,
                margin=margin,
                entropy=entropy,
                confidence=confidence,
                router_logprobs=logprobs,
                slot_scores=slot_scores,
                gates=gates,
            )
        )

    def _stats(
        self,
        per_layer: list[torch.Tensor | None],
        per_layer_scores: list[torch.Tensor | None],
        indices: torch.Tensor,
        pad: torch.Tensor | None,
    ) -> tuple[torch.Tensor | None, ...]:
        """Margin, entropy, confidence and log-softmax of all layers' router logits at once (NaN at padding).

        ``indices``: ``[kept, seq, layers, top_k]`` the chosen experts (-1 at padding).
        """
        logits = torch.stack(per_layer, dim=2).float()  # [kept, seq, layers, experts]
        margin = entropy = confidence = logprobs = None
        if self.record_margin:
            scores = torch.stack(per_layer_scores, dim=2)  # [kept, seq, layers, experts]
            margin = _margin(scores, self.sites[0].top_k)  # [kept, seq, layers]
        if self.record_entropy or self.record_logprobs:
            logp = torch.log_softmax(logits, dim=-1)  # [kept, seq, layers, experts]
            if self.record_entropy:
                probs = logp.exp()  # [kept, seq, layers, experts]
                entropy = -(probs * logp).sum(-1)  # [kept, seq, layers]
                confidence = probs.gather(-1, indices.long().clamp_min(0)).sum(-1)  # [kept, seq, layers]
            if self.record_logprobs:
                logprobs = logp
        if pad is not None:
            nan = float("nan")
            margin = None if margin is None else margin.masked_fill(pad[:, :, None], nan)
            entropy = None if entropy is None else entropy.masked_fill(pad[:, :, None], nan)
            confidence = None if confidence is None else confidence.masked_fill(pad[:, :, None], nan)
            logprobs = None if logprobs is None else logprobs.masked_fill(pad[:, :, None, None], nan)
        return margin, entropy, confidence, logprobs

    def _stitch(self, segment: _Segment) -> Routes:
        frames = segment.frames

        def cat(get) -> torch.Tensor | None:
            parts = [get(f) for f in frames]
            return None if parts[0] is None else torch.cat(parts, dim=1)

        rows = None
        if segment.rows is not None:
            rows = segment.rows + segment.row_offset
        return Routes(
            indices=cat(lambda f: f.indices),
            layers=frames[0].layers,
            num_experts=frames[0].num_experts,
            margin=cat(lambda f: f.margin),
            entropy=cat(lambda f: f.entropy),
            confidence=cat(lambda f: f.confidence),
            router_logprobs=cat(lambda f: f.router_logprobs),
            slot_scores=cat(lambda f: f.slot_scores),
            gates=cat(lambda f: f.gates),
            rows=rows,
        )


def _margin(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """``scores [..., E] -> [...]``: the k-th best score minus the (k+1)-th (NaN when k == E)."""
    if top_k >= scores.shape[-1]:
        return scores.new_full(scores.shape[:-1], float("nan"), dtype=torch.float)
    top = scores.float().topk(top_k + 1, dim=-1).values  # [..., k+1]
    return top[..., top_k - 1] - top[..., top_k]
