"""moestab.analysis.compare: grouping by config, mean and sd over seeds, EMA and the key listing, on hand-worked
tiny cases (the arithmetic in the comments)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from moestab.analysis.compare import (
    ABSENT,
    ALL_RUNS,
    DEFAULT_KEYS,
    aggregate,
    config_table,
    curves,
    default_group_fields,
    describe,
    ema,
    field_text,
    group_labels,
    group_members,
    key_counts,
    label_fields,
    named_values,
    runs_without,
    smooth,
    step_domain,
    style_fields,
    thin,
    varying_fields,
)
from moestab.metrics import keys
from moestab.run_folder.reader import load_metrics

CONFIGS = {
    "grpo-s0": {"algo": "grpo", "routing_replay": "off", "lr": 0.0002, "seed": 0, "rollout_dtype": "float32"},
    "grpo-s1": {"algo": "grpo", "routing_replay": "off", "lr": 0.0002, "seed": 1, "rollout_dtype": "float32"},
    "gspo-s0": {"algo": "gspo", "routing_replay": "off", "lr": 0.0002, "seed": 0, "rollout_dtype": "bfloat16"},
    "trl": {"algo": "gspo", "routing_replay": "off", "trainer": "trl"},  # a foreign config: no lr, seed, dtype
}


def test_config_table_lists_every_field_and_marks_absent_ones() -> None:
    table = config_table(CONFIGS)
    assert list(table.index) == list(CONFIGS)
    assert list(table.columns) == ["algo", "routing_replay", "lr", "seed", "rollout_dtype", "trainer"]
    assert table.at["grpo-s0", "lr"] == "0.0002"  # numbers as JSON text: equal values, equal text
    assert table.at["trl", "lr"] == ABSENT and table.at["grpo-s0", "trainer"] == ABSENT
    # routing_replay is "off" everywhere: it does not vary; every other field does (the TRL run lacks lr).
    assert varying_fields(table) == ["algo", "lr", "seed", "rollout_dtype", "trainer"]
    # seed tells runs apart, it is no condition: the default grouping leaves it out.
    assert default_group_fields(varying_fields(table)) == ["algo", "lr", "rollout_dtype", "trainer"]
    # A setting absent from older runs and off wherever present is no condition; lr (0.0002, absent from the TRL
    # run) and trainer (present in one run only) still group.
    assert default_group_fields(varying_fields(table), table) == ["algo", "lr", "rollout_dtype", "trainer"]
    older = config_table({"new": {"algo": "grpo", "score_ratio": 0.0}, "old": {"algo": "grpo"},
                          "on": {"algo": "gspo", "score_ratio": 0.0}})
    assert varying_fields(older) == ["algo", "score_ratio"]
    assert default_group_fields(varying_fields(older), older) == ["algo"]


def test_style_fields_prefer_the_objective_and_the_replay_mode() -> None:
    assert style_fields(["trainer", "lr", "algo"]) == ("algo", "trainer")  # by STYLE_ORDER
    assert style_fields(["kl_coef", "routing_replay"]) == ("routing_replay", "kl_coef")  # then the others, in order
    assert style_fields(["kl_coef"]) == ("kl_coef", None)
    assert style_fields([]) == (None, None)
    # With the runs: algo and routing_replay tell the 3 groups apart; with a dense control they no longer do
    # (two groups are both algo=grpo, routing_replay=off), so the lines are coloured by group.
    runs = pd.DataFrame({"algo": ["grpo", "grpo", "gspo"], "routing_replay": ["off", "old", "off"],
                         "model": ["moe", "moe", "moe"]})
    assert style_fields(["algo", "routing_replay"], runs) == ("algo", "routing_replay")
    runs.loc[3] = ["grpo", "off", "dense"]
    assert style_fields(["algo", "routing_replay", "model"], runs) == (None, None)


def test_field_text_is_stable() -> None:
    assert field_text("grpo") == "grpo"
    assert field_text(None) == "null" and field_text(True) == "true" and field_text(3) == "3"
    assert field_text({"b": 1, "a": [1, 2]}) == '{"a": [1, 2], "b": 1}'  # keys sorted: equal dicts, equal text


def test_group_labels_put_seeds_of_one_condition_together() -> None:
    table = config_table(CONFIGS)
    groups = group_labels(table, ["algo", "rollout_dtype"])
    assert groups.to_dict() == {
        "grpo-s0": "algo=grpo, rollout_dtype=float32",
        "grpo-s1": "algo=grpo, rollout_dtype=float32",  # same condition, another seed
        "gspo-s0": "algo=gspo, rollout_dtype=bfloat16",
        "trl": f"algo=gspo, rollout_dtype={ABSENT}",
    }
    assert group_members(groups) == {"algo=grpo, rollout_dtype=float32": ["grpo-s0", "grpo-s1"],
                                     "algo=gspo, rollout_dtype=bfloat16": ["gspo-s0"],
                                     f"algo=gspo, rollout_dtype={ABSENT}": ["trl"]}
    assert set(group_labels(table, [])) == {ALL_RUNS}
    with pytest.raises(KeyError, match="no config field"):
        group_labels(table, ["nope"])


def frame(steps, **columns) -> pd.DataFrame:
    return pd.DataFrame({"step": steps, **columns})


def test_key_counts_count_runs_with_a_number_and_skip_lists(tmp_path: Path) -> None:
    lines = {
        "a": [{"step": 1, "reward/mean": 0.1, "eval/accuracy": None, "routing/old_new/changed_by_layer": [0.1, 0.2],
               "custom/x": 1}, {"step": 2, "reward/mean": 0.2, "eval/accuracy": 0.5, "custom/x": 2}],
        "b": [{"step": 1, "reward/mean": 0.3, "eval/accuracy": None}, {"step": 2, "eval/accuracy": None}],  # all null
    }
    frames, names = {}, {}
    for run, rows in lines.items():
        (tmp_path / run).mkdir()
        (tmp_path / run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        names[run] = set()
        frames[run] = load_metrics(tmp_path / run, keys=["reward/mean"], names=names[run])  # one key held, all named
        assert set(frames[run].columns) == {"step", "reward/mean"}
    # table keys in metrics.jsonl's order (reward/mean before eval/accuracy), then unknown keys; no list, no step
    assert key_counts(names) == {"reward/mean": 2, "eval/accuracy": 1, "custom/x": 1}
    full = {run: load_metrics(tmp_path / run) for run in lines}
    assert runs_without(full, "eval/accuracy") == ["b"]
    assert runs_without(full, "custom/x") == ["b"]  # absent from b's frame
    assert runs_without(full, "reward/mean") == []


def test_default_keys_are_declared_metrics() -> None:
    assert all(key in keys.KEYS and describe(key) for key in DEFAULT_KEYS)
    assert describe("custom/x") == ""


def test_curves_stack_runs_and_put_the_start_at_step_0() -> None:
    frames = {"a": frame([1, 2, 3], **{"eval/accuracy": [None, 0.5, None]}),
              "b": frame([1, 2], **{"eval/accuracy": [0.25, 0.75]}),
              "c": frame([1], reward=[1.0])}  # no eval/accuracy: left out
    got = curves(frames, "eval/accuracy", starts={"a": 0.125, "c": 0.5})
    assert got.to_dict("list") == {"run": ["a", "a", "b", "b"], "step": [0, 2, 1, 2], "value": [0.125, 0.5, 0.25, 0.75]}
    assert list(curves(frames, "missing").columns) == ["run", "step", "value"]


def test_ema_hand_worked() -> None:
    # weight 0.5, values 1, 3, 5:
    #   t=1: 1 / 1 = 1
    #   t=2: (0.5*1 + 3) / (0.5*1 + 1) = 3.5 / 1.5 = 2.3333...
    #   t=3: (0.5*3.5 + 5) / (0.5*1.5 + 1) = 6.75 / 1.75 = 3.857142...
    np.testing.assert_allclose(ema([1.0, 3.0, 5.0], 0.5), [1.0, 3.5 / 1.5, 6.75 / 1.75], rtol=0, atol=1e-15)
    # A NaN is skipped: values 2, NaN, 4 at weight 0.5 -> 2, NaN, (0.5*2 + 4) / (0.5 + 1) = 5 / 1.5
    got = ema([2.0, np.nan, 4.0], 0.5)
    assert got[0] == 2.0 and math.isnan(got[1]) and got[2] == pytest.approx(5 / 1.5, abs=1e-15)
    np.testing.assert_array_equal(ema([1.0, 7.0, -2.0], 0.0), [1.0, 7.0, -2.0])  # 0 = off
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match=r"\[0, 1\)"):
            ema([1.0], bad)


def test_smooth_works_per_run_in_step_order_and_keeps_row_order() -> None:
    data = pd.DataFrame({"run": ["a", "b", "a", "b"], "step": [2, 1, 1, 2], "value": [3.0, 10.0, 1.0, 20.0]})
    got = smooth(data, 0.5)
    # a in step order: 1 (step 1), 3 (step 2) -> 1, (0.5*1 + 3) / 1.5 = 2.3333 ; b: 10, (0.5*10 + 20) / 1.5 = 16.667
    np.testing.assert_allclose(got["value"], [3.5 / 1.5, 10.0, 1.0, 25 / 1.5], atol=1e-15)
    assert got[["run", "step"]].equals(data[["run", "step"]])  # rows where they were
    pd.testing.assert_frame_equal(smooth(data, 0.0), data)


def test_aggregate_hand_worked_mean_and_sample_sd_aligned_on_step() -> None:
    data = pd.DataFrame({
        "run": ["s0", "s0", "s0", "s1", "s1", "other"],
        "step": [1, 2, 3, 1, 2, 1],
        "value": [0.1, 0.2, 0.3, 0.3, 0.6, 5.0],
    })
    groups = {"s0": "grpo", "s1": "grpo", "other": "gspo"}
    got = aggregate(data, groups).set_index(["group", "step"])
    # grpo step 1: values 0.1, 0.3 -> mean 0.2, sd sqrt(((0.1-0.2)^2 + (0.3-0.2)^2) / (2-1)) = sqrt(0.02) = 0.141421
    assert got.loc[("grpo", 1), "mean"] == pytest.approx(0.2, abs=1e-15)
    assert got.loc[("grpo", 1), "sd"] == pytest.approx(math.sqrt(0.02), abs=1e-15)
    assert got.loc[("grpo", 1), "low"] == pytest.approx(0.2 - math.sqrt(0.02), abs=1e-15)
    assert got.loc[("grpo", 1), "high"] == pytest.approx(0.2 + math.sqrt(0.02), abs=1e-15)
    # step 2: 0.2, 0.6 -> mean 0.4, sd sqrt((0.04 + 0.04) / 1) = 0.282843
    assert got.loc[("grpo", 2), "mean"] == pytest.approx(0.4, abs=1e-15)
    assert got.loc[("grpo", 2), "sd"] == pytest.approx(math.sqrt(0.08), abs=1e-15)
    # step 3: only s0 got there -> mean 0.3 of n = 1 run, no sd
    assert got.loc[("grpo", 3), "mean"] == pytest.approx(0.3) and math.isnan(got.loc[("grpo", 3), "sd"])
    assert got.loc[("grpo", 3), "n"] == 1 and got.loc[("grpo", 3), "runs"] == 2
    assert got.loc[("gspo", 1), ["mean", "n", "runs"]].tolist() == [5.0, 1, 1]
    assert list(aggregate(data, groups).columns) == ["group", "step", "mean", "sd", "low", "high", "n", "runs"]
    with pytest.raises(KeyError, match="no group"):
        aggregate(data, {"s0": "grpo"})
    assert list(aggregate(data.iloc[:0], groups).columns) == list(aggregate(data, groups).columns)


def test_smoothing_before_the_mean() -> None:
    # Two seeds, weight 0.5: s0 = 0, 2 -> 0, (0 + 2) / 1.5 = 1.3333 ; s1 = 2, 0 -> 2, (0.5*2 + 0) / 1.5 = 0.6667
    # step 2 mean (1.3333 + 0.6667) / 2 = 1, sd |1.3333 - 0.6667| / sqrt(2) = 0.4714
    data = pd.DataFrame({"run": ["s0", "s0", "s1", "s1"], "step": [1, 2, 1, 2], "value": [0.0, 2.0, 2.0, 0.0]})
    got = aggregate(smooth(data, 0.5), {"s0": "g", "s1": "g"}).set_index("step")
    assert got.at[2, "mean"] == pytest.approx(1.0, abs=1e-15)
    assert got.at[2, "sd"] == pytest.approx((4 / 3 - 2 / 3) / math.sqrt(2), abs=1e-15)


def test_label_fields_by_run_and_by_group() -> None:
    table = config_table(CONFIGS)
    groups = group_labels(table, ["algo"]).to_dict()
    runs = pd.DataFrame({"run": ["grpo-s0", "gspo-s0"], "step": [1, 1], "value": [0.0, 1.0]})
    got = label_fields(runs, table, groups, ["algo", "rollout_dtype"])
    assert list(got.columns) == ["run", "algo", "rollout_dtype", "step", "value"]
    assert got["rollout_dtype"].tolist() == ["rollout_dtype=float32", "rollout_dtype=bfloat16"]
    bands = aggregate(runs.assign(run=["grpo-s0", "grpo-s1"]), groups)
    got = label_fields(bands, table, groups, ["algo", "rollout_dtype"])
    assert got["algo"].tolist() == ["algo=grpo"]
    # gspo's runs differ in rollout_dtype (not a group field here): both values, joined
    gspo = label_fields(pd.DataFrame({"group": ["algo=gspo"]}), table, groups, ["rollout_dtype"])
    assert gspo["rollout_dtype"].tolist() == [f"rollout_dtype=bfloat16 / rollout_dtype={ABSENT}"]
    assert named_values(table, "lr").tolist() == ["lr=0.0002"] * 3 + [f"lr={ABSENT}"]
    with pytest.raises(ValueError, match="named like columns"):
        label_fields(runs, table, groups, ["step"])


def test_step_domain() -> None:
    assert step_domain([pd.DataFrame({"step": [3, 5]}), pd.DataFrame({"step": [0, 2]}), pd.DataFrame({"step": []})]) \
        == (0, 5)
    assert step_domain([pd.DataFrame({"step": []})]) is None


def test_thin_bins_long_curves_on_one_grid_and_leaves_short_ones() -> None:
    short = pd.DataFrame({"run": ["a"] * 3, "step": [1, 2, 3], "value": [0.1, 0.2, 0.3]})
    same, width = thin(short, max_steps=3)
    assert width == 1 and same is short
    steps = np.arange(1, 10_001)
    long = pd.concat([pd.DataFrame({"run": "a", "step": steps, "value": steps.astype(float)}),
                      pd.DataFrame({"run": "b", "step": steps[::2], "value": np.where(steps[::2] == 3, np.nan, 1.0)})],
                     ignore_index=True)
    thinned, width = thin(long, max_steps=2000)
    assert width == 5 and thinned["step"].nunique() == 2000
    a = thinned[thinned["run"] == "a"].set_index("step")["value"]
    assert a.loc[1] == np.mean([1, 2, 3, 4, 5]) and a.loc[9996] == np.mean(np.arange(9996, 10_001))  # bin means
    b = thinned[thinned["run"] == "b"].set_index("step")["value"]
    assert list(b.index[:2]) == [1, 6] and b.loc[1] == 1.0  # steps 1 and 5 (3 is NaN: left out), on a's grid
    assert list(dict.fromkeys(thinned["run"])) == ["a", "b"]
    assert thinned.groupby("run")["step"].is_monotonic_increasing.all()
    with pytest.raises(ValueError, match="max_steps must be >= 1"):
        thin(long, max_steps=0)
