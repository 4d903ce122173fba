"""The verl recipe (moestab.integrations.verl.route_metrics): rollout routes vs the actor's own in one batch, the
numbers checked against the diagnostics call on the routes picked out by hand; on verl's documented layout always, and
on a real ``DataProto`` where verl installs."""

from __future__ import annotations

import importlib.util
import json
import warnings

import numpy as np
import pytest
import torch

from moestab.integrations.verl import MissingLogProbsWarning, route_metrics
from moestab.recording.diagnostics import DiagnosticsRun, route_diagnostics
from moestab.routes_in import PayloadError
from moestab.run_folder import schema
from tests.support.route_payloads import EXPERTS, RESPONSES, TOP_K, known_rows, verl_batch


def batch_with_actor_routes() -> tuple[dict[str, torch.Tensor], np.ndarray, np.ndarray]:
    """A verl batch whose actor routes differ from the rollout's in one decision, and the two sides' response-token
    routes picked out by hand (sequence 0: tokens at columns 2, 3 = its positions 2, 3; sequence 1: columns 2..4 =
    its positions 1..3)."""
    rows = known_rows(2)
    actor = [seq.copy() for seq in rows]
    # sequence 1, position 2, layer 1: the other two of the 4 experts, a disjoint set
    actor[1][2, 1] = [e for e in range(EXPERTS) if e not in actor[1][2, 1]]
    batch = verl_batch(rows)
    batch["actor_routed_experts"] = verl_batch(actor)["routed_experts"]
    picked = [rows[0][[2, 3]], rows[1][[1, 2, 3]]]
    picked_actor = [actor[0][[2, 3]], actor[1][[1, 2, 3]]]
    return batch, np.concatenate(picked), np.concatenate(picked_actor)


def check(batch, rollout, actor, given=None) -> None:
    """``route_metrics(given or batch)`` against the diagnostics of the hand-picked routes and log-probs."""
    out = route_metrics(batch if given is None else given, num_experts=EXPERTS, per_layer=True)
    logp_r = np.concatenate([batch["rollout_log_probs"][i, :r].numpy() for i, r in enumerate(RESPONSES)])
    logp_a = np.concatenate([batch["old_log_probs"][i, :r].numpy() for i, r in enumerate(RESPONSES)])
    expected = route_diagnostics(rollout, actor, logp_rollout=logp_r, logp_trainer=logp_a)
    # 5 tokens x 2 layers = 10 decisions, one flipped (a wholly new set: overlap 0 of 2 -> changed 2 / 20)
    assert out["moestab/routing/rollout_old_free/router_flip"] == pytest.approx(1 / 10)
    assert out["moestab/routing/rollout_old_free/changed"] == pytest.approx(1 / 10)
    assert out["moestab/routing/rollout_old_free/token_flip"] == pytest.approx(1 / 5)
    assert out["moestab/routing/rollout_old_free/router_flip_by_layer/layer_01"] == pytest.approx(1 / 5)
    for key, value in expected.items():
        if not isinstance(value, list):
            assert out["moestab/" + key] == pytest.approx(value), key
    assert out["moestab/training/rollout_probs_diff_mean"] == expected["mismatch/rollout_old_free/prob_diff_mean"]


def test_route_metrics_on_verl_layout():
    batch, rollout, actor = batch_with_actor_routes()
    check(batch, rollout, actor)
    with pytest.raises(PayloadError, match="the batch has no 'actor_routed_experts'"):
        route_metrics({k: v for k, v in batch.items() if k != "actor_routed_experts"}, num_experts=EXPERTS)


@pytest.mark.parametrize("missing", [("rollout_log_probs",), ("old_log_probs",),
                                     ("rollout_log_probs", "old_log_probs")])
def test_route_metrics_warns_once_without_log_probs(missing):
    batch, rollout, actor = batch_with_actor_routes()
    given = {key: value for key, value in batch.items() if key not in missing}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's own: once per message and calling line
        for _ in range(3):  # three steps of a run, one calling line
            out = route_metrics(given, num_experts=EXPERTS)
    assert [w.category for w in caught] == [MissingLogProbsWarning]
    assert caught[0].filename == __file__  # points at the caller's line, so each call site warns once
    message = str(caught[0].message)
    assert all(repr(key) in message for key in missing) and "routing keys only" in message
    expected = route_diagnostics(rollout, actor)  # the routing keys, no log-probs
    assert {k for k in out if "/layer_" not in k} == {"moestab/" + k for k, v in expected.items()
                                                      if not isinstance(v, list)}
    assert not any("mismatch" in k or "rollout_probs_diff" in k for k in out)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MissingLogProbsWarning)
        assert "moestab/training/rollout_probs_diff_mean" in route_metrics(batch, num_experts=EXPERTS)


def test_route_metrics_appends_to_a_run_folder(tmp_path):
    batch, *_ = batch_with_actor_routes()
    with DiagnosticsRun(tmp_path / "run", trainer="verl", replay="rollout", layers=range(2), num_experts=EXPERTS,
                        top_k=TOP_K) as run:
        route_metrics(batch, num_experts=EXPERTS, run=run, step=1)
        with pytest.raises(ValueError, match="pass step"):
            route_metrics(batch, num_experts=EXPERTS, run=run)
    line = json.loads((tmp_path / "run" / schema.METRICS_JSONL).read_text().splitlines()[0])
    assert line["routing/rollout_old_free/router_flip_by_layer"] == pytest.approx([0.0, 0.2])


@pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="verl is not installed (it needs ray and "
                    "tensordict; tested with verl 0.9.1 in a separate environment, docs/integrations.md)")
def test_route_metrics_on_a_real_dataproto():
    from verl import DataProto

    batch, rollout, actor = batch_with_actor_routes()
    check(batch, rollout, actor, DataProto.from_dict(tensors=batch))
