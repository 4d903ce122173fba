"""The diagnostics call for any trainer (moestab.recording.diagnostics): hand-worked tiny cases, a cross-check
against plain Python sets and the frameworks' own formulas, the aliases, bad input, and the run folder it writes,
read back by ``moestab analyze``'s summary."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch

from moestab.analysis.summary import summarize_runs
from moestab.analysis.synthetic import synthetic_routes
from moestab.metrics import keys
from moestab.metrics.experts import max_violation
from moestab.metrics.mismatch import mismatch_spread
from moestab.metrics.routes import intersection_sizes, route_change, route_change_of, token_changes
from moestab.recording.diagnostics import DiagnosticsRun, route_diagnostics
from moestab.run_folder import schema
from tests.support.runs import diagnostics_run

PAIR = "rollout_old_free"


def key(pattern: str) -> str:
    return pattern.format(pair=PAIR)


def test_hand_worked_two_tokens_two_layers_top2():
    # token 0: layer 0 {0,1} vs {1,0} same set; layer 1 {2,3} vs {2,4}: overlap 1 -> flipped
    # token 1: layer 0 {0,5} vs {0,5} same;     layer 1 {1,2} vs -1 (not recorded by the trainer): left out
    rollout = np.array([[[0, 1], [2, 3]], [[0, 5], [1, 2]]], np.int16)
    trainer = np.array([[[1, 0], [2, 4]], [[0, 5], [-1, -1]]], np.int16)
    m = route_diagnostics(rollout, trainer)
    # 3 recorded decisions, overlaps 2, 1, 2: changed = 1 - 5 / (2 * 3) = 1/6; router_flip = 1/3
    assert m[key(keys.ROUTING_CHANGED)] == pytest.approx(1 / 6)
    assert m[key(keys.ROUTING_ROUTER_FLIP)] == pytest.approx(1 / 3)
    # tokens with >= 1 flipped layer: token 0 of the 2 tokens with a recorded layer
    assert m[key(keys.ROUTING_TOKEN_FLIP)] == pytest.approx(1 / 2)
    # per layer: layer 0 overlaps 2, 2 -> 0, 0; layer 1 only token 0, overlap 1 -> changed 1/2, flip 1
    assert m[key(keys.ROUTING_CHANGED_BY_LAYER)] == pytest.approx([0.0, 0.5])
    assert m[key(keys.ROUTING_ROUTER_FLIP_BY_LAYER)] == pytest.approx([0.0, 1.0])
    assert not any(k.startswith("mismatch/") for k in m)  # no log-probs given


def test_hand_worked_log_prob_spread_and_the_aliases():
    # d = trainer - rollout = [ln 3, -ln 6, 0]: |d| = [1.0986, 1.7918, 0]
    rollout = np.log([0.2, 0.6, 0.5])
    trainer = np.log([0.6, 0.1, 0.5])
    routes = np.zeros((3, 1, 1), np.int16)
    m = route_diagnostics(routes, routes, logp_rollout=rollout, logp_trainer=trainer, aliases=True)
    d = np.array([math.log(3), -math.log(6), 0.0])
    assert m[key(keys.MISMATCH_K3)] == pytest.approx(np.mean(np.exp(d) - 1 - d))  # (1.0986 + 0.9584 + 0) / 3
    assert m[key(keys.MISMATCH_ABS_D)] == pytest.approx((math.log(3) + math.log(6)) / 3)
    assert m[key(keys.MISMATCH_SQ_D)] == pytest.approx((math.log(3) ** 2 + math.log(6) ** 2) / 3)
    assert m[key(keys.MISMATCH_F2)] == pytest.approx(2 / 3)  # ln 3 and ln 6 both exceed ln 2
    assert m[key(keys.MISMATCH_F5)] == pytest.approx(1 / 3)  # only ln 6 exceeds ln 5
    # verl: |p_trainer - p_rollout| = [0.4, 0.5, 0]: mean 0.3, max 0.5, sd(n - 1) = sqrt(((.1)^2 + (.2)^2 + (.3)^2) / 2)
    assert m[key(keys.MISMATCH_PROB_DIFF_MEAN)] == pytest.approx(0.3)
    assert m[key(keys.MISMATCH_PROB_DIFF_MAX)] == pytest.approx(0.5)
    assert m[key(keys.MISMATCH_PROB_DIFF_STD)] == pytest.approx(math.sqrt(0.14 / 2))
    assert m["rollout_train_k3_kl"] == m[key(keys.MISMATCH_K3)]
    assert m["extreme_frac_tau5"] == m[key(keys.MISMATCH_F5)]
    assert m["training/rollout_probs_diff_std"] == m[key(keys.MISMATCH_PROB_DIFF_STD)]
    assert "rollout_train_k3_kl" not in route_diagnostics(routes, routes, logp_rollout=rollout, logp_trainer=trainer)


def test_spread_against_areal_and_verl_formulas_in_torch():
    gen = torch.Generator().manual_seed(0)
    rollout = -torch.rand(500, generator=gen, dtype=torch.float64) * 3
    trainer = rollout + torch.randn(500, generator=gen, dtype=torch.float64) * 0.8
    d = trainer - rollout
    diff = (trainer.exp() - rollout.exp()).abs()
    spread = mismatch_spread(trainer.numpy(), rollout.numpy())
    assert spread["abs_d"] == pytest.approx(d.abs().mean().item(), rel=1e-12)
    assert spread["sq_d"] == pytest.approx((d ** 2).mean().item(), rel=1e-12)
    assert spread["f5"] == pytest.approx((d.abs() > math.log(5)).double().mean().item(), rel=1e-12)
    assert spread["prob_diff_std"] == pytest.approx(torch.std(diff).item(), rel=1e-12)  # verl's torch.std
    assert spread["prob_diff_max"] == diff.max().item()
    assert 0 < spread["f5"] < spread["abs_d"]  # some tokens are extreme, not all: the check can fail


def naive_rates(a: np.ndarray, b: np.ndarray) -> dict[str, object]:
    """Routing change with Python sets, decision by decision."""
    tokens, layers, k = a.shape
    flips, overlap, routers = [0] * layers, [0] * layers, [0] * layers
    token_recorded = token_flipped = 0
    for t in range(tokens):
        recorded = flipped = False
        for layer in range(layers):
            ea, eb = set(a[t, layer].tolist()), set(b[t, layer].tolist())
            if -1 in ea or -1 in eb:
                continue
            recorded = True
            routers[layer] += 1
            overlap[layer] += len(ea & eb)
            if ea != eb:
                flips[layer] += 1
                flipped = True
        token_recorded += recorded
        token_flipped += flipped
    return {"changed": 1 - sum(overlap) / (k * sum(routers)), "router_flip": sum(flips) / sum(routers),
            "token_flip": token_flipped / token_recorded,
            "router_flip_by_layer": [f / n for f, n in zip(flips, routers, strict=True)],
            "changed_by_layer": [1 - o / (k * n) for o, n in zip(overlap, routers, strict=True)]}


def test_cross_check_against_python_sets_with_unrecorded_decisions():
    a, b = synthetic_routes(400, 5, 4, 16, flip=0.3, reorder=0.2, reorder_flipped=True, seed=3)
    gen = np.random.default_rng(1)
    a[gen.random(a.shape[:2]) < 0.05] = -1
    b[gen.random(b.shape[:2]) < 0.05] = -1
    m = route_diagnostics(torch.from_numpy(a).to(torch.int32), b)  # torch int32 in, numpy int16 in
    expected = naive_rates(a, b)
    for stat, pattern in (("changed", keys.ROUTING_CHANGED), ("router_flip", keys.ROUTING_ROUTER_FLIP),
                          ("token_flip", keys.ROUTING_TOKEN_FLIP), ("changed_by_layer", keys.ROUTING_CHANGED_BY_LAYER),
                          ("router_flip_by_layer", keys.ROUTING_ROUTER_FLIP_BY_LAYER)):
        assert m[key(pattern)] == pytest.approx(expected[stat], rel=1e-12), stat
    assert 0.2 < m[key(keys.ROUTING_ROUTER_FLIP)] < 0.5  # flips happened and not everywhere


def test_per_token_change_matches_a_loop():
    a, b = synthetic_routes(120, 5, 4, 32, flip=0.5, reorder=0.3, seed=3)
    b[3, 1] = -1  # one layer of a token not recorded
    a[4, :, 0] = -1  # no layer of a token recorded
    got = token_changes(intersection_sizes(a, b), 4)
    for t in range(120):
        kept = [len(set(a[t, j].tolist()) & set(b[t, j].tolist())) for j in range(5)
                if min(a[t, j]) >= 0 and min(b[t, j]) >= 0]
        want = 1 - sum(kept) / (4 * len(kept)) if kept else float("nan")
        assert got[t] == pytest.approx(want, abs=1e-12, nan_ok=True), t
    every = intersection_sizes(*synthetic_routes(50, 5, 4, 32, flip=0.5, seed=4))  # the all-recorded path
    want_every = 1 - every.sum(axis=1) / (4 * 5)
    assert token_changes(every, 4) == pytest.approx(want_every, abs=1e-12)


@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_chunked_route_change_is_the_two_step_one_exactly(chunk):
    a, b = synthetic_routes(300, 6, 8, 64, flip=0.5, reorder=0.3, seed=5)
    b[10:20, 2] = -1
    b[30, :] = -1  # a token with no layer recorded: no per-token value
    one = route_change(intersection_sizes(a, b), 8, by_token=True)
    other = route_change_of(a, b, chunk_tokens=chunk, threads=2, by_token=True)
    assert one.keys() == other.keys()
    for name in one:
        assert np.array_equal(one[name], other[name], equal_nan=True), name


def test_max_vio_and_confidence():
    # layer 0 counts [4, 2, 2, 0]: mean 2, max 4 -> (4 - 2) / 2 = 1; layer 1 uniform [2, 2, 2, 2] -> 0
    assert max_violation(np.array([[4, 2, 2, 0], [2, 2, 2, 2]])).tolist() == [1.0, 0.0]
    routes = np.array([[[0, 1], [0, 1]], [[0, 2], [2, 3]], [[0, 1], [1, 0]], [[2, 1], [3, 2]]], np.int16)
    # counted from the trainer's routes: layer 0 experts {0: 3, 1: 3, 2: 2, 3: 0} -> (3 - 2) / 2 = 0.5;
    # layer 1 {0: 2, 1: 2, 2: 2, 3: 2} -> 0
    m = route_diagnostics(routes, routes, num_experts=4, routing_confidence=[[0.5, 1.0], [0.7, 0.8], [0.6, 0.9],
                                                                            [0.8, 0.7]], aliases=True)
    assert m[keys.EXPERTS_MAX_VIO] == pytest.approx([0.5, 0.0])
    assert m[keys.EXPERTS_CONFIDENCE] == pytest.approx([0.65, 0.85])
    assert m[keys.EXPERTS_CONFIDENCE_MEAN] == pytest.approx(0.75)
    assert m["max_vio"] == m[keys.EXPERTS_MAX_VIO] and m["routing_confidence"] == m[keys.EXPERTS_CONFIDENCE]
    given = route_diagnostics(routes, routes, expert_counts=np.array([[4, 2, 2, 0], [2, 2, 2, 2]]))
    assert given[keys.EXPERTS_MAX_VIO] == [1.0, 0.0]


def test_bad_input_names_the_argument_and_shape():
    routes = np.tile(np.array([0, 1], np.int16), (3, 2, 1))  # [3, 2, 2]: experts 0 and 1 in every decision
    with pytest.raises(ValueError, match=r"rollout_routes \(3, 2, 2\) and trainer_routes \(3, 1, 2\)"):
        route_diagnostics(routes, routes[:, :1])
    with pytest.raises(ValueError, match=r"trainer_routes must be \[tokens, layers, top_k\], got shape \(6, 2\)"):
        route_diagnostics(routes, routes.reshape(6, 2))
    with pytest.raises(ValueError, match=r"logp_trainer must be \[tokens\] = \[3\] like the routes, got shape \(2,\)"):
        route_diagnostics(routes, routes, logp_rollout=np.zeros(3), logp_trainer=np.zeros(2))
    with pytest.raises(ValueError, match="both logp_rollout and logp_trainer"):
        route_diagnostics(routes, routes, logp_rollout=np.zeros(3))
    with pytest.raises(ValueError, match=r"pair must be one of \['rollout_old', 'rollout_old_free'\]"):
        route_diagnostics(routes, routes, pair="old_new")
    with pytest.raises(ValueError, match=r"expert_counts must be \[layers, experts\] with 2 layers"):
        route_diagnostics(routes, routes, expert_counts=np.ones((3, 4)))


def test_implausible_routes_and_log_probs_are_refused_naming_the_entry():
    routes = np.tile(np.array([0, 1], np.int16), (3, 2, 1))  # [3, 2, 2]
    below = routes.copy()
    below[2, 1, 0] = -3
    with pytest.raises(ValueError, match=r"rollout_routes\[2, 1, 0\] is -3; expert ids are 0 or more"):
        route_diagnostics(below, routes)
    twice = routes.copy()
    twice[1, 0] = [4, 4]
    with pytest.raises(ValueError, match=r"trainer_routes\[1, 0\] names an expert twice \(\[4, 4\]\)"):
        route_diagnostics(routes, twice)
    unrecorded = routes.copy()
    unrecorded[0, 0] = [-1, -1]  # not recorded: -1 in every slot is no duplicate
    route_diagnostics(unrecorded, routes)
    for bad, says in ((np.nan, "nan"), (0.5, "0.5"), (-np.inf, "-inf")):
        logp = np.full(3, -1.0)
        logp[1] = bad
        with pytest.raises(ValueError, match=rf"logp_rollout\[1\] is {says}; a log-prob is finite and at most 0"):
            route_diagnostics(routes, routes, logp_rollout=logp, logp_trainer=np.full(3, -1.0))
    logp = np.full(3, -1.0)
    logp[0] = 1e-6  # an engine's rounding of a near-certain token: accepted
    route_diagnostics(routes, routes, logp_rollout=logp, logp_trainer=np.full(3, -1.0))


def test_a_diagnostics_run_writes_only_numbers_of_the_tables_shapes(tmp_path):
    with DiagnosticsRun(tmp_path / "run", trainer="x", layers=[0, 1], num_experts=4, top_k=2) as run:
        for metrics, says in (({"routing/rollout_old/changed": "lots"}, "is 'lots'; the key table says float"),
                              ({"routing/rollout_old/changed": [0.1]}, "the key table says float"),
                              ({"routing/rollout_old/changed_by_layer": ["a", 0.1]}, "list[layers] of float"),
                              ({"routing/rollout_old/changed": True}, "the key table says float")):
            with pytest.raises(ValueError, match=re.escape(says)):
                run.log(1, metrics)
        run.log(1, {"routing/rollout_old/changed": 0.25, "routing/rollout_old/changed_by_layer": [0.5, None]})
    lines = (tmp_path / "run" / schema.METRICS_JSONL).read_text().splitlines()
    assert [json.loads(line)["routing/rollout_old/changed"] for line in lines] == [0.25]  # nothing else written


def test_a_diagnostics_run_is_a_run_that_analyze_reads(tmp_path):
    a, b = diagnostics_run(tmp_path / "run")
    lines = [json.loads(x) for x in (tmp_path / "run" / schema.METRICS_JSONL).read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert all(set(line) <= set(keys.KEYS) for line in lines)  # aliases stay out of metrics.jsonl
    assert list(lines[0]) == list(keys.in_table_order(lines[0])) and "rollout_train_k3_kl" not in lines[0]
    info = json.loads((tmp_path / "run" / schema.RUN_JSON).read_text())
    assert info["status"] == "finished" and info["last_step"] == 3 and info["config"]["routing_replay"] == "rollout"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["config.yaml", "metrics.jsonl", "run.json"]
    row = summarize_runs([tmp_path / "run"]).iloc[0]
    flip = route_change(intersection_sizes(a, b), 2)["router_flip"][0]
    assert row["replay"] == "R3" and row["steps"] == 3
    assert row["rollout_old_free_router_flip"] == pytest.approx(flip)
    # k3 of d = 0.05 * step, averaged over the 3 steps
    assert row["rollout_old_free_k3"] == pytest.approx(np.mean([np.expm1(0.05 * s) - 0.05 * s for s in (1, 2, 3)]))


def test_a_diagnostics_run_refuses_a_used_folder_and_steps_that_do_not_increase(tmp_path):
    diagnostics_run(tmp_path / "run", steps=1)
    with pytest.raises(Exception, match=r"already holds a run .*overwrite=True"):
        diagnostics_run(tmp_path / "run", steps=1)
    diagnostics_run(tmp_path / "run", steps=2, overwrite=True)
    run = DiagnosticsRun(tmp_path / "other", trainer="x", layers=[0], num_experts=4, top_k=2)
    with pytest.raises(RuntimeError, match="open"):
        run.log(1, {})
    with pytest.raises(ValueError, match="steps must increase: step 1 after step 1"), run:
        run.log(1, {})
        run.log(1, {})
    info = json.loads((tmp_path / "other" / schema.RUN_JSON).read_text())
    assert info["status"] == "failed" and "steps must increase" in info["error"]
    with pytest.raises(ValueError, match="replay must be one of"):
        DiagnosticsRun(tmp_path / "x", trainer="x", layers=[0], num_experts=4, top_k=2, replay="R3")
