"""The notebooks' figure helpers (moestab.experiments.figures): integer x axes get integer ticks, one small panel per
group with its title, its own band and the other groups' means in grey; warning timelines draw each run's warnings,
onset and hit window where the table puts them; recall curves one line per rule."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from moestab.experiments.figures import plot_mean_sd, plot_recall_curves, plot_small_multiples, plot_warning_timelines

# 2 arms x 2 seeds x steps 0..3 (matplotlib's own ticks there: 0, 0.5, 1, ...): arm a's mean is the step, arm b's
# 10 + step; the two seeds 1 either side.
FRAME = pd.DataFrame([{"arm": arm, "seed": seed, "step": step, "acc": base + step + (1 if seed else -1)}
                      for arm, base in (("a", 0), ("b", 10)) for seed in (0, 1) for step in range(4)])


def test_an_integer_x_gets_integer_ticks_and_a_float_x_keeps_its_own():
    fig, ints = plt.subplots(figsize=(6.4, 4.8))  # wide enough for matplotlib's own ticks to go by 0.5
    plot_mean_sd(ints, FRAME, "step", "acc", by=["arm"])
    fig.canvas.draw()
    assert [t for t in ints.get_xticks() if 0 <= t <= 3] == [0, 1, 2, 3]
    fig, floats = plt.subplots(figsize=(6.4, 4.8))
    plot_mean_sd(floats, FRAME.assign(step=FRAME.step / 3), "step", "acc", by=["arm"])
    fig.canvas.draw()
    assert not all(float(t).is_integer() for t in floats.get_xticks())  # 0..1: fractional ticks are right there
    plt.close("all")


def test_small_multiples_one_titled_panel_per_group_with_the_others_in_grey():
    fig, axes = plt.subplots(1, 2, sharey=True)
    plot_small_multiples(axes, FRAME, "step", "acc", "arm", styles={"b": {"color": "black", "linestyle": "--"}},
                         order=["b", "a"])
    assert [ax.get_title() for ax in axes] == ["b", "a"]
    grey, own = axes[0].get_lines()  # the other group's mean first (under), then this group's
    assert grey.get_color() == "0.75" and list(grey.get_ydata()) == [0.0, 1.0, 2.0, 3.0]
    assert own.get_color() == "black" and own.get_linestyle() == "--"
    assert list(own.get_ydata()) == [10.0, 11.0, 12.0, 13.0]
    band = axes[0].collections[0].get_paths()[0].vertices[:, 1]  # mean +- sd, sd of (-1, +1) = sqrt(2)
    assert band.min() == pytest.approx(10 - 2**0.5) and band.max() == pytest.approx(13 + 2**0.5)
    plt.close(fig)
    with pytest.raises(ValueError, match="2 groups of 'arm' need 2 axes; got 3"):
        plot_small_multiples(plt.subplots(1, 3)[1], FRAME, "step", "acc", "arm")
    plt.close("all")


def test_warning_timelines_put_warnings_onset_and_hit_window_on_each_runs_row():
    runs = pd.DataFrame([
        {"arm": "a", "seed": 1, "collapsed": True, "onset": 60, "warnings": "20 45", "hit": True, "lead": 15.0,
         "false_alarms": 0},
        {"arm": "a", "seed": 2, "collapsed": False, "onset": float("nan"), "warnings": "70", "hit": False,
         "lead": float("nan"), "false_alarms": 1},
        {"arm": "b", "seed": 3, "collapsed": True, "onset": 90, "warnings": float("nan"), "hit": False,
         "lead": float("nan"), "false_alarms": 0},
    ])
    fig, ax = plt.subplots()
    plot_warning_timelines(ax, runs, horizon=30, steps=100)
    labels = dict(zip(ax.get_yticks(), [t.get_text() for t in ax.get_yticklabels()], strict=True))
    assert labels == {2: "a 1: hit, lead 15", 1: "a 2: 1 false alarm(s)", 0: "b 3: missed"}  # the first run on top
    ticks = {(x, y) for line in ax.get_lines() if line.get_marker() == "|" for x, y in line.get_xydata()}
    assert ticks == {(20, 2), (45, 2), (70, 1)}
    crosses = {(x, y) for line in ax.get_lines() if line.get_marker() == "x" for x, y in line.get_xydata()}
    assert crosses == {(60, 2), (90, 0)}
    windows = sorted((path.get_extents().x0, path.get_extents().x1) for c in ax.collections
                     if c.get_alpha() == 0.25 for path in c.get_paths())
    assert windows == [(30, 59), (60, 89)]  # [onset - 30, onset - 1]
    plt.close(fig)


def test_warning_timelines_read_a_csv_whose_warnings_are_single_steps(tmp_path):
    """A CSV whose every warning cell holds one step reads back as numbers: still drawn, not dropped."""
    runs = pd.DataFrame([{"arm": "a", "seed": s, "collapsed": False, "onset": float("nan"), "warnings": w,
                          "hit": False, "lead": float("nan"), "false_alarms": n}
                         for s, w, n in ((1, "20", 1), (2, "", 0))])
    runs.to_csv(tmp_path / "runs.csv", index=False)
    back = pd.read_csv(tmp_path / "runs.csv")
    assert back["warnings"].dtype.kind == "f"  # 20.0 and NaN
    fig, ax = plt.subplots()
    plot_warning_timelines(ax, back, horizon=30, steps=100)
    ticks = {(x, y) for line in ax.get_lines() if line.get_marker() == "|" for x, y in line.get_xydata()}
    assert ticks == {(20, 1)}
    plt.close(fig)


def test_recall_curves_one_line_per_rule_in_rate_order():
    curve = pd.DataFrame({"rule": ["r", "r", "s"], "fa": [1.0, 0.5, 0.5], "recall": [0.6, 0.4, 0.2]})
    fig, ax = plt.subplots()
    plot_recall_curves(ax, curve, "fa", "recall")
    lines = {line.get_label(): line.get_xydata().tolist() for line in ax.get_lines()}
    assert lines == {"r": [[0.5, 0.4], [1.0, 0.6]], "s": [[0.5, 0.2]]}
    plt.close(fig)
