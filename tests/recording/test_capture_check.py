"""A broken capture at the other entry points: ``route_diagnostics`` reports ``routes/integrity/*``,
``DiagnosticsRun`` warns once or refuses before writing the step, trackers get the compact summary, and every
setting of the policy refuses an unknown value."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moestab.configs import ConfigError
from moestab.metrics import keys
from moestab.metrics.integrity import BrokenCaptureError
from moestab.recording.diagnostics import DiagnosticsRun, route_diagnostics
from moestab.recording.trackers import scalars
from moestab.run_folder.run_info import read_run_info
from tests.support.train import tiny_config

E, K, LAYERS = 16, 2, 3


def _routes(seed: int = 0, tokens: int = 120) -> np.ndarray:
    gen = np.random.default_rng(seed)
    return np.stack([[gen.permutation(E)[:K] for _ in range(LAYERS)] for _ in range(tokens)]).astype(np.int16)


def test_diagnostics_report_the_rollout_sides_integrity_against_the_trainers():
    trainer = _routes()
    right = route_diagnostics(trainer.copy(), trainer, num_experts=E)
    assert right[keys.INTEGRITY_FAILED] == 0 and right[keys.INTEGRITY_LIFT] == 1.0
    late = route_diagnostics(np.roll(trainer, 1, axis=0), trainer, num_experts=E)
    assert late[keys.INTEGRITY_FAILED] > 0 and late[keys.INTEGRITY_DISAGREEING] > 0.5


@pytest.mark.parametrize("policy", ["warn", "refuse"])
def test_a_diagnostics_run_warns_once_or_refuses_before_writing(tmp_path, policy):
    trainer = _routes()
    run = DiagnosticsRun(tmp_path / "run", trainer="verl", layers=range(LAYERS), num_experts=E, top_k=K,
                         replay="rollout", route_integrity=policy)
    late = route_diagnostics(np.roll(trainer, 1, axis=0), trainer)  # no num_experts: the run's model gives chance
    with run:
        run.log(1, route_diagnostics(trainer.copy(), trainer))
        if policy == "refuse":
            with pytest.raises(BrokenCaptureError, match=r"step 2: .*(layer \d+|every layer): "):
                run.log(2, late)
        else:
            run.log(2, late)
            run.log(3, late)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    warnings = [w for w in read_run_info(tmp_path / "run").warnings if w.startswith("route integrity:")]
    if policy == "refuse":
        assert [line[keys.STEP] for line in lines] == [1] and not warnings
    else:
        assert [line[keys.INTEGRITY_FAILED] > 0 for line in lines] == [False, True, True]
        assert len(warnings) == 1 and "step 2:" in warnings[0]


def test_trackers_get_the_compact_summary_and_metrics_jsonl_the_layers():
    trainer = _routes()
    metrics = route_diagnostics(trainer.copy(), trainer, num_experts=E)
    sent = scalars(metrics)
    assert "moestab/" + keys.INTEGRITY_LIFT in sent and "moestab/" + keys.INTEGRITY_FAILED in sent
    assert not any(k.startswith("moestab/" + detail) for detail in keys.INTEGRITY_LAYER_DETAIL for k in sent)
    assert len(metrics[keys.INTEGRITY_COVERAGE_BY_LAYER]) == LAYERS


def test_an_unknown_policy_is_refused_everywhere(tmp_path):
    from moestab.integrations.trl.settings import RecordSettings

    with pytest.raises(ValueError, match="route_integrity must be one of"):
        DiagnosticsRun(tmp_path / "run", trainer="x", layers=[0], num_experts=E, top_k=K, route_integrity="ignore")
    with pytest.raises(ValueError, match="route_integrity must be one of"):
        RecordSettings(run_dir=tmp_path / "trl", route_integrity="ignore")
    with pytest.raises(ConfigError, match="route_integrity"):
        tiny_config(tmp_path / "run", tmp_path / "cache", route_integrity="ignore")
    assert not (tmp_path / "run").exists()


def test_hostile_expert_counts_and_a_tracker_named_twice_are_refused(tmp_path):
    """Issue 55.4 and 55.5: negative expert counts are not a load; the same tracker twice would log every scalar
    twice."""
    trainer = _routes()
    counts = np.ones((LAYERS, E), np.int64)
    counts[1, 3] = -5
    with pytest.raises(ValueError, match=r"expert_counts\[1, 3\] is -5"):
        route_diagnostics(trainer, trainer, expert_counts=counts)
    assert keys.EXPERTS_MAX_VIO in route_diagnostics(trainer, trainer, expert_counts=np.abs(counts))
    with pytest.raises(ConfigError, match="tensorboard named twice"):
        tiny_config(tmp_path / "run", tmp_path / "cache", report_to=("tensorboard", "tensorboard"))
    with pytest.raises(ConfigError, match="named twice"):
        DiagnosticsRun(tmp_path / "d", trainer="x", layers=[0], num_experts=E, top_k=K,
                       report_to=("wandb", "wandb"))
    assert not (tmp_path / "run").exists() and not (tmp_path / "d").exists()
