"""``RoutingRecorder``: forward hooks that record every token's top-k experts, per MoE layer."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from moestab.routing.discovery import RouterSite, find_routers
from moestab.routing.errors import RecordingError
from moestab.routing.forward_call import read_forward_call
from moestab.routing.frames import Fields, Frame, Segment, finish
from moestab.routing.routes import Routes

RouterHook = Callable[[nn.Module, tuple[Any, ...], Any], None]


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
        self._layers = tuple(s.layer for s in sites)
        self._handles: list[RemovableHandle] = []
        self._fields = self._asked()
        self._frame: Frame | None = None
        self._segments: list[Segment] = []
        self._rows_seen = 0
        self._routes: Routes | None = None

    def _asked(self) -> Fields:
        return Fields(margin=self.record_margin, entropy=self.record_entropy, router_logprobs=self.record_logprobs,
                      slot_scores=self.record_slot_scores, gates=self.record_gates, top_k=self.sites[0].top_k)

    # ---- context manager -------------------------------------------------------------------
    def __enter__(self) -> RoutingRecorder:
        if self._handles:
            raise RuntimeError("RoutingRecorder is already active")
        self._segments, self._rows_seen, self._routes = [], 0, None
        self._fields = self._asked()
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
        num_experts = self.sites[0].num_experts
        return [seg.routes(self._layers, num_experts) for seg in self._segments if seg.forwards]

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
    # The hooks run on every forward: they keep references to the routers' outputs and nothing else; the stacking,
    # casts and statistics run once per forward in moestab.routing.frames.finish, padding once per segment.
    def _begin(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        call = read_forward_call(args, kwargs)
        segment = self._segments[-1] if self._segments else None
        if not (call.continuation and segment is not None and segment.batch == call.batch):
            segment = Segment(rows=self._sample_rows(call.batch), row_offset=self._rows_seen, batch=call.batch)
            self._segments.append(segment)
            self._rows_seen += call.batch
        self._frame = Frame.empty(call, segment.rows, len(self.sites))
        self._routes = None

    def _sample_rows(self, batch: int) -> torch.Tensor | None:
        if self.sequence_fraction >= 1.0:
            return None
        keep = max(1, round(self.sequence_fraction * batch))
        generator = torch.Generator().manual_seed(self.seed + len(self._segments))
        return torch.randperm(batch, generator=generator)[:keep].sort().values

    def _router_hook(self, ordinal: int, site: RouterSite) -> RouterHook:
        read, top_k, fields = site.adapter.read, site.top_k, self._fields
        extras = fields.extras

        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            frame = self._frame
            if frame is None:
                return  # router called outside a top-level forward (see class docstring)
            if frame.chosen[ordinal] is not None:
                raise RecordingError(f"router {site.name} ran twice in one forward")
            logits, weights, chosen = read(output, top_k)  # [N, experts], [N, top_k], [N, top_k]
            tokens = frame.call.batch * frame.call.seq
            if chosen.shape[0] != tokens:
                raise RecordingError(
                    f"router {site.name} saw {chosen.shape[0]} tokens, expected batch*seq = "
                    f"{frame.call.batch}*{frame.call.seq}"
                )
            frame.chosen[ordinal] = chosen
            frame.seen += 1
            if extras:
                _keep_extras(frame, ordinal, site, fields, module, args, logits, weights, chosen)

        return hook

    def _end(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        frame, self._frame = self._frame, None
        if frame is None:
            return
        if frame.seen != len(self.sites):
            missing = [s.name for s, idx in zip(self.sites, frame.chosen, strict=True) if idx is None]
            raise RecordingError(f"routers {missing} did not run in this forward")
        self._segments[-1].add(finish(frame, self._fields))


def _keep_extras(
    frame: Frame,
    ordinal: int,
    site: RouterSite,
    fields: Fields,
    module: nn.Module,
    args: tuple[Any, ...],
    logits: torch.Tensor,
    weights: torch.Tensor,
    chosen: torch.Tensor,
) -> None:
    """Keep what statistics, slot scores and gates are computed from at the end of the forward: the detached logits
    ``[N, E]`` and weights ``[N, k]`` (references), and the selection scores, which need the router's own arguments."""
    logits = logits.detach()  # [N, experts]
    if fields.logits:
        frame.logits[ordinal] = logits
    if fields.scores:
        # The ranking the family used; some families take their correction bias as a forward argument.
        scores = site.adapter.selection_scores(module, logits, args)  # [N, experts]
        if fields.margin:
            frame.scores[ordinal] = scores
        if fields.slot_scores:
            frame.slot_scores[ordinal] = scores.gather(-1, chosen)  # [N, top_k]
    if fields.gates:
        # The router's own output, what its experts are weighted by: no family's math is redone here.
        frame.gates[ordinal] = weights.detach()  # [N, top_k]
