"""Finding the MoE routers of a Hugging Face model."""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from moestab.routing.adapters import SUPPORTED_FAMILIES, RouterAdapter, adapter_for
from moestab.routing.errors import NotAnMoEModelError

_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class RouterSite:
    """One router in a model."""

    name: str
    """Qualified module name, e.g. ``model.layers.3.mlp.gate``."""
    module: nn.Module
    adapter: RouterAdapter
    layer: int
    """Decoder-layer index (DeepSeek-V3's dense first layers make this differ from the MoE ordinal)."""
    num_experts: int
    top_k: int


def find_routers(model: nn.Module) -> list[RouterSite]:
    """Every MoE router of ``model`` in forward order; raises ``NotAnMoEModelError`` if there is none."""
    sites = []
    for name, module in model.named_modules():
        adapter = adapter_for(module)
        if adapter is None:
            continue
        match = _LAYER_INDEX.search(name)
        layer = int(match.group(1)) if match else len(sites)
        sites.append(RouterSite(name, module, adapter, layer, adapter.num_experts(module), adapter.top_k(module)))
    if not sites:
        raise NotAnMoEModelError(
            f"{type(model).__name__} has no Mixture-of-Experts router that moestab recognises; "
            f"supported families: {', '.join(SUPPORTED_FAMILIES)} (transformers v5 implementations)"
        )
    top_ks = {s.top_k for s in sites}
    if len(top_ks) != 1:
        raise NotAnMoEModelError(f"routers disagree on top_k ({sorted(top_ks)}); mixed top-k is unsupported")
    return sorted(sites, key=lambda s: s.layer)
