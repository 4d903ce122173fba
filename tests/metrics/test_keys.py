"""The key table (moestab/metrics/keys.py) is the truth about metrics.jsonl: real ``moestab train`` runs write exactly
its keys for their settings, in its order (tests/integrations/test_trl_callback.py checks the TRL integration's);
every function it names exists; a key it does not declare is refused."""

from __future__ import annotations

import json
import pkgutil

import pytest
import torch

from moestab import rl
from moestab.metrics import keys
from moestab.metrics.keys import MetricKey
from moestab.recording import step_metrics as recording
from moestab.recording.step_records import metrics_line
from moestab.run_folder import schema
from moestab.train import key_owners as key_owners_module
from moestab.train import train
from moestab.train.key_owners import key_owners
from tests.support.train import tiny_config

KINDS = (keys.FLOAT, keys.INT, keys.PER_LAYER, keys.PER_MINIBATCH, keys.PER_LAYER_EXPERT)


def test_every_row_is_well_formed_and_has_one_function_marked_to_compute_it():
    owners = key_owners()  # raises for a row with no owner or two
    for row in keys.TABLE:
        assert row.kind in KINDS and row.section in keys.SECTIONS and set(row.when) <= set(keys.CONDITIONS), row
        assert row.definition and "\n" not in row.definition, row
        assert callable(pkgutil.resolve_name(owners[row.pattern])), owners[row.pattern]
        if row.computed:  # the recording layer calls it for every step
            assert owners[row.pattern].startswith("moestab.recording.step_metrics."), row
    every = [key for row in keys.TABLE for key in row.keys]
    assert len(every) == len(set(every)) == len(keys.KEYS)


def test_a_pattern_expands_over_its_values_and_neighbours_over_the_same_values_expand_together():
    def row(pattern: str, over: tuple[str, ...] = ()) -> MetricKey:
        return MetricKey(pattern, keys.FLOAT, "d", "progress", over=over)

    rows = [row("a/{p}/x", ("1", "2")), row("a/{p}/y", ("1", "2")), row("b"), row("c_{q}", ("u", "v")), row("d")]
    assert list(keys._expand(rows)) == ["a/1/x", "a/1/y", "a/2/x", "a/2/y", "b", "c_u", "c_v", "d"]
    assert keys.KEYS[keys.ROUTING_CHANGED.format(pair="rollout_old")].pattern == keys.ROUTING_CHANGED


def test_a_key_the_table_does_not_declare_is_refused():
    with pytest.raises(keys.UndeclaredKeyError, match="reward/median"):
        metrics_line(1, {keys.REWARD_MEAN: 0.5, "reward/median": 0.5})
    with pytest.raises(ValueError, match="unknown condition"):
        keys.written_keys({"sometimes"})
    line = metrics_line(3, {keys.EVAL_ACCURACY: 0.5, keys.REWARD_MEAN: 0.25})
    assert list(line) == [keys.STEP, keys.REWARD_MEAN, keys.EVAL_ACCURACY]  # the table's order, not the caller's


def test_every_computed_key_comes_from_the_function_marked_to_compute_it():
    owners = key_owners()
    marked = {keys.owner_name(f) for f in recording.STEP_METRICS}
    assert marked == {owners[row.pattern] for row in keys.TABLE if row.computed}
    assert all(keys.owned_keys(f) for f in recording.STEP_METRICS)  # every function computes at least one row
    with pytest.MonkeyPatch.context() as patch:  # a function left out of the list: its rows have no owner
        patch.setattr(key_owners_module, "STEP_METRICS", recording.STEP_METRICS[1:])
        with pytest.raises(ValueError, match=r"\['reward/mean', 'reward/std', 'accuracy'\]: no function is marked"):
            key_owners_module.key_owners()


RUNS = {
    # (TrainConfig overrides, conditions beyond moestab train's own, the steps that evaluate)
    "rspo-kl": ({"steps": 1, "algo": "rspo", "kl_coef": 0.01}, {keys.RSPO}, {1}),
    "dapo-history-aux": ({"steps": 2, "algo": "dapo", "history_resampling": True, "router_aux_loss_coef": 0.1,
                          "max_zero_advantage_steps": 0, "eval_every": 2},
                         {keys.OVERLONG, keys.DYNAMIC_SAMPLING, keys.HISTORY, keys.ROUTER_AUX}, {2}),
    "refreshed-base-measured": ({"steps": 2, "routing_replay": "base", "base_refresh_every": 1,
                                 "measure_base_routes": True, "eval_every": 2},
                                {keys.REPLAYED, keys.BASE_ROUTES}, {2}),
}


@pytest.mark.parametrize("name", list(RUNS))
def test_a_real_run_writes_exactly_the_tables_keys_for_its_settings(name, tmp_path):
    overrides, conditions, evaluated = RUNS[name]
    run = tmp_path / "run"
    train(tiny_config(run, tmp_path / "cache", **overrides), log=lambda s: None)
    lines = [json.loads(x) for x in (run / schema.METRICS_JSONL).read_text().splitlines()]
    assert [line[keys.STEP] for line in lines] == list(range(1, overrides["steps"] + 1))
    for line in lines:
        step_conditions = keys.MOESTAB_TRAIN | conditions | ({keys.EVAL} if line[keys.STEP] in evaluated else set())
        assert list(line) == keys.written_keys(step_conditions)  # the same keys, in the table's order
    assert len(keys.written_keys(keys.MOESTAB_TRAIN)) < len(lines[-1])  # the conditions above added keys


def test_adding_a_metric_is_one_marked_function_and_one_row(monkeypatch):
    from moestab.train.rollout import HFRolloutEngine
    from tests.support.train import one_grpo_step

    *_, tensors = one_grpo_step("off", HFRolloutEngine)
    before = recording.step_metrics(tensors, replay="off")

    @keys.computes("response/eos_frac")  # the function, marked with the row it computes ...
    def eos_frac(v: recording.StepView) -> dict[str, float]:
        return {"response/eos_frac": v.tensors.batch.response_mask[:, -1].logical_not().float().mean().item()}

    row = MetricKey("response/eos_frac", keys.FLOAT, "share of responses that ended before the token budget",
                    "progress")  # ... its row ...
    at = [r.pattern for r in keys.TABLE].index(keys.RESPONSE_LENGTH_MAX) + 1
    table = [*keys.TABLE[:at], row, *keys.TABLE[at:]]  # declared after response/length_max
    monkeypatch.setattr(keys, "TABLE", table)
    monkeypatch.setattr(keys, "KEYS", keys._expand(table))
    monkeypatch.setattr(recording, "STEP_METRICS", (*recording.STEP_METRICS, eos_frac))  # ... and its place here
    monkeypatch.setattr(key_owners_module, "STEP_METRICS", recording.STEP_METRICS)
    after = recording.step_metrics(tensors, replay="off")
    order = list(after)
    assert order[order.index(keys.RESPONSE_LENGTH_MAX) + 1] == "response/eos_frac"  # written where it is declared
    assert 0 < after.pop("response/eos_frac") < 1
    assert json.dumps(after) == json.dumps(before)  # every other key and value as before
    reference = keys.markdown(key_owners_module.key_owners())  # the docs list it, with its function, once regenerated
    assert "`response/eos_frac`" in reference and "test_adding_a_metric_is_one_marked_function_and_one_row.<locals>" \
        ".eos_frac" in reference

    @keys.computes(keys.REWARD_MEAN)  # a function returning a key it is not marked for is refused
    def stray(v: recording.StepView) -> dict[str, float]:
        return {"response/eos_frac": 0.5}

    monkeypatch.setattr(recording, "STEP_METRICS", (*recording.STEP_METRICS, stray))
    with pytest.raises(ValueError, match=r"stray returned \['response/eos_frac'\], which it is not marked"):
        recording.step_metrics(tensors, replay="off")


@pytest.mark.parametrize("algo", sorted(rl.PRESETS))
def test_every_objectives_logged_diagnostics_are_declared(algo):
    from tests.support.rl import random_batch

    preset = rl.get_preset(algo)
    batch = random_batch(0, 4, 6)
    inputs = {"norm_constant": 6.0, "ref_logp": batch["old_logp"],
              **{name: torch.zeros(4, 6, 2, 2, dtype=torch.float64) for name in ("router_logp_old", "router_logp_new")}}
    parts = rl.compute_loss_parts(preset.loss, **preset.loss_kwargs(), **batch,
                                  **{name: inputs[name] for name in preset.runtime_inputs})
    logged = recording.loss_metrics(recording.StepView(None, replay="off", updates=recording.Updates(
        [parts.loss.item()], [1.0], [parts.metrics])))
    assert logged and keys.in_table_order(logged) == logged  # every one declared, none refused at the first step
