"""``RoutingReplay``: force recorded experts in every router (Routing Replay, R2 / R3), optionally with their
recorded gate weights too ("Total Router Recall")."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from moestab.routing.discovery import RouterSite, find_routers
from moestab.routing.errors import RoutesMismatchError
from moestab.routing.forward_call import read_forward_call
from moestab.routing.routes import Routes
from moestab.routing.threshold import router_scores, threshold_routes


class ForcedRouting:
    """The router half of replay: while attached, every router of ``model`` routes the tokens of the current forward
    to ``_forced`` (``[batch*seq, layers, top_k]``, -1 = keep the router's own choice), set by the subclass's
    pre-hook on the model (``_begin``) from whatever it replays. Gates come from the current router's scores at the
    forced experts (or, with ``force_gates``, from ``_forced_gates``); see :class:`RoutingReplay`."""

    def __init__(self, model: nn.Module, sites: list[RouterSite], *, force_gates: bool = False,
                 score_ratio: float = 0.0) -> None:
        if model.training:
            for site in sites:
                if site.adapter.training_replay is not None:
                    raise RoutesMismatchError(f"cannot replay {site.adapter.family} in training mode: "
                                              f"{site.adapter.training_replay}")
        self.model = model
        self.sites = sites
        self.force_gates = force_gates
        self.score_ratio = float(score_ratio)
        self._replayed = self._replaced = 0  # slots, summed over the forwards (tensors while inside)
        self._forced: torch.Tensor | None = None  # [batch*seq, layers, top_k] long, -1 = keep own
        self._forced_gates: torch.Tensor | None = None  # [batch*seq, layers, top_k] float32, with force_gates
        self._handles: list[RemovableHandle] = []

    def _attach(self) -> None:
        """The model's pre-hook (``_begin``) and every router's forcing hook."""
        if self._handles:
            raise RuntimeError(f"{type(self).__name__} is already active")
        device = next(self.model.parameters()).device
        self._replayed = self._replaced = torch.zeros((), dtype=torch.long, device=device)
        self._handles.append(self.model.register_forward_pre_hook(self._begin, with_kwargs=True))
        for ordinal, site in enumerate(self.sites):
            # prepend: a RoutingRecorder active at the same time sees the replayed routes.
            self._handles.append(site.module.register_forward_hook(self._router_hook(ordinal, site), prepend=True))

    def _detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._forced = self._forced_gates = None

    def _begin(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        raise NotImplementedError

    @property
    def replayed_slots(self) -> int:
        """Replayed (token, layer, slot)s at real positions so far, with ``score_ratio`` > 0 (0 otherwise)."""
        return int(self._replayed)

    @property
    def replaced_slots(self) -> int:
        """Of :attr:`replayed_slots`, those the score threshold replaced."""
        return int(self._replaced)

    @property
    def replace_rate(self) -> float:
        """``replaced_slots / replayed_slots`` (prime-rl's ``router_replay_replace_rate``); NaN before any."""
        return self.replaced_slots / self.replayed_slots if self.replayed_slots else float("nan")

    def _router_hook(self, ordinal: int, site: RouterSite):
        adapter = site.adapter

        def hook(module: nn.Module, args: tuple[Any, ...], output: Any):
            forced = self._forced
            if forced is None:
                raise RoutesMismatchError(f"router {site.name} ran outside a forward of the replayed model")
            logits, own_gates, own = adapter.read(output, site.top_k)  # [N, experts], [N, top_k], [N, top_k]
            if own.shape[0] != forced.shape[0]:
                raise RoutesMismatchError(
                    f"router {site.name} saw {own.shape[0]} tokens, routes cover {forced.shape[0]}"
                )
            keep_own = forced[:, ordinal] < 0  # [N, top_k] padding: the router's own choice
            replayed = forced[:, ordinal].to(own.dtype)  # [N, top_k]
            if self.score_ratio:
                with torch.no_grad():
                    replayed, rejected = threshold_routes(router_scores(adapter, logits), own, replayed,
                                                          self.score_ratio)
                self._replayed = self._replayed + (~keep_own).sum()
                self._replaced = self._replaced + rejected.sum()
            chosen = torch.where(keep_own, own, replayed)  # [N, top_k]
            if self._forced_gates is None:
                # Cast to the dtype the family hands its experts (e.g. float32 for Mixtral / DeepSeek-V3).
                gates = adapter.gates(module, logits, chosen).to(own_gates.dtype)  # [N, top_k]
                return adapter.write(output, logits, gates, chosen)
            recorded = self._forced_gates[:, ordinal].to(own_gates.dtype)  # [N, top_k]
            frozen = torch.where(keep_own, own_gates.detach(), recorded)  # [N, top_k]
            return adapter.write(output, logits.detach(), frozen, chosen)

        return hook


class RoutingReplay(ForcedRouting):
    """Inside the context, every forward of ``model`` routes each real token to ``routes``' experts.

    Gates come from the *current* router's scores gathered at the replayed experts, with the
    family's own normalisation (``g = mask_replayed * softmax(s)`` renormalised as the family
    does, REFERENCES "Routing"), so gradients still reach the router. With ``force_gates`` the routers
    return ``routes.gates`` as given instead ("Total Router Recall", prime-rl): the forward is the
    recorded one up to the experts' own numerics, and the router is frozen for it (gates and router
    logits detached, so not even a load-balancing loss reaches it). Padding positions (attention
    mask 0) keep the router's own choice. Routes that do not fit a forward (batch, length, layers,
    experts, or a missing route at a real token) raise ``RoutesMismatchError``; there is no fallback. The hooks never
    wait for the device (``moestab.routing.host_sync``): a missing route is noted on the device and raised when the
    context exits (unless its body raised). ``verify``
    checks every router against its family's adapter first (``moestab.routing.verify``); code that already checked
    this model passes False.

    Each forward inside the context must cover exactly the routed sequences, so use one context
    per (micro)batch: ``with RoutingReplay(model, routes.select(rows)): model(...)``. The forced
    routes stay in place until the next forward, so activation-checkpoint recomputation in
    backward replays the same experts. KV-cached decoding is not supported.

    ``score_ratio`` > 0 is score-threshold replay (prime-rl PR #2703, :mod:`moestab.routing.threshold`): a replayed
    expert whose score under the current router is below ``score_ratio`` times the router's weakest own top-k score
    is replaced by the router's own best expert not already used; :attr:`replace_rate` is the share of replayed slots
    replaced, over the forwards inside the context. 0 (the default) is plain replay.
    """

    def __init__(self, model: nn.Module, routes: Routes, *, force_gates: bool = False, verify: bool = True,
                 score_ratio: float = 0.0) -> None:
        if not 0.0 <= score_ratio <= 1.0:
            raise ValueError(f"score_ratio must be in [0, 1] (0: plain replay), got {score_ratio}")
        if score_ratio and force_gates:
            raise ValueError("score_ratio replaces experts whose recorded gates do not exist: it cannot be combined "
                             "with force_gates")
        super().__init__(model, find_routers(model, verify=verify), force_gates=force_gates, score_ratio=score_ratio)
        model_layers = tuple(s.layer for s in self.sites)
        if routes.layers != model_layers:
            raise RoutesMismatchError(
                f"routes cover MoE layers {list(routes.layers)} but the model's MoE layers are "
                f"{list(model_layers)}; replay needs routes for every MoE layer"
            )
        top_k = self.sites[0].top_k
        if routes.top_k != top_k:
            raise RoutesMismatchError(f"routes have top_k={routes.top_k}, the model routes to top_k={top_k}")
        num_experts = self.sites[0].num_experts
        if routes.num_experts != num_experts or int(routes.indices.max()) >= num_experts:
            raise RoutesMismatchError(
                f"routes name experts up to {int(routes.indices.max())} of {routes.num_experts}, "
                f"the model has {num_experts} experts per layer (valid ids 0..{num_experts - 1})"
            )
        # Checks that do not depend on the forward's padding run once here, off the forward path.
        ordered = routes.indices.sort(dim=-1).values  # [batch, seq, layers, top_k]
        repeated = ((ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] >= 0)).any(-1).any(-1)
        if bool(repeated.any()):
            b, s = (int(v) for v in repeated.nonzero()[0])
            raise RoutesMismatchError(f"a token routes twice to the same expert, first at [batch={b}, seq={s}]")
        if force_gates:
            _check_gates(routes)
        self.routes = routes
        self._missing: torch.Tensor | None = None  # [batch, seq] bool: real positions without a route, so far

    def __enter__(self) -> RoutingReplay:
        self._attach()
        device = next(self.model.parameters()).device
        self._indices = self.routes.indices.to(device=device, dtype=torch.long)  # [batch, seq, layers, top_k]
        self._unrouted = (self._indices < 0).any(-1).any(-1)  # [batch, seq] positions without a route
        if self.force_gates:
            self._forced_gates = self.routes.gates.to(device).flatten(0, 1)  # [batch*seq, layers, top_k]
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self._detach()
        missing, self._missing = self._missing, None
        if exc_type is None and missing is not None:
            _check_covered(missing)  # the one wait for the device, once per context instead of once per forward

    def _begin(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        call = read_forward_call(args, kwargs)
        if call.continuation:
            raise RoutesMismatchError("RoutingReplay does not support KV-cached decoding; run a full forward")
        indices = self._indices
        if (call.batch, call.seq) != tuple(indices.shape[:2]):
            raise RoutesMismatchError(
                f"routes are for [batch={indices.shape[0]}, seq={indices.shape[1]}] but the forward is "
                f"[batch={call.batch}, seq={call.seq}]; select the matching rows / positions"
            )
        real = (
            torch.ones(call.batch, call.seq, dtype=torch.bool, device=indices.device)
            if call.attention_mask is None
            else call.attention_mask.to(indices.device)
        )  # [batch, seq]
        missing = real & self._unrouted  # [batch, seq]
        # Kept on the device and checked at exit: bool() here would make every forward wait for the GPU.
        self._missing = missing if self._missing is None else self._missing | missing  # [batch, seq]
        forced = indices.masked_fill(~real[:, :, None, None], -1)
        self._forced = forced.flatten(0, 1)  # [batch*seq, layers, top_k]


def _check_covered(missing: torch.Tensor) -> None:
    """The forwards' real positions all had a route (``missing [batch, seq]``: those that had none)."""
    if bool(missing.any()):
        b, s = (int(v) for v in missing.nonzero()[0])
        raise RoutesMismatchError(
            f"{int(missing.sum())} real (unpadded) positions have no route, first at "
            f"[batch={b}, seq={s}]; routes must cover every token with attention_mask 1"
        )


def _check_gates(routes: Routes) -> None:
    """Routes replayed with ``force_gates`` carry a finite gate for every routed slot."""
    if routes.gates is None:
        raise RoutesMismatchError(
            "force_gates replays recorded gate weights, but these routes have none; record them with "
            "RoutingRecorder(..., gates=True) (the rollout engine does under --routing-replay rollout-gates)"
        )
    missing = ((routes.indices >= 0) & ~routes.gates.isfinite()).any(-1).any(-1)  # [batch, seq]
    if bool(missing.any()):
        b, s = (int(v) for v in missing.nonzero()[0])
        raise RoutesMismatchError(f"routes have experts but no finite gate weight, first at [batch={b}, seq={s}]")
