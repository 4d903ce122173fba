"""R3 uses the rollout engine's routes for pi_old; R2 the trainer's. Checked with a rollout engine
whose routes deliberately differ from the trainer's (as a real inference engine's can)."""

import random
from dataclasses import replace

import pytest
import torch

from moestab import rl
from moestab.models import build_embedded_policy
from moestab.run_folder.schema import GATE_REPLAY_MODES
from moestab.tasks import task_from_spec
from moestab.train.forward import policy_forward
from moestab.train.rollout import HFRolloutEngine
from moestab.train.step import run_step
from moestab.train.step_settings import StepSettings
from tests.support.train import TASK, one_grpo_step


class ShiftedRoutesEngine(HFRolloutEngine):
    """HF generate, but reports expert e+1 (mod E) wherever it used e: a maximal rollout/trainer mismatch."""

    def generate(self, prompts, **kwargs):
        batch = super().generate(prompts, **kwargs)
        idx = batch.routes.indices
        shifted = torch.where(idx >= 0, (idx + 1) % batch.routes.num_experts, idx)
        return replace(batch, routes=replace(batch.routes, indices=shifted))


def one_step(replay: str):
    before, _, metrics, t = one_grpo_step(replay, ShiftedRoutesEngine)
    return before, metrics, t


def test_r3_old_policy_forward_replays_rollout_routes():
    before, metrics, t = one_step("rollout")
    batch = t.batch
    with torch.no_grad():
        replayed = policy_forward(before, batch, temperature=1.0, replay=batch.routes, record=False).logp
        free = policy_forward(before, batch, temperature=1.0, record=False).logp
    mask = batch.response_mask
    assert torch.allclose(t.logp_old[mask], replayed[mask], atol=1e-6)
    assert not torch.allclose(t.logp_old[mask], free[mask], atol=1e-3)  # the shift changes pi_old
    assert torch.allclose(t.logp_old_free[mask], free[mask], atol=1e-6)  # free routes still recorded
    real = batch.attention_mask.bool()
    assert torch.equal(t.routes_update[real], batch.routes.indices[real])  # updates replay rollout routes
    assert torch.equal(t.routes_old[real], batch.routes.indices[real])  # ... which produced logp_old too
    # rollout->trainer routing mismatch is measured; expected value by Python sets (a shifted set
    # {e, e+1} still overlaps the original in e+1, so the changed fraction is below 1).
    resp = batch.response_mask
    old = t.routes_old_free.indices[:, batch.prompt_len - 1 :][resp].tolist()  # [tokens][layers][k]
    roll = batch.routes.indices[:, batch.prompt_len - 1 :][resp].tolist()
    pairs = [(a, b) for ta, tb in zip(old, roll, strict=True) for a, b in zip(ta, tb, strict=True)]
    overlaps = [len(set(a) & set(b)) / len(a) for a, b in pairs]
    expected = 1 - sum(overlaps) / len(overlaps)
    assert 0.5 < expected < 1.0
    assert metrics["routing/rollout_old_free/changed"] == pytest.approx(expected, abs=1e-12)
    assert metrics["routing/rollout_old/changed"] == 0.0  # the ratio's pi_old used the rollout's routes


def test_r2_updates_replay_the_trainers_old_routes_not_the_rollouts():
    _, metrics, t = one_step("old")
    real = t.batch.attention_mask.bool()
    assert torch.equal(t.routes_update[real], t.routes_old_free.indices[real])
    assert torch.equal(t.routes_old[real], t.routes_old_free.indices[real])  # R2's pi_old routes freely
    assert not torch.equal(t.routes_update[real], t.batch.routes.indices[real])
    assert torch.equal(t.logp_old, t.logp_old_free)  # R2 computes pi_old with free routing
    assert metrics["routing/update_old/changed_by_minibatch"] is None  # replay hides update-time drift


def test_minibatches_that_do_not_divide_the_batch_are_refused_before_the_rollout():
    from moestab.train.step_settings import minibatch_rows

    with pytest.raises(ValueError, match=r"minibatches=5 does not divide the rollout batch of 32 sequences; valid: "
                                         r"1, 2, 4, 8, 16, 32"):
        minibatch_rows(32, 5, torch.Generator())
    rows = minibatch_rows(10, 5, torch.Generator().manual_seed(0))
    assert [len(r) for r in rows] == [2] * 5 and sorted(torch.cat(rows).tolist()) == list(range(10))


class BatchShapeNoise:
    """Logits that depend on the batch size, as GPU kernels' rounding can: a forward hook adds
    ``1e-4 * batch * v / V`` to the logit of token ``v`` (a constant shift would cancel in the softmax)."""

    def __init__(self, model):
        self.handle = model.register_forward_hook(self.hook)

    @staticmethod
    def hook(module, args, output):
        logits = output.logits  # [batch, seq, V]
        ramp = torch.arange(logits.shape[-1], dtype=logits.dtype) / logits.shape[-1]  # [V]
        output.logits = logits + 1e-4 * logits.shape[0] * ramp
        return output


@pytest.mark.parametrize("replay", ["off", "old", "rollout", "rollout-gates"])
def test_without_an_update_pi_new_equals_pi_old_exactly_whatever_the_batch_shape(replay):
    # lr = 0: the updates change nothing, so old -> new must be exactly 0, even when the model's numerics
    # depend on the batch shape (pi_new used to run in one piece while pi_old ran in the minibatch chunks).
    torch.manual_seed(0)
    model, tokenizer = build_embedded_policy()
    task = task_from_spec(TASK)
    settings = StepSettings(
        preset=rl.get_preset("grpo"), replay=replay,
        minibatches=2, group_size=4, temperature=1.0, max_new_tokens=4, max_grad_norm=1.0,
    )
    noise = BatchShapeNoise(model)
    try:
        metrics, t = run_step(
            model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=0.0),
            engine=HFRolloutEngine(model, tokenizer, gates=replay in GATE_REPLAY_MODES),
            task=task, settings=settings, examples=task.sample(4, random.Random(0)),
            generator=torch.Generator().manual_seed(0),
        )
    finally:
        noise.handle.remove()
    mask = t.batch.response_mask
    assert torch.equal(t.logp_new[mask], t.logp_old_free[mask])
    assert metrics["routing/old_new/changed"] == 0.0 and metrics["routing/old_new/token_flip"] == 0.0
    assert torch.equal(t.logp_update[mask], t.logp_old[mask])  # every minibatch's ratio is exactly 1


def test_every_input_an_objective_declares_has_a_provider_in_the_step():
    # A new objective declares its inputs (registry / aggregation / kl); the step must know how to fill each.
    from dataclasses import replace

    from moestab.rl.aggregation import AGGREGATION_INPUTS
    from moestab.train.step_update import RUNTIME_INPUTS

    declared = set()
    for preset in rl.PRESETS.values():
        declared |= set(replace(preset, kl_coef=0.1).runtime_inputs)  # with a KL penalty: ref_logp too
    declared |= {name for names in AGGREGATION_INPUTS.values() for name in names}
    assert declared == set(RUNTIME_INPUTS)
    assert {"norm_constant", "ref_logp", "router_logp_old", "router_logp_new"} == declared


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"algo": "grpo", "gamma_min": 0.5}, "gamma_min applies to algo rspo only"),
        ({"algo": "rspo", "gamma_min": 1.5}, r"gamma_min must be a number in \[0, 1\], got 1.5"),
    ],
)
def test_gamma_min_has_one_default_and_one_valid_range(tmp_path, overrides, message):
    from moestab.configs import ConfigError
    from tests.support.train import tiny_config

    with pytest.raises(ConfigError, match=message):
        tiny_config(tmp_path / "run", tmp_path / "cache", **overrides)
    config = tiny_config(tmp_path / "run", tmp_path / "cache", algo="rspo", gamma_min=0.0)  # the loss's own range
    assert config.resolved_preset().gamma_min == 0.0
    assert tiny_config(tmp_path / "r", tmp_path / "c", algo="rspo").resolved_preset().gamma_min == 0.1  # preset's


@pytest.mark.parametrize("replay", ["rollout", "rollout-gates"])
def test_r3_old_logprobs_equal_a_replayed_forward_and_the_first_minibatchs_come_from_its_update(replay):
    gates = replay in GATE_REPLAY_MODES
    before, _, _, t = one_grpo_step(replay, lambda model, tok: HFRolloutEngine(model, tok, gates=gates))
    batch = t.batch
    for m in range(2):  # each minibatch bit for bit as a no-grad forward of the starting weights on its rows
        rows = torch.nonzero(t.minibatch == m).flatten()
        with torch.no_grad():
            expected = policy_forward(before, batch.select(rows), temperature=1.0, replay=batch.routes.select(rows),
                                      force_gates=gates, record=False).logp
        assert torch.equal(t.logp_old[rows], expected), m
    # The first minibatch's no-grad forward is skipped: its update forward (same weights, rows and routes) supplies
    # pi_old's log-probs, so its ratio is exactly 1.
    first = t.minibatch == 0
    assert torch.equal(t.logp_update[first], t.logp_old[first])
    assert not torch.equal(t.logp_update[~first], t.logp_old[~first])  # the second update ran on new weights


def test_score_threshold_replay_runs_pi_olds_replayed_forward_on_every_minibatch():
    # Shifted rollout routes: the router's own scores refill many replayed slots, already in the first update.
    before, _, _, t = one_grpo_step("rollout", ShiftedRoutesEngine, replay_score_ratio=0.9)
    batch = t.batch
    rows = torch.nonzero(t.minibatch == 0).flatten()
    with torch.no_grad():
        expected = policy_forward(before, batch.select(rows), temperature=1.0, replay=batch.routes.select(rows),
                                  record=False).logp
    assert torch.equal(t.logp_old[rows], expected)  # plain replay ...
    assert not torch.equal(t.logp_update[rows], expected)  # ... not the first update's score-filtered one
