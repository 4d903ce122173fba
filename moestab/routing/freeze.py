"""The router's own parameters, and freezing them (``moestab train --freeze-router``)."""

from __future__ import annotations

from torch import nn

from moestab.routing.discovery import find_routers


def router_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Every parameter of every router :func:`find_routers` finds: the router module's own (gate weight, gate bias, a
    correction bias kept on the router), plus, for families whose MoE block passes the correction bias into the router
    (``Selection.bias`` an int: AFMoE, HY-V3, MiniMax-M2, LFM2-MoE), the block's direct parameters (the experts are
    submodules of the block, so they are not among them). Correction biases kept as buffers are never trained."""
    found: dict[int, nn.Parameter] = {}
    for site in find_routers(model, verify=False):
        params = list(site.module.parameters())
        if isinstance(getattr(site.adapter.selection_scores, "bias", None), int):
            block = model.get_submodule(site.name.rpartition(".")[0])
            params += list(block.parameters(recurse=False))
        found.update((id(p), p) for p in params)
    return list(found.values())


def freeze_routers(model: nn.Module) -> int:
    """Set ``requires_grad = False`` on :func:`router_parameters`; the number of parameters (elements) frozen."""
    params = router_parameters(model)
    for param in params:
        param.requires_grad_(False)
    return sum(p.numel() for p in params)
