"""``BaseRouting``: a policy whose every forward routes each token as a frozen base model routes it.

The routing-constant control of the controlled experiment (``--routing-replay base``): during RL the policy's weights
change as in any arm, but the experts each token uses are those the warm-started base chooses for the same token,
so routing never changes between rollout, pi_old, the updates and pi_new, while the gate weights still learn (they
come from the policy's router at the base's experts, as under R2 / R3).

It works for any forward, a ``generate()`` included: before each forward of the policy, the base runs the same call
(same ids, padding, positions) and its experts are forced in the policy's routers. A KV-cached decode step runs the
base on its own cache, which is created empty beside the policy's at the prefill, so decoding costs one more forward
per step and no re-encoding of the prefix.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from moestab.routing.discovery import RouterSite, find_routers
from moestab.routing.errors import RoutesMismatchError
from moestab.routing.forward_call import CACHE_KEYWORDS, find_cache, read_forward_call
from moestab.routing.replay import ForcedRouting


class BaseRouting(ForcedRouting):
    """Inside the context, every forward of ``model`` routes each real token to the experts ``base`` chooses for it in
    the same forward (padding keeps the policy's own choice).

    ``base`` must have the policy's routers (MoE layers, experts, top-k); it runs without grad and is never changed.
    A decode step of a KV cache whose prefill this context did not see raises ``RoutesMismatchError``. ``verify``
    checks both models' routers against their family's adapter (``moestab.routing.verify``).
    """

    def __init__(self, model: nn.Module, base: nn.Module, *, verify: bool = True) -> None:
        super().__init__(model, find_routers(model, verify=verify))
        self.base = base
        self.base_sites: list[RouterSite] = find_routers(base, verify=verify)
        mine = [(s.adapter.family, s.layer, s.num_experts, s.top_k) for s in self.sites]  # per MoE layer
        theirs = [(s.adapter.family, s.layer, s.num_experts, s.top_k) for s in self.base_sites]
        if mine != theirs:
            raise RoutesMismatchError(f"the base's routers (family, layer, experts, top_k) {theirs} differ from the "
                                      f"policy's {mine}; a base must have the policy's architecture")
        self._chosen: list[torch.Tensor | None] = [None] * len(self.base_sites)  # per layer [N, top_k] of a call
        self._caches: tuple[Any, Any] | None = None  # (the policy's KV cache, the base's beside it)
        self._base_handles: list[RemovableHandle] = []

    def __enter__(self) -> BaseRouting:
        self._attach()
        for ordinal, site in enumerate(self.base_sites):
            self._base_handles.append(site.module.register_forward_hook(self._base_hook(ordinal, site)))
        return self

    def __exit__(self, *exc: object) -> None:
        self._detach()
        for handle in self._base_handles:
            handle.remove()
        self._base_handles.clear()
        self._chosen = [None] * len(self.base_sites)
        self._caches = None

    def _base_hook(self, ordinal: int, site: RouterSite):
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            self._chosen[ordinal] = site.adapter.read(output, site.top_k)[2]  # [N, top_k] the base's experts

        return hook

    def _begin(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        call = read_forward_call(args, kwargs)
        base_kwargs = dict(kwargs)
        cache = find_cache(kwargs)
        if cache is not None:
            base_kwargs[next(k for k in CACHE_KEYWORDS if kwargs.get(k) is not None)] = self._base_cache(cache, call)
        self._chosen = [None] * len(self.base_sites)
        with torch.no_grad():
            self.base(*args, **base_kwargs)
        if any(chosen is None for chosen in self._chosen):
            raise RoutesMismatchError("the base's forward did not run every router; it cannot route the policy")
        chosen = torch.stack(self._chosen, dim=1).long()  # [batch*seq, layers, top_k]
        if call.attention_mask is not None:  # padding keeps the policy's own choice, as in RoutingReplay
            padding = ~call.attention_mask.reshape(-1).to(chosen.device)  # [batch*seq]
            chosen = chosen.masked_fill(padding[:, None, None], -1)
        self._forced = chosen

    def _base_cache(self, cache: Any, call: Any) -> Any:
        """The base's KV cache beside the policy's ``cache``: a new empty one at a prefill, the same one after."""
        if not call.continuation:
            # An empty cache of the policy's own type and settings; the base fills it as generate() fills the policy's.
            self._caches = (cache, copy.deepcopy(cache))
        elif self._caches is None or self._caches[0] is not cache:
            raise RoutesMismatchError("a decode step of a KV cache whose prefill ran outside this BaseRouting context; "
                                      "enter it before generate() starts")
        return self._caches[1]
