"""Finding the MoE routers of a Hugging Face model, and refusing the ones moestab cannot adapt exactly."""

from __future__ import annotations

import re
from dataclasses import dataclass

import transformers
from torch import nn

from moestab.routing.adapters import (
    SUPPORTED_FAMILIES,
    RouterAdapter,
    adapter_for,
    missing_router_class,
    unsupported_for,
)
from moestab.routing.errors import (
    NotAnMoEModelError,
    RouterClassMissingError,
    TransformersTooOldError,
    UnsupportedRoutingError,
)
from moestab.routing.verify import Probes, verify_router

_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class RouterSite:
    """One router in a model."""

    name: str
    """Qualified module name, e.g. ``model.layers.3.mlp.gate``."""
    module: nn.Module
    adapter: RouterAdapter
    layer: int
    """Decoder-layer index (dense first layers and hybrid stacks make this differ from the MoE ordinal)."""
    num_experts: int
    top_k: int


def _model_types(model: nn.Module) -> list[str]:
    config = getattr(model, "config", None)
    types = [getattr(config, "model_type", None)]
    text = getattr(config, "text_config", None)
    types.append(getattr(text, "model_type", None))
    return [t for t in types if t]


def _refuse_if_too_old(model: nn.Module, adapter: RouterAdapter) -> None:
    """Raise ``TransformersTooOldError`` when ``adapter``'s family needs a newer transformers than the installed one."""
    installed = transformers.__version__
    if adapter.too_old(installed):
        raise TransformersTooOldError(
            f"{type(model).__name__} is a {adapter.family} model: moestab's {adapter.family} adapter matches its "
            f"router from transformers {adapter.min_transformers} on, and transformers {installed} is installed; "
            f"pip install 'transformers>={adapter.min_transformers}'"
        )


def find_routers(model: nn.Module, *, verify: bool = True) -> list[RouterSite]:
    """Every MoE router of ``model`` in forward order.

    Raises ``UnsupportedRoutingError`` for a family whose routing cannot be forced exactly (the reason is in the
    message), ``RouterClassMissingError`` when the model's family is supported but this transformers build lacks
    the router class moestab expects, ``TransformersTooOldError`` when the family's adapter needs a newer
    transformers release (``RouterAdapter.min_transformers``), ``NotAnMoEModelError`` when there is no router at all,
    and, with ``verify``, ``AdapterMismatchError`` when a family's adapter does not reproduce its router
    (``moestab.routing.verify``).
    """
    sites = []
    # Runs each time a recorder or replay is built, i.e. around every forward of a trainer: the model's classes are
    # looked up once each (a model has a few dozen modules of a dozen classes), in one pass over its modules.
    adapters: dict[type[nn.Module], RouterAdapter | None] = {}
    for name, module in model.named_modules():
        kind = type(module)
        if kind not in adapters:
            unsupported = unsupported_for(module)
            if unsupported is not None:
                raise UnsupportedRoutingError(
                    f"{type(model).__name__} is a {unsupported.family} model, whose routing moestab cannot record and "
                    f"replay exactly: {unsupported.reason} (module {name})"
                )
            adapters[kind] = adapter_for(module)
            if adapters[kind] is not None:  # before its attributes are read: an older release may lack them
                _refuse_if_too_old(model, adapters[kind])
        adapter = adapters[kind]
        if adapter is None:
            continue
        match = _LAYER_INDEX.search(name)
        layer = int(match.group(1)) if match else len(sites)
        sites.append(RouterSite(name, module, adapter, layer, adapter.num_experts(module), adapter.top_k(module)))
    if not sites:
        for model_type in _model_types(model):
            adapter = missing_router_class(model_type)
            if adapter is not None:
                _refuse_if_too_old(model, adapter)  # an older release, before the class had this name
                raise RouterClassMissingError(
                    f"{type(model).__name__} is a {adapter.family} model, a family moestab supports, but transformers "
                    f"{transformers.__version__} has no router class {adapter.router_class} (renamed or removed?); "
                    f"moestab {adapter.family} support was written against the class of that name"
                )
        raise NotAnMoEModelError(
            f"{type(model).__name__} has no Mixture-of-Experts router that moestab recognises; "
            f"supported families: {', '.join(SUPPORTED_FAMILIES)} (transformers v5 implementations)"
        )
    top_ks = {s.top_k for s in sites}
    if len(top_ks) != 1:
        raise NotAnMoEModelError(f"routers disagree on top_k ({sorted(top_ks)}); mixed top-k is unsupported")
    if verify:
        probes = Probes()  # one draw of synthetic tokens for all routers
        for site in sites:
            verify_router(site.adapter, site.module, site.name, probes)
    return sorted(sites, key=lambda s: s.layer)
