"""The measurement budget (``--measure-fraction`` / ``--measure-every``): the measure-only forwards (pi_new, the free
pi_old under R3 / TRR, routing share's counterfactual) run on a seeded sample of whole groups, and nothing else of
the step changes.

A sampled step is checked against the same step measured in full: the weights and every unsampled metric are bit
for bit the same, the sampled tensors equal the full ones on the measured rows, and the sampled change rate equals
the one counted by hand (Python sets) on those rows.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from moestab.analysis.budget_error import group_counts
from moestab.metrics import keys
from moestab.metrics.sampling import mean_se, ratio_se
from moestab.models import build_embedded_policy
from moestab.recording.measure_budget import MeasureBudget
from moestab.routing import RoutingRecorder
from moestab.run_folder import schema
from moestab.run_folder.reader import load_metrics, load_tokens, read_run_info
from moestab.train import train
from moestab.train.rollout import HFRolloutEngine
from tests.support.train import one_grpo_step, tiny_config

SHARE = frozenset({"routing_share"})  # the measurement switch of routing's share (RoutingShare.switch)

CHANGED = keys.ROUTING_CHANGED.format(pair="old_new")


# ---- the budget's rule --------------------------------------------------------------------------------------------
def test_the_budget_draws_whole_groups_with_its_seed_and_skips_steps():
    budget = MeasureBudget(fraction=0.5, every=2)
    rows = budget.rows(step=1, batch_size=12, group_size=3, seed=7)  # 4 groups of 3: ceil(0.5 * 4) = 2 measured
    assert rows.shape == (12,) and int(rows.sum()) == 6
    assert torch.equal(rows.view(4, 3).all(1), rows.view(4, 3).any(1))  # whole groups
    assert torch.equal(rows, budget.rows(step=1, batch_size=12, group_size=3, seed=7))  # the seed decides
    assert not budget.rows(step=2, batch_size=12, group_size=3, seed=7).any()  # (2 - 1) % 2 != 0: unmeasured
    assert budget.rows(step=3, batch_size=12, group_size=3, seed=7).sum() == 6
    assert MeasureBudget(fraction=0.01).groups(4, 0).tolist() in ([0], [1], [2], [3])  # at least one group
    assert MeasureBudget().full and not budget.full


@pytest.mark.parametrize(("fraction", "every"), [(0.0, 1), (1.5, 1), (0.5, 0), (0.5, 1.5)])
def test_a_budget_outside_its_range_is_refused(fraction, every):
    with pytest.raises(ValueError, match="measure"):
        MeasureBudget(fraction=fraction, every=every)


# ---- the sampling error --------------------------------------------------------------------------------------------
def test_ratio_se_hand_worked():
    # 2 of 4 groups, changed decisions y = [1, 3] of x = [10, 10]: R = 4 / 20 = 0.2; residuals y - R x = [-1, 1],
    # sum of squares 2, / (m - 1) = 2; (1 - m/M) / (m xbar^2) = 0.5 / 200; se^2 = 0.005, se = 0.0707107.
    assert ratio_se(np.array([1, 3]), np.array([10, 10]), population=4) == pytest.approx(math.sqrt(0.005), rel=1e-12)
    assert ratio_se(np.array([1, 3]), np.array([10, 10]), population=2) == 0.0  # every group measured: exact
    assert math.isnan(ratio_se(np.array([1]), np.array([10]), population=4))  # one group: no spread to use
    assert mean_se(np.array([0.3, 0.4, np.nan])) == pytest.approx(0.5 / 2)  # sqrt(0.09 + 0.16) / 2 steps


def test_ratio_se_matches_the_spread_of_repeated_samples():
    # A second implementation: draw many samples of 8 of 40 groups and compare the spread of the estimates with the
    # mean of the formula's errors (agree to ~10% with 4,000 draws; a formula without the group structure or
    # the finite-population correction is off by far more).
    rng = np.random.default_rng(0)
    x = rng.integers(50, 150, 40).astype(float)  # decisions per group
    y = rng.binomial(x.astype(int), rng.uniform(0.0, 0.05, 40)).astype(float)  # changed decisions, rates vary
    estimates, errors = [], []
    for _ in range(4000):
        pick = rng.choice(40, 8, replace=False)
        estimates.append(y[pick].sum() / x[pick].sum())
        errors.append(ratio_se(y[pick], x[pick], 40))
    assert np.mean(errors) == pytest.approx(np.std(estimates), rel=0.12)


# ---- the step -----------------------------------------------------------------------------------------------------
def test_a_row_scored_in_a_smaller_chunk_routes_the_same_and_rounds_within_1e_6():
    # What the budget relies on: the sample is forwarded in the minibatches' chunks cut to its rows, so under
    # off / R2 pi_new's chunks are smaller than pi_old's. On the CPU that changes a row's logits by rounding only
    # (measured up to 2.7e-7) and flipped no routing decision: the old->new change stays the update's doing.
    torch.manual_seed(0)
    model, _ = build_embedded_policy()
    for _ in range(5):
        ids = torch.randint(3, 30, (32, 40))  # [B, L]
        rows = torch.randperm(32)[:5].sort().values  # [5]
        with torch.no_grad():
            with RoutingRecorder(model) as full_rec:
                full = model(input_ids=ids).logits  # [B, L, V]
            with RoutingRecorder(model) as part_rec:
                part = model(input_ids=ids[rows]).logits  # [5, L, V]
        assert (full[rows] - part).abs().max() < 1e-6
        assert torch.equal(full_rec.routes.indices[rows].sort(-1).values, part_rec.routes.indices.sort(-1).values)


def _engine(replay: str):
    return lambda model, tokenizer: HFRolloutEngine(model, tokenizer, gates=replay == "rollout-gates")


def _hand_changed(a: torch.Tensor, b: torch.Tensor) -> float:
    """1 - sum |E_a ∩ E_b| / (k * decisions) over ``[tokens, layers, k]`` route sets, counted with Python sets."""
    overlap = sum(len(set(x.tolist()) & set(y.tolist())) for ta, tb in zip(a, b, strict=True)
                  for x, y in zip(ta, tb, strict=True))
    return 1 - overlap / (a.shape[0] * a.shape[1] * a.shape[2])


SAMPLED_PREFIXES = ("routing/old_new/", "routing_share/", keys.MEASURE_FRACTION, "time/")
FREE_OLD_PREFIXES = ("routing/rollout_old_free/", "mismatch/rollout_old_free/", keys.ENTROPY, "experts/")


@pytest.mark.parametrize("replay", ["off", "rollout"])
def test_a_sampled_step_is_the_full_step_on_its_rows(replay):
    measured = MeasureBudget(fraction=0.5).rows(step=1, batch_size=16, group_size=4, seed=3)  # 2 of 4 groups
    _, model_full, m_full, t_full = one_grpo_step(replay, _engine(replay), measure_switches=SHARE)
    _, model_part, m_part, t_part = one_grpo_step(replay, _engine(replay), measured=measured, measure_switches=SHARE)
    for (name, p_full), p_part in zip(model_full.named_parameters(), model_part.parameters(), strict=True):
        assert torch.equal(p_full, p_part), name
    sampled = SAMPLED_PREFIXES + (FREE_OLD_PREFIXES if replay == "rollout" else ())
    unsampled = {k: v for k, v in m_full.items() if not k.startswith(sampled)}
    assert json.dumps({k: m_part[k] for k in unsampled}) == json.dumps(unsampled)  # bit for bit
    # The measure-only tensors: the full step's on the measured rows (up to the rounding of a smaller chunk), NaN / -1
    # elsewhere.
    torch.testing.assert_close(t_part.logp_new[measured], t_full.logp_new[measured], rtol=0, atol=1e-5)
    assert t_part.logp_new[~measured].isnan().all() and (t_part.routes_new.indices[~measured] == -1).all()
    assert torch.equal(t_part.routes_new.indices[measured], t_full.routes_new.indices[measured])
    cf_full, cf_part = t_full.logp_update_counterfactual, t_part.logp_update_counterfactual
    torch.testing.assert_close(cf_part[measured], cf_full[measured], rtol=0, atol=1e-5)
    assert cf_part[~measured].isnan().all()
    free_sampled = replay == "rollout"
    assert (t_part.routes_old_free.indices[~measured] == -1).all() == free_sampled
    # The sampled change rate, counted by hand on the measured rows' response tokens.
    mask = t_full.batch.response_mask  # [B, T]
    start = t_full.batch.prompt_len - 1
    old = t_part.routes_old_free.indices[:, start:][mask & measured[:, None]]  # [tokens', layers, k]
    new = t_part.routes_new.indices[:, start:][mask & measured[:, None]]
    assert m_part[CHANGED] == pytest.approx(_hand_changed(old, new), abs=1e-12)
    assert m_part[keys.MEASURE_FRACTION] == 0.5
    se = m_part[keys.ROUTING_CHANGED_SE.format(pair="old_new")]
    assert se >= 0 and (se > 0 or m_part[CHANGED] == 0)
    assert (keys.ROUTING_CHANGED_SE.format(pair="rollout_old_free") in m_part) == free_sampled


def test_an_unmeasured_step_logs_no_sampled_key_and_runs_no_measure_forward():
    measured = torch.zeros(16, dtype=torch.bool)
    _, _, metrics, tensors = one_grpo_step("rollout", _engine("rollout"), measured=measured)
    assert not any(k.startswith(("routing/old_new/", "routing/rollout_old_free/", "mismatch/rollout_old_free/"))
                   for k in metrics)
    assert metrics[keys.MEASURE_FRACTION] == 0.0
    assert keys.ROUTING_CHANGED.format(pair="rollout_old") in metrics  # the ratio's own pair: always measured
    assert tensors.logp_new.isnan().all() and (tensors.routes_new.indices == -1).all()


# ---- a run --------------------------------------------------------------------------------------------------------
def test_a_run_under_a_budget_records_its_rule_samples_and_errors(tmp_path, cache_dir):
    config = tiny_config(tmp_path / "run", cache_dir, steps=3, measure_fraction=0.5, measure_every=2,
                         eval_every=10, save_every=10)
    run = train(config, log=lambda s: None).run_dir
    metrics = load_metrics(run).set_index("step")
    assert metrics.loc[1, keys.MEASURE_FRACTION] == 0.5 and metrics.loc[3, keys.MEASURE_FRACTION] == 0.5
    assert metrics.loc[2, keys.MEASURE_FRACTION] == 0.0 and np.isnan(metrics.loc[2, CHANGED])
    assert np.isfinite(metrics.loc[[1, 3], keys.ROUTING_CHANGED_SE.format(pair="old_new")]).all()
    tokens = load_tokens(run, columns=[schema.COL_STEP, schema.COL_SEQ])
    assert sorted(tokens[schema.COL_STEP].unique()) == [1, 3]  # no table on the unmeasured step
    for _, step in tokens.groupby(schema.COL_STEP):
        groups = step[schema.COL_SEQ].unique() // 4
        assert len(set(groups.tolist())) == 2  # 2 of the 4 groups: only measured sequences are written
    info = read_run_info(run)
    assert info.config["measure_fraction"] == 0.5 and "randperm" in info.environment["measure_rule"]
    # The budget analysis reads the same groups from the tables: their pooled rate is the logged one.
    counts = group_counts(run, "old_new", "router_flip").groupby("step")[["changed", "decisions"]].sum()
    logged = metrics.loc[[1, 3], keys.ROUTING_ROUTER_FLIP.format(pair="old_new")].to_numpy()
    assert (counts.changed / counts.decisions).to_numpy() == pytest.approx(logged, abs=1e-12)


def test_a_budget_with_several_processes_is_refused_before_anything_is_written(tmp_path, cache_dir):
    from moestab.configs import ConfigError

    with pytest.raises(ConfigError, match="one process only"):
        tiny_config(tmp_path / "run", cache_dir, measure_fraction=0.5, nproc=2)
    assert not (tmp_path / "run").exists()
