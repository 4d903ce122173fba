"""moestab.analysis.compare's "by how much": the step window every run has, each run's mean over it, each group's
mean +- se over its runs, and the paired difference of two groups by seed with its t-interval; against hand-worked
numbers (the arithmetic in the comments) and a second computation with plain Python."""

from __future__ import annotations

import math
import statistics

import pandas as pd
import pytest

from moestab.analysis.compare import (
    ABSENT,
    IDENTITY_FIELDS,
    common_steps,
    config_table,
    curves,
    default_group_fields,
    group_stats,
    paired_difference,
    step_ranges,
    varying_fields,
    window_means,
)

KEY = "routing/old_new/changed"


def run(steps: int, values: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"step": list(range(1, steps + 1)), KEY: values})


# GRPO ran 4 steps, GSPO 6 (the 17 against 57, shrunk): the common window is steps 1-4.
FRAMES = {
    "grpo-s0": run(4, [0.10, 0.20, 0.30, 0.40]),
    "grpo-s1": run(4, [0.30, 0.30, 0.30, 0.50]),
    "gspo-s0": run(6, [0.05, 0.05, 0.05, 0.05, 0.90, 0.90]),  # steps 5-6 outside the window
    "gspo-s1": run(6, [0.10, 0.10, 0.10, 0.10, 0.90, 0.90]),
}
GROUPS = {"grpo-s0": "grpo", "grpo-s1": "grpo", "gspo-s0": "gspo", "gspo-s1": "gspo"}
SEEDS = {"grpo-s0": "0", "grpo-s1": "1", "gspo-s0": "0", "gspo-s1": "1"}


def test_common_steps_is_the_range_every_run_has() -> None:
    assert step_ranges(FRAMES) == {"grpo-s0": (1, 4), "grpo-s1": (1, 4), "gspo-s0": (1, 6), "gspo-s1": (1, 6)}
    assert common_steps(FRAMES) == (1, 4)
    late = {**FRAMES, "late": pd.DataFrame({"step": [3, 4, 5], KEY: [0.0] * 3})}
    assert common_steps(late) == (3, 4)
    assert common_steps({**FRAMES, "apart": pd.DataFrame({"step": [7, 8], KEY: [0.0] * 2})}) is None  # no overlap
    assert common_steps({**FRAMES, "empty": pd.DataFrame({"step": [], KEY: []})}) is None  # a run without a step
    assert common_steps({}) is None


def test_window_means_average_the_same_steps_for_every_run() -> None:
    means = window_means(curves(FRAMES, KEY), (1, 4)).set_index("run")
    # grpo-s0: (0.1 + 0.2 + 0.3 + 0.4) / 4 = 0.25; grpo-s1: 1.4 / 4 = 0.35; gspo: 0.05, 0.1 (steps 5-6 left out).
    assert means["mean"].to_dict() == pytest.approx({"grpo-s0": 0.25, "grpo-s1": 0.35, "gspo-s0": 0.05,
                                                     "gspo-s1": 0.1}, abs=1e-15)
    assert means[["steps", "first", "last"]].values.tolist() == [[4, 1, 4]] * 4
    narrow = window_means(curves(FRAMES, KEY), (2, 3)).set_index("run")["mean"]  # grpo-s0: (0.2 + 0.3) / 2
    assert narrow["grpo-s0"] == pytest.approx(0.25) and narrow["gspo-s1"] == pytest.approx(0.1)
    # A run with no value in the window is left out; a step without a value does not count.
    gaps = {"a": pd.DataFrame({"step": [1, 2, 3], KEY: [0.2, None, 0.4]}), "b": run(1, [0.9])}
    out = window_means(curves(gaps, KEY), (2, 3))
    assert out["run"].tolist() == ["a"] and out["mean"].tolist() == [0.4] and out["steps"].tolist() == [1]
    with pytest.raises(ValueError, match="forwards"):
        window_means(curves(FRAMES, KEY), (3, 2))


def test_group_stats_mean_and_standard_error_over_runs() -> None:
    stats = group_stats(window_means(curves(FRAMES, KEY), (1, 4)), GROUPS).set_index("group")
    # grpo: 0.25, 0.35 -> mean 0.3, sd sqrt((0.05^2 + 0.05^2) / 1) = 0.070711, se = sd / sqrt(2) = 0.05
    assert stats.loc["grpo", "runs"] == 2
    assert stats.loc["grpo", "mean"] == pytest.approx(0.3, abs=1e-15)
    assert stats.loc["grpo", "se"] == pytest.approx(0.05, abs=1e-15)
    # gspo: 0.05, 0.1 -> mean 0.075, sd 0.035355, se 0.025
    assert stats.loc["gspo", "mean"] == pytest.approx(0.075) and stats.loc["gspo", "se"] == pytest.approx(0.025)
    one = group_stats(window_means(curves({"x": run(2, [0.1, 0.3])}, KEY), (1, 2)), {"x": "g"})
    assert one["mean"].tolist() == pytest.approx([0.2]) and math.isnan(one["se"][0])  # one run: no se
    with pytest.raises(KeyError, match="no group"):
        group_stats(window_means(curves(FRAMES, KEY), (1, 4)), {"grpo-s0": "grpo"})


def test_paired_difference_matches_runs_by_seed() -> None:
    means = window_means(curves(FRAMES, KEY), (1, 4))
    diff = paired_difference(means, GROUPS, SEEDS, "grpo", "gspo")
    # seed 0: 0.25 - 0.05 = 0.2; seed 1: 0.35 - 0.1 = 0.25 -> mean 0.225, sd sqrt(2 * 0.025^2) = 0.035355,
    # 95% t-interval: 0.225 -+ t(0.975, 1) * 0.035355 / sqrt(2) = 0.225 -+ 12.7062 * 0.025 = [-0.0927, 0.5427]
    assert diff.pairs[["seed", "run_a", "run_b"]].values.tolist() == [["0", "grpo-s0", "gspo-s0"],
                                                                    ["1", "grpo-s1", "gspo-s1"]]
    assert diff.pairs["difference"].tolist() == pytest.approx([0.2, 0.25], abs=1e-15)
    ci = diff.interval
    assert ci.n == 2 and ci.mean == pytest.approx(0.225, abs=1e-15)
    assert ci.low == pytest.approx(0.225 - 12.706204736 * 0.025, rel=1e-8)
    assert ci.high == pytest.approx(0.225 + 12.706204736 * 0.025, rel=1e-8)
    assert diff.unpaired == ()
    # The other order: the same differences, negated.
    assert paired_difference(means, GROUPS, SEEDS, "gspo", "grpo").interval.mean == pytest.approx(-0.225)

    # Pairing by seed, not by position: the same runs listed in another order give the same pairs.
    shuffled = means.iloc[[3, 0, 2, 1]].reset_index(drop=True)
    assert paired_difference(shuffled, GROUPS, SEEDS, "grpo", "gspo").interval.mean == pytest.approx(0.225)


def test_runs_that_cannot_be_paired_are_named_with_the_reason() -> None:
    frames = {**FRAMES, "grpo-s2": run(4, [0.5] * 4), "gspo-dup": run(4, [0.7] * 4), "grpo-x": run(4, [0.0] * 4)}
    groups = {**GROUPS, "grpo-s2": "grpo", "gspo-dup": "gspo", "grpo-x": "grpo"}
    seeds = {**SEEDS, "grpo-s2": "2", "gspo-dup": "1", "grpo-x": ABSENT}
    diff = paired_difference(window_means(curves(frames, KEY), (1, 4)), groups, seeds, "grpo", "gspo")
    assert diff.pairs["seed"].tolist() == ["0"] and diff.interval.n == 1 and math.isnan(diff.interval.low)
    assert dict(diff.unpaired) == {
        "grpo-x": "its config names no seed",
        "grpo-s1": "seed 1 has 2 runs in gspo",  # which gspo run to pair it with is not known
        "gspo-s1": "seed 1 has 2 runs in gspo",
        "gspo-dup": "seed 1 has 2 runs in gspo",
        "grpo-s2": "no run of seed 2 in gspo has a value in the window",
    }
    with pytest.raises(ValueError, match="two groups"):
        paired_difference(window_means(curves(FRAMES, KEY), (1, 4)), GROUPS, SEEDS, "grpo", "grpo")


def test_against_plain_python_on_uneven_seeds() -> None:
    """Three seeds with a run missing steps: means, se and the paired mean recomputed with loops."""
    values = {
        "a0": [0.11, 0.13, None, 0.17], "a1": [0.21, 0.19, 0.23, 0.29], "a2": [0.05, 0.07, 0.02, 0.08],
        "b0": [0.01, 0.02, 0.03, 0.04], "b1": [0.06, None, None, 0.01], "b2": [0.09, 0.09, 0.08, 0.07],
    }
    frames = {name: pd.DataFrame({"step": [1, 2, 3, 4], KEY: v}) for name, v in values.items()}
    groups = {name: name[0] for name in values}
    seeds = {name: name[1] for name in values}
    means = window_means(curves(frames, KEY), (2, 4)).set_index("run")["mean"]
    expected = {name: statistics.fmean([x for x in v[1:] if x is not None]) for name, v in values.items()}
    assert means.to_dict() == pytest.approx(expected, rel=1e-14)
    stats = group_stats(means.reset_index(), groups).set_index("group")
    a = [expected[f"a{i}"] for i in range(3)]
    assert stats.loc["a", "se"] == pytest.approx(statistics.stdev(a) / math.sqrt(3), rel=1e-12)
    diff = paired_difference(means.reset_index(), groups, seeds, "a", "b").interval
    d = [expected[f"a{i}"] - expected[f"b{i}"] for i in range(3)]
    assert diff.mean == pytest.approx(statistics.fmean(d), rel=1e-12)
    assert diff.high - diff.mean == pytest.approx(4.302652730 * statistics.stdev(d) / math.sqrt(3), rel=1e-8)


def test_planned_steps_are_no_condition() -> None:
    """Runs planned for 17 and 57 steps ran the same condition: ``steps`` is not grouped by at first."""
    table = config_table({"g": {"algo": "grpo", "steps": 17, "seed": 0}, "s": {"algo": "gspo", "steps": 57, "seed": 0}})
    assert varying_fields(table) == ["algo", "steps"] and "steps" in IDENTITY_FIELDS
    assert default_group_fields(varying_fields(table), table) == ["algo"]


def test_how_a_run_was_measured_is_no_condition() -> None:
    """The quick start measures every 4th step and evaluates on 200 problems, a sweep every step on 1,000: the same
    condition (issue 54.3). The lr still tells conditions apart."""
    quick = {"algo": "grpo", "lr": 2e-4, "measure_every": 4, "eval_every": 10, "eval_size": 200, "threads": 2,
             "save_every": 20, "routing_share": False, "record_fraction": 1.0, "seed": 0}
    sweep = {**quick, "measure_every": 1, "eval_every": 5, "eval_size": 1000, "threads": 1, "save_every": 5,
             "routing_share": True, "record_fraction": 0.5, "measure_base_routes": True, "seed": 1}
    table = config_table({"quick": quick, "sweep": sweep, "other": {**sweep, "lr": 4e-4, "seed": 2}})
    assert default_group_fields(varying_fields(table), table) == ["lr"]
