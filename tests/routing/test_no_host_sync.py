"""No host synchronisation inside moestab's hooks (issue 38), checked on a CPU.

The hooks run on every router of every forward; a value read on the host there (``.item()``, ``bool(t)``, a copy to
the CPU) or a data-dependent shape (``nonzero``, a boolean mask) would make each forward wait for the GPU.
``moestab.routing.host_sync`` sees those calls on any device; bench/gpu_check.py runs the same cases on CUDA under
``torch.cuda.set_sync_debug_mode("error")``. The planted cases show the check can fail: a recorder subclass whose
router hook also makes one such call, the call named at its line.
"""

from __future__ import annotations

import inspect
import re

import pytest
import torch

from moestab.routing import RoutesMismatchError, RoutingRecorder, RoutingReplay
from moestab.routing.host_sync import describe, find_host_syncs
from tests.support.routing import batch, make_model


def _forward(model, ids, mask, *, grad: bool = False):
    def run():
        with torch.set_grad_enabled(grad):
            out = model(input_ids=ids, attention_mask=mask)
        if grad:
            out.logits.sum().backward()

    return run


@pytest.fixture
def recorded(family):
    """A float32 model of ``family``, a left-padded batch and its routes with gate weights."""
    model = make_model(family, dtype=torch.float32)
    ids, mask = batch()
    with torch.no_grad(), RoutingRecorder(model, gates=True) as rec:
        model(input_ids=ids, attention_mask=mask)
    return model, ids, mask, rec.routes


def test_the_recorder_does_not_sync_in_a_forward_or_under_generate(recorded):
    model, ids, mask, _ = recorded
    with RoutingRecorder(model, gates=True, slot_scores=True, router_logprobs=True):
        assert describe(find_host_syncs(model, _forward(model, ids, mask, grad=True))) == "none"
    with torch.no_grad(), RoutingRecorder(model, sequence_fraction=0.5, gates=True) as rec:
        syncs = find_host_syncs(model, lambda: model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3,
                                                              do_sample=False, pad_token_id=0, use_cache=True))
    assert describe(syncs) == "none"
    assert rec.routes.seq_len == ids.shape[1] + 2  # the decode steps were recorded: the hooks ran


@pytest.mark.parametrize("how", [{}, {"force_gates": True}, {"score_ratio": 0.5}], ids=["R3", "TRR", "threshold"])
def test_replay_does_not_sync(recorded, how):
    model, ids, mask, routes = recorded
    with RoutingReplay(model, routes, **how), RoutingRecorder(model) as rec:  # replay under a recorder, as R3 runs
        syncs = find_host_syncs(model, _forward(model, ids, mask, grad=True))
    assert describe(syncs) == "none"
    real = mask.bool()
    assert torch.equal(rec.routes.indices[real], routes.indices[real])  # replayed: the hooks ran


def test_a_missing_route_is_raised_when_replay_exits_without_a_sync_in_the_forward(recorded):
    model, ids, mask, routes = recorded
    unpadded = torch.ones_like(mask)  # row 0 was left-padded: its routes are -1 there
    replay = RoutingReplay(model, routes)
    with pytest.raises(RoutesMismatchError, match=r"first at \[batch=0, seq=0\]"), replay:
        assert find_host_syncs(model, _forward(model, ids, unpadded)) == []
    with pytest.raises(ValueError, match="body"), replay:  # the body's own error is not replaced by the check
        model(input_ids=ids, attention_mask=unpadded)
        raise ValueError("body")


class PlantedSync(RoutingRecorder):
    """A recorder whose router hook also makes one host synchronisation: the bug the check exists for."""

    def __init__(self, model, plant):
        super().__init__(model, margin=False, entropy=False, verify=False)
        self.plant = plant
        self.seen: list[object] = []

    def _router_hook(self, ordinal, site):
        hook = super()._router_hook(ordinal, site)

        def planted(module, args, output):
            hook(module, args, output)
            self.seen.append(self.plant(self._frame.chosen[ordinal]))  # [N, top_k] expert ids

        return planted


PLANTS = {
    "item": (lambda chosen: chosen.max().item(), "Tensor.item, aten._local_scalar_dense"),
    "bool": (lambda chosen: bool((chosen < 0).any()), "Tensor.__bool__, aten._local_scalar_dense"),
    "tolist": (lambda chosen: chosen[0].tolist(), "Tensor.tolist"),
    "cpu": (lambda chosen: chosen.cpu(), "Tensor.cpu"),
    "to cpu": (lambda chosen: chosen.to("cpu"), "Tensor.to"),
    "nonzero": (lambda chosen: (chosen == 0).nonzero(), "aten.nonzero"),
    "mask": (lambda chosen: chosen[chosen > 0], "aten.index (boolean mask)"),
    "unique": (lambda chosen: chosen.unique(), "aten._unique2"),
}


def _at(plant) -> str:
    """How the check names the place of a planted call: this file and the plant's line."""
    return rf" at \S*test_no_host_sync\.py:{inspect.getsourcelines(plant)[1]}: "


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_a_sync_planted_in_a_hook_is_caught_and_named(name):
    plant, ops = PLANTS[name]
    model = make_model("qwen3_moe", dtype=torch.float32)
    ids, mask = batch()
    with torch.no_grad(), PlantedSync(model, plant) as rec:
        syncs = find_host_syncs(model, _forward(model, ids, mask))
    assert len(rec.seen) == 2  # both routers ran the planted line
    assert re.match(re.escape(ops) + _at(plant), describe(syncs)), describe(syncs)
    # one place, called from both routers' hooks: the same op(s) per router call
    assert len(syncs) == 2 * len(ops.split(", "))


def test_only_the_hooks_are_watched():
    """The model's own code may sync (transformers' expert loop does); the detector is off outside the hooks."""
    model = make_model("qwen3_moe", dtype=torch.float32)
    ids, mask = batch()

    def syncing_forward():
        model(input_ids=ids, attention_mask=mask)
        return mask.sum().item()  # outside any hook

    plant = PLANTS["item"][0]
    with torch.no_grad(), PlantedSync(model, plant):
        inside = find_host_syncs(model, syncing_forward)
    assert len(inside) == 4 and all(re.match(_at(plant), f" at {s.where}") for s in inside)  # 2 routers x 2 ops
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())  # all removed
