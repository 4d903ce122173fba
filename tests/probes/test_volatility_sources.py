"""volatility_sources: the old->new change per layer split into the routers' weights and the hidden states, checked
against the routes RoutingRecorder records and against perturbations whose source is known."""

import copy

import numpy as np
import pytest
import torch

from moestab.metrics.routes import route_change_of
from moestab.probes.volatility_sources import volatility_sources
from moestab.recording.batch import position_ids_from_mask
from moestab.routing import RoutingRecorder, find_routers
from tests.support.routing import batch, make_model


def _moved(model, *, routers: bool, others: bool, scale: float = 0.3, seed: int = 0):
    """A copy of ``model`` with its routers' weights and / or every other weight moved by noise."""
    out = copy.deepcopy(model)
    router_names = {f"{s.name}.{n}" for s in find_routers(out) for n, _ in s.module.named_parameters()}
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in out.named_parameters():
            if (name in router_names and routers) or (name not in router_names and others):
                p.add_(scale * p.std().nan_to_num() * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return out


def _recorded(model, ids, mask) -> np.ndarray:
    with RoutingRecorder(model) as rec, torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask))
    return rec.routes.indices[mask.bool()].numpy()  # [real tokens, layers, k]


def test_changed_is_the_recorded_old_new_change_and_nothing_moves_without_an_update():
    before = make_model("qwen3_moe")
    after = _moved(before, routers=True, others=True)
    ids, mask = batch(padding="left")
    table = volatility_sources(before, after, ids, mask)
    want = route_change_of(_recorded(before, ids, mask), _recorded(after, ids, mask))["changed_by_layer"][0]
    np.testing.assert_allclose(table["changed"], want, rtol=0, atol=1e-12)
    assert (table["changed"] > 0).all()
    same = volatility_sources(before, copy.deepcopy(before), ids, mask)
    assert (same[["changed", "router", "hidden"]].to_numpy() == 0).all()


@pytest.mark.parametrize("moved", ["routers", "others"])
def test_each_source_is_found_where_it_is_the_only_one(moved):
    before = make_model("qwen3_moe")
    after = _moved(before, routers=moved == "routers", others=moved == "others")
    ids, mask = batch(padding="left")
    table = volatility_sources(before, after, ids, mask)
    if moved == "others":  # the routers did not move: every change is the hidden states'
        assert (table["router"] == 0).all() and (table["hidden"] > 0).all()
        np.testing.assert_array_equal(table["hidden"], table["changed"])
    else:  # the first MoE layer reads states no router has touched yet; above it the routers' mixing moves them
        assert table["hidden"].iloc[0] == 0 and table["router"].iloc[0] == table["changed"].iloc[0] > 0
