"""Where a step's routing change comes from, per MoE layer: the routers' own weights, or the hidden states they read.

Between two policies (pi_old and pi_new of a step) a token's experts at layer l change because that router's weights
moved or because the hidden state entering it moved (every layer below trained too). For the same tokens, with
``h_old`` / ``h_new`` each router's input under either policy and ``W_old`` / ``W_new`` the router itself:

- ``changed``: top-k(W_new h_new) vs top-k(W_old h_old), the old->new change the step metrics report;
- ``router``: top-k(W_new h_old) vs top-k(W_old h_old), the router's weights alone;
- ``hidden``: top-k(W_old h_new) vs top-k(W_old h_old), the hidden states alone.

Each is the slot-level changed fraction over the real tokens (``moestab.metrics.routes.route_change_of``, the
function behind ``routing/old_new/changed``). The two parts need not add up to ``changed``: a decision near a tie may
flip only when both move, or flip back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from moestab.metrics.routes import route_change_of
from moestab.recording.batch import position_ids_from_mask
from moestab.routing import RouterSite, find_routers


def _router_inputs(model: nn.Module, sites: list[RouterSite], input_ids: torch.Tensor,
                   attention_mask: torch.Tensor, measured: torch.Tensor) -> list[torch.Tensor]:
    """Each router's input ``[measured tokens, hidden]`` in one free forward of ``model``."""
    captured: list[torch.Tensor | None] = [None] * len(sites)

    def keep(ordinal: int):
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            captured[ordinal] = args[0].detach().reshape(-1, args[0].shape[-1])  # [batch*seq, hidden]

        return hook

    handles = [site.module.register_forward_pre_hook(keep(i)) for i, site in enumerate(sites)]
    try:
        with torch.no_grad():
            model(input_ids=input_ids, attention_mask=attention_mask,
                  position_ids=position_ids_from_mask(attention_mask))
    finally:
        for handle in handles:
            handle.remove()
    rows = measured.reshape(-1).to(input_ids.device)  # [batch*seq]
    return [h[rows] for h in captured]  # [measured tokens, hidden] per layer


def _top_k(site: RouterSite, hidden: torch.Tensor) -> np.ndarray:
    """``[tokens, top_k]`` the experts ``site``'s router chooses for ``hidden``."""
    with torch.no_grad():
        chosen = site.adapter.read(site.module(hidden), site.top_k)[2]
    return chosen.to("cpu", torch.int16).numpy()


def volatility_sources(before: nn.Module, after: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       measured: torch.Tensor | None = None) -> pd.DataFrame:
    """One row per MoE layer: ``changed``, ``router`` and ``hidden`` (module docstring) between ``before`` and
    ``after`` (one architecture), forwarding ``input_ids`` ``[batch, seq]`` with ``attention_mask`` and measuring
    the positions where ``measured`` ``[batch, seq]`` bool is True (default: every real token)."""
    measured = attention_mask.bool() if measured is None else measured.bool()  # [batch, seq]
    old_sites, new_sites = find_routers(before), find_routers(after)
    if [s.layer for s in old_sites] != [s.layer for s in new_sites]:
        raise ValueError("the two policies have different MoE layers; compare checkpoints of one model")
    h_old = _router_inputs(before, old_sites, input_ids, attention_mask, measured)
    h_new = _router_inputs(after, new_sites, input_ids, attention_mask, measured)

    def routes(sites: list[RouterSite], hidden: list[torch.Tensor]) -> np.ndarray:
        return np.stack([_top_k(site, h) for site, h in zip(sites, hidden, strict=True)], axis=1)  # [tokens, L, k]

    base = routes(old_sites, h_old)
    parts = {"changed": routes(new_sites, h_new), "router": routes(new_sites, h_old),
             "hidden": routes(old_sites, h_new)}
    by_layer = {name: route_change_of(base, other)["changed_by_layer"][0] for name, other in parts.items()}
    return pd.DataFrame({"layer": [s.layer for s in old_sites], **by_layer})
