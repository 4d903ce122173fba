"""``--base-refresh-every K`` (routing held within windows of K steps, issue 52's dose-response) and
``--measure-base-routes`` (``routing/base_rollout/*``: how far the rollout's routes are from the warm-started
base's)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from moestab.configs import ConfigError
from moestab.metrics import keys
from moestab.run_folder import RunFolder, schema
from moestab.run_folder.reader import load_metrics
from moestab.train import route_bases as rb
from moestab.train import train
from moestab.train.recipe import load_policy
from moestab.train.run_lifetime import TrainingError
from tests.support.train import tiny_config


def _metrics(run) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
            for line in (run / schema.METRICS_JSONL).read_text().splitlines()]


def test_the_copy_takes_the_policys_weights_at_each_windows_first_step_and_is_saved(tmp_path, monkeypatch):
    refreshed = []
    real = rb.RouteBases.refresh

    def spy(self, policy):
        refreshed.append({k: v.clone() for k, v in policy.state_dict().items()})
        real(self, policy)
        assert all(torch.equal(v, self.route.state_dict()[k]) for k, v in policy.state_dict().items())

    monkeypatch.setattr(rb.RouteBases, "refresh", spy)
    run = tmp_path / "run"
    result = train(tiny_config(run, tmp_path / "cache", routing_replay="base", base_refresh_every=2, steps=4,
                               save_every=10, eval_every=10))
    assert result.status == "finished"
    assert len(refreshed) == 2  # at the start of steps 1 and 3
    assert sorted(p.name for p in (run / schema.CHECKPOINTS_DIR).iterdir()) == [
        "step_000000", "step_000002", "step_000004"]  # the refreshes' weights (2) and the end (4), save_every 10
    saved = load_policy(str(run / schema.CHECKPOINTS_DIR / "step_000002"), torch.float32, torch.device("cpu"))
    saved = saved.state_dict()
    assert all(torch.equal(refreshed[1][k], v) for k, v in saved.items())  # step 3's copy is step 2's checkpoint
    assert not all(torch.equal(refreshed[0][k], v) for k, v in saved.items())  # and the policy moved in between


def test_a_copy_refreshed_every_step_routes_every_forward_as_pi_old(tmp_path):
    """K = 1: the rollout's routes are pi_old's free routes (the copy is pi_old), so nothing changes rollout -> pi_old;
    pi_new, after the updates, routes freely and moves away."""
    run = tmp_path / "run"
    train(tiny_config(run, tmp_path / "cache", routing_replay="base", base_refresh_every=1, steps=3))
    for line in _metrics(run):
        assert line[keys.ROUTING_CHANGED.format(pair="rollout_old_free")] == 0.0
    assert max(line[keys.ROUTING_CHANGED.format(pair="old_new")] for line in _metrics(run)) > 0


def test_a_resumed_run_restores_the_copy_from_its_last_refresh(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    settings = {"routing_replay": "base", "base_refresh_every": 2, "save_every": 10, "eval_every": 1}
    train(tiny_config(straight, tmp_path / "cache", steps=5, **settings))
    train(tiny_config(resumed, tmp_path / "cache", steps=3, **settings))  # ends at 3; step 4's copy is step 2's
    train(tiny_config(resumed, tmp_path / "cache", resume=str(resumed), steps=5, **settings))
    assert _metrics(resumed) == _metrics(straight)


def test_a_copy_refreshed_every_step_keeps_no_checkpoint_per_step_and_still_resumes(tmp_path):
    """K = 1 saves every step's weights for the copy; once a newer one is saved and no kept state needs it, it goes
    (issue 52's K = 1 runs kept 101 checkpoints, 7.7 GB each). The run keeps its save_every steps' and its last's
    weights and its two newest states, and a resume still restores the copy."""
    straight, run = tmp_path / "straight", tmp_path / "run"
    settings = {"routing_replay": "base", "base_refresh_every": 1, "save_every": 2, "eval_every": 1}
    train(tiny_config(straight, tmp_path / "cache", steps=7, **settings))
    train(tiny_config(run, tmp_path / "cache", steps=5, **settings))
    assert sorted(p.name for p in (run / schema.CHECKPOINTS_DIR).iterdir()) == [
        "step_000000", "step_000002", "step_000004", "step_000005"]
    assert sorted(p.name for p in (run / schema.STATE_DIR).iterdir()) == ["step_000004.pt", "step_000005.pt"]
    train(tiny_config(run, tmp_path / "cache", resume=str(run), steps=7, **settings))  # step 6's copy: step 5's
    assert _metrics(run) == _metrics(straight)


def test_a_resume_with_other_save_settings_deletes_no_checkpoint_saved_before(tmp_path):
    """save_every and steps may change on --resume: checkpoint 4, the last of the first run, is a refresh-only step
    by the resumed settings (K = 2, save_every 3, steps 8) but was saved as the end; it keeps its weights."""
    run = tmp_path / "run"
    settings = {"routing_replay": "base", "base_refresh_every": 2, "eval_every": 10}
    train(tiny_config(run, tmp_path / "cache", steps=4, save_every=10, **settings))
    train(tiny_config(run, tmp_path / "cache", resume=str(run), steps=8, save_every=3, **settings))
    saved = RunFolder(run).saved_checkpoints()
    assert 4 in saved and 6 in saved and 8 in saved  # 6: a save_every step of the resumed run
    assert 2 in saved  # saved before the resume: kept whole, never judged by the new settings


def test_a_resume_whose_refresh_checkpoint_is_gone_is_refused(tmp_path):
    run = tmp_path / "run"
    train(tiny_config(run, tmp_path / "cache", routing_replay="base", base_refresh_every=2, steps=3, save_every=10))
    shutil.rmtree(run / schema.CHECKPOINTS_DIR / "step_000002")
    with pytest.raises(TrainingError, match=r"step 2's weights.*step_000002.*missing"):
        train(tiny_config(run, tmp_path / "cache", resume=str(run), steps=5, routing_replay="base",
                          base_refresh_every=2, save_every=10))


def test_the_distance_from_the_base_is_the_rollout_to_pi_old_change_at_step_one(tmp_path):
    """At step 1 the policy is the base, so the base's routes are pi_old's free routes: the two keys agree. Later the
    policy moves away from the base; under routing-constant the rollout routes as the base (0 throughout)."""
    free, constant = tmp_path / "free", tmp_path / "constant"
    train(tiny_config(free, tmp_path / "cache", measure_base_routes=True, steps=3, lr=3e-3))
    train(tiny_config(constant, tmp_path / "cache", measure_base_routes=True, steps=3, lr=3e-3,
                      routing_replay="base"))
    m = load_metrics(free)
    first = m.iloc[0]
    assert first[keys.ROUTING_BASE_CHANGED] == pytest.approx(
        first[keys.ROUTING_CHANGED.format(pair="rollout_old_free")], abs=1e-12)
    assert m[keys.ROUTING_BASE_CHANGED].iloc[-1] > 0.01  # the policy's routing moved away from the base's
    layers = m[keys.ROUTING_BASE_CHANGED_BY_LAYER].iloc[-1]
    assert len(layers) == 4 and sum(layers) / 4 == pytest.approx(m[keys.ROUTING_BASE_CHANGED].iloc[-1])
    assert (load_metrics(constant)[keys.ROUTING_BASE_CHANGED] == 0).all()


@pytest.mark.parametrize(("overrides", "message"), [
    ({"base_refresh_every": 2}, "with routing_replay off there is none"),
    ({"base_refresh_every": -1, "routing_replay": "base"}, "base_refresh_every"),
    ({"measure_base_routes": True, "nproc": 2}, "one process"),
])
def test_settings_that_cannot_work_are_refused(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(tmp_path / "run", tmp_path / "cache", **overrides)


def test_a_base_changed_since_the_run_started_is_refused_on_resume(tmp_path):
    """Issue 55.3: the routing-constant control resumed on a rebuilt or edited base routed by another model from the
    resumed step on, without a word. run.json fingerprints the base; a resume on another base is refused before
    anything is written, and the same base resumes."""
    from safetensors.torch import load_file, save_file

    run = tmp_path / "run"
    settings = {"routing_replay": "base", "save_every": 10}
    train(tiny_config(run, tmp_path / "cache", steps=2, **settings))
    warm = json.loads((run / schema.RUN_JSON).read_text())["warm_start"]
    assert len(warm["fingerprint"]) == 64
    weights = next(p for p in (tmp_path / "cache").rglob("model.safetensors") if str(p.parent) == warm["path"])
    original = weights.read_bytes()
    tensors = load_file(str(weights))
    router = next(name for name in tensors if name.endswith("mlp.gate.weight"))
    tensors[router] = torch.flip(tensors[router], dims=[0])  # the experts' router rows swapped
    save_file(tensors, str(weights), metadata={"format": "pt"})
    before = (run / schema.RUN_JSON).read_bytes()
    with pytest.raises(TrainingError, match=r"is not the one this run started from .*--routing-replay base"):
        train(tiny_config(run, tmp_path / "cache", resume=str(run), steps=3, **settings))
    assert (run / schema.RUN_JSON).read_bytes() == before
    weights.write_bytes(original)
    assert train(tiny_config(run, tmp_path / "cache", resume=str(run), steps=3, **settings)).last_step == 3
