"""TRR (``--routing-replay rollout-gates``, prime-rl's "Total Router Recall"): pi_old and the updates replay the
rollout engine's experts *and* gate weights as given, so the router is frozen in the updates.

Checked with a rollout engine whose gates differ from the family's (uniform 1/k), as an inference engine's
kernels can: under TRR the trainer's pi_old reproduces the rollout's log-probs, under R3 (gates recomputed
from the trainer's router) it does not.
"""

import json
import typing
from contextlib import contextmanager

import pytest
import torch
from safetensors.torch import load_file

from moestab.configs import ConfigError
from moestab.routing import RoutesMismatchError, find_routers
from moestab.run_folder import schema
from moestab.run_folder.run_info import read_run_info
from moestab.train import TrainConfig, train
from moestab.train.rollout import HFRolloutEngine
from tests.support.train import one_grpo_step, tiny_config


@contextmanager
def uniform_gates(model):
    """Every router hands its chosen experts 1/k each instead of the family's gates (the model computes with
    them, and a ``RoutingRecorder`` entered later records them)."""
    handles = []
    for site in find_routers(model):

        def hook(module, args, output):
            logits, gates, chosen = output  # [N, E], [N, k], [N, k]
            return logits, torch.full_like(gates, 1.0 / chosen.shape[-1]), chosen

        handles.append(site.module.register_forward_hook(hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class UniformGatesEngine(HFRolloutEngine):
    """HF generate whose routers weight their top-k experts uniformly."""

    def generate(self, prompts, **kwargs):
        with uniform_gates(self.model):
            return super().generate(prompts, **kwargs)


def one_step(replay: str, *, gates: bool = True):
    return one_grpo_step(replay, lambda model, tokenizer: UniformGatesEngine(model, tokenizer, gates=gates))


def router_params(model) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if any(n.startswith(s.name + ".") for s in find_routers(model))}


@pytest.fixture(scope="module")
def trr_and_r3():
    return one_step("rollout-gates"), one_step("rollout")


def test_trr_replays_the_rollouts_routes_and_gates(trr_and_r3):
    (_, _, metrics, t), (_, _, r3_metrics, r3) = trr_and_r3
    batch, mask = t.batch, t.batch.response_mask
    real = batch.attention_mask.bool()
    assert batch.routes.gates is not None  # the engine recorded them
    assert torch.equal(t.routes_old[real], batch.routes.indices[real])
    assert torch.equal(t.routes_update[real], batch.routes.indices[real])
    assert metrics["routing/rollout_old/changed"] == 0.0  # "as used": no rollout -> trainer routing mismatch
    # The ratio's pi_old is the rollout's forward (KV-cached decoding vs one full forward: rounding only) ...
    assert (t.logp_old - batch.logp_rollout)[mask].abs().max() < 1e-5
    # ... while R3, with the same uniform-gate engine, recomputes the family's gates: a real gap remains.
    # (measured: max |d| 5e-7 vs 7e-3, k3 4e-14 vs 3e-6)
    assert (r3.logp_old - r3.batch.logp_rollout)[r3.batch.response_mask].abs().max() > 1e-3
    assert metrics["mismatch/rollout_old/k3"] < 1e-11 < 1e-7 < r3_metrics["mismatch/rollout_old/k3"]
    # The free pi_old is still measured: the trainer's own gates differ from the rollout's.
    assert metrics["mismatch/rollout_old_free/k3"] > 1e-7


def test_trr_freezes_the_router_and_r3_does_not(trr_and_r3):
    (before, model, _, _), (r3_before, r3_model, _, _) = trr_and_r3
    frozen, initial = router_params(model), router_params(before)
    assert frozen and all(torch.equal(frozen[n], initial[n]) for n in frozen)  # no gradient, no AdamW step
    others = [n for n, _ in model.named_parameters() if n not in frozen and ".experts." in n]
    assert any(not torch.equal(model.get_parameter(n), before.get_parameter(n)) for n in others)  # it did train
    moved, start = router_params(r3_model), router_params(r3_before)
    assert any(not torch.equal(moved[n], start[n]) for n in moved)  # R3: the router learns


def test_trr_without_recorded_gates_is_refused():
    with pytest.raises(RoutesMismatchError, match="these routes have none"):
        one_step("rollout-gates", gates=False)


def test_rollout_gates_trains_end_to_end(tmp_path, cache_dir):
    result = train(tiny_config(tmp_path / "run", cache_dir, steps=2, routing_replay="rollout-gates"),
                   log=lambda s: None)
    assert result.status == "finished"
    info = read_run_info(tmp_path / "run")
    assert (info.replay, info.replay_label, info.last_step) == ("rollout-gates", "TRR", 2)
    lines = [json.loads(x) for x in (tmp_path / "run" / schema.METRICS_JSONL).read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert all(line["routing/rollout_old/changed"] == 0.0 for line in lines)  # as used: the rollout's routes
    assert all(line["routing/update_old/changed_by_minibatch"] is None for line in lines)
    # The router never moved over the run; the rest of the policy did.
    first = load_file(tmp_path / "run" / schema.checkpoint_dir(0) / "model.safetensors")
    last = load_file(tmp_path / "run" / schema.checkpoint_dir(2) / "model.safetensors")
    routers = [k for k in first if k.endswith(".mlp.gate.weight")]
    assert routers and all(torch.equal(first[k], last[k]) for k in routers)
    assert any(not torch.equal(first[k], last[k]) for k in first if k not in routers)


def test_replay_modes_agree_across_their_owners(tmp_path):
    literal = typing.get_args(typing.get_type_hints(TrainConfig)["routing_replay"])
    assert literal == schema.REPLAY_MODES
    assert set(schema.REPLAY_LABELS) == set(schema.REPLAY_ROUTES) == set(schema.REPLAY_MODES)
    assert set(schema.GATE_REPLAY_MODES) <= {m for m, source in schema.REPLAY_ROUTES.items() if source}
    with pytest.raises(ConfigError, match="freezes the router in the updates"):
        tiny_config(tmp_path / "run", tmp_path / "cache", routing_replay="rollout-gates", router_aux_loss_coef=0.01)
