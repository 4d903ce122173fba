"""What the notebooks' corrected analyses read from the probes: saturation of every checkpoint pair, and a step
probe whose rollout engine samples in bf16 (the rollout->trainer gap of claim 4)."""

from __future__ import annotations

import numpy as np
import pytest

from moestab.models import EmbeddedModelSpec, build_embedded_policy, save_policy
from moestab.probes import ProbeError, load_suite
from moestab.probes.checkpoints import Checkpoint
from moestab.probes.depth import DEPTH_COLUMNS, depth
from moestab.probes.one_step import StepRecipe, one_step
from moestab.probes.saturation import saturation, saturation_pairs
from moestab.tasks import task_from_spec
from tests.support.train import TASK


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> list[Checkpoint]:
    root = tmp_path_factory.mktemp("pairs")
    out = []
    for seed in (0, 1, 2):  # three different routings of one architecture
        model, tokenizer = build_embedded_policy(EmbeddedModelSpec(seed=seed, num_layers=2, hidden_size=32))
        out.append(Checkpoint(f"run@{10 * seed}", save_policy(model, tokenizer, root / f"seed{seed}")))
    return out


def test_saturation_pairs_ending_at_the_last_are_saturation_against_it(checkpoints):
    texts = load_suite("task:arithmetic", 8).texts
    pairs = saturation_pairs(checkpoints, texts, [0, 10, 20])
    assert sorted(set(zip(pairs.step_a, pairs.step_b, strict=True))) == [(0, 10), (0, 20), (10, 20)]
    against_last = saturation(checkpoints, texts)  # reference: the last checkpoint, itself included (1.0)
    for step, label in ((0, "run@0"), (10, "run@10")):
        ours = pairs[(pairs.step_a == step) & (pairs.step_b == 20)].reset_index(drop=True)
        theirs = against_last[against_last.checkpoint == label].reset_index(drop=True)
        np.testing.assert_array_equal(ours.saturation, theirs.saturation)
        np.testing.assert_array_equal(ours.saturation_top1, theirs.saturation_top1)
        np.testing.assert_array_equal(ours.layer, theirs.layer)
    assert pairs.saturation.lt(1).all()  # differently seeded routers: not trivially 1
    with pytest.raises(ProbeError, match="one step per checkpoint"):
        saturation_pairs(checkpoints, texts, [0, 10])


def test_a_bf16_rollout_engine_opens_the_rollout_trainer_gap():
    task = task_from_spec(TASK)
    steps = {}
    for dtype in (None, "bfloat16"):
        model, tokenizer = build_embedded_policy(EmbeddedModelSpec(num_layers=2, seed=0))
        recipe = StepRecipe(task=task, prompts=4, group_size=4, rollout_dtype=dtype)
        steps[dtype] = one_step(model, tokenizer, recipe, lr=1e-3, minibatches=1)
    # The same fp32 kernels route and score identically (k3 at float rounding); a bf16 engine does not.
    assert steps[None]["mismatch/rollout_old/k3"] < 1e-9
    assert steps["bfloat16"]["mismatch/rollout_old/k3"] > 1e-6
    assert steps[None]["routing/rollout_old/router_flip"] == 0.0


def test_depth_reports_the_rollout_trainer_flips_and_refuses_a_bad_rollout_dtype():
    recipe = StepRecipe(task=task_from_spec(TASK), prompts=4, group_size=4, rollout_dtype="bfloat16")
    table = depth(recipe, layers=[1, 2], lr=1e-3)["depth"]
    assert {"rollout_old_router_flip", "rollout_old_token_flip"} <= set(DEPTH_COLUMNS) <= set(table.columns)
    assert table.rollout_old_router_flip.between(0, 1).all()
    # One layer: a token flips exactly when its router does (two divisions of the same counts: equal to rounding).
    one = table.set_index("depth").loc[1]
    assert one.rollout_old_token_flip == pytest.approx(one.rollout_old_router_flip, rel=1e-12)
    assert one.rollout_old_router_flip > 0  # the fresh policy's near-tied routers: bf16 flips some
    with pytest.raises(ProbeError, match="rollout_dtype"):
        StepRecipe(task=task_from_spec(TASK), rollout_dtype="int8").step_settings(1)
