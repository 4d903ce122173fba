"""The routing-constant control (``--routing-replay base``): the rollout, pi_old, the updates and the evaluation all
use the experts the frozen base chooses for the same tokens, while the policy's own (free) routing is still measured.
"""

import copy

import pytest
import torch

from moestab.configs import ConfigError
from moestab.models import build_embedded_policy
from moestab.routing import RoutingRecorder
from moestab.routing.base_routing import BaseRouting
from moestab.run_folder.run_info import read_run_info
from moestab.train import train
from moestab.train.forward import policy_forward
from moestab.train.rollout import BaseRoutedEngine, HFRolloutEngine
from tests.support.train import one_grpo_step, tiny_config


def _base() -> torch.nn.Module:
    """A frozen base of the embedded architecture whose routes differ from the step's policy's (its weights moved)."""
    model, _ = build_embedded_policy()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * p.std().nan_to_num() * torch.randn(p.shape, generator=g))
    return model.eval().requires_grad_(False)


def test_one_step_replays_the_bases_routes_everywhere_and_measures_the_policys_own():
    base = _base()
    frozen = copy.deepcopy(base.state_dict())
    before, _, metrics, t = one_grpo_step("base", lambda m, tok: BaseRoutedEngine(HFRolloutEngine(m, tok), base))
    batch = t.batch
    real = batch.attention_mask.bool()
    with RoutingRecorder(base) as rec, torch.no_grad():
        policy_forward(base, batch, temperature=1.0, record=False)
    # The rollout's routes are the base's (KV-cached generation vs the base's full forward: no decision flips here).
    assert torch.equal(batch.routes.indices[real].sort(-1).values, rec.routes.indices[real].sort(-1).values)
    assert torch.equal(t.routes_old[real], batch.routes.indices[real])
    assert torch.equal(t.routes_update[real], batch.routes.indices[real])
    # pi_old is the policy before the step routed as the base: it reproduces the rollout's log-probs.
    with torch.no_grad():
        old = policy_forward(before, batch, temperature=1.0, replay=batch.routes, record=False).logp
    mask = batch.response_mask
    torch.testing.assert_close(t.logp_old[mask], old[mask], rtol=0, atol=1e-5)
    torch.testing.assert_close(batch.logp_rollout[mask], old[mask], rtol=0, atol=1e-4)
    assert metrics["routing/rollout_old/changed"] == 0.0
    # The policy's own routing is still measured, and it is not the base's.
    assert metrics["routing/rollout_old_free/changed"] > 0.1
    assert all(torch.equal(v, base.state_dict()[k]) for k, v in frozen.items())  # the base never moves


def test_a_run_evaluates_routed_as_the_base_and_records_the_mode(tmp_path, monkeypatch):
    import moestab.train.loop as loop

    routed_evals = []
    real_eval = loop.greedy_accuracy

    def spy(model, *args, **kwargs):
        hooks = list(model._forward_pre_hooks.values())
        routed_evals.append(any(isinstance(getattr(h, "__self__", None), BaseRouting) for h in hooks))
        return real_eval(model, *args, **kwargs)

    monkeypatch.setattr(loop, "greedy_accuracy", spy)
    result = train(tiny_config(tmp_path / "run", tmp_path / "cache", routing_replay="base"))
    assert result.status == "finished" and result.last_step == 2
    assert routed_evals == [True, True, True]  # start, step 1, step 2
    assert read_run_info(result.run_dir).replay_label == "constant"


@pytest.mark.parametrize(("overrides", "message"), [
    ({"rollout_engine": "vllm"}, "rollout_engine vllm"),
    ({"nproc": 2, "prompts_per_step": 4, "eval_size": 8}, "nproc 2"),
    ({"replay_score_ratio": 0.5}, "needs routing_replay old or rollout"),
])
def test_settings_the_control_cannot_honour_are_refused(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(tmp_path / "run", tmp_path / "cache", routing_replay="base", **overrides)
