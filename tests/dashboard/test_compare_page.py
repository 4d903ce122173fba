"""The Compare page under AppTest, on real run folders written by DiagnosticsRun (the run writer of any trainer):
groups, mean +- sd over seeds, smoothing, the metric picker, colour and dash fields, and the notes that name every
run left out of a view and why. The numbers are hand-worked in the comments.

Runs (steps 1, 2, 3):

- ``grpo/s0`` and ``grpo/s1`` (trainer verl, algo grpo): old -> new changed 0.1 0.2 0.3 and 0.3 0.4 0.5;
- ``gspo/s0`` and ``gspo/s1`` (verl, gspo): changed 0.05 and 0.15 at every step;
- ``trl-gspo`` (trainer trl, gspo): changed 0.2 at every step and no reward, eval or ratio keys (as a TRL run);
- ``started``: running, no step yet; ``archive/2025/sweep/deep``: 4 levels down, below the search depth.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from moestab.analysis.compare import DEFAULT_KEYS
from moestab.recording.diagnostics import DiagnosticsRun
from moestab.run_folder import schema
from tests.support.dashboard import (
    COMPARE_PAGE,
    RUNS_PAGE,
    T_975_DF1,
    assert_interactive_with_csv,
    chart_alts,
    chart_named,
    charts_on,
    shown_number,
    texts,
)

CHANGED = "routing/old_new/changed"
MEAN_BY_GROUP = "against step, mean ± sd by group"
EACH_RUN = "against step, each run"
VERL_KEYS = {key: [0.5, 0.6, 0.7] for key in DEFAULT_KEYS}  # every headline key, for the verl runs


def write(path: Path, trainer: str, algo: str, series: dict[str, list]) -> None:
    """A run of as many steps as the series have values (3 unless said), planned for as many."""
    steps = len(next(iter(series.values())))
    with DiagnosticsRun(path, trainer=trainer, algo=algo, model="tiny", layers=[0, 1], num_experts=4, top_k=2,
                        steps=steps) as run:
        for i in range(steps):
            run.log(i + 1, {key: values[i] for key, values in series.items()})


@pytest.fixture
def compare_runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    write(root / "grpo" / "s0", "verl", "grpo", {**VERL_KEYS, "reward/mean": [0.1, 0.2, 0.3], CHANGED: [0.1, 0.2, 0.3]})
    write(root / "grpo" / "s1", "verl", "grpo", {**VERL_KEYS, "reward/mean": [0.3, 0.4, 0.5], CHANGED: [0.3, 0.4, 0.5]})
    write(root / "gspo" / "s0", "verl", "gspo", {**VERL_KEYS, "reward/mean": [0.5] * 3, CHANGED: [0.05] * 3})
    write(root / "gspo" / "s1", "verl", "gspo", {**VERL_KEYS, "reward/mean": [0.7] * 3, CHANGED: [0.15] * 3})
    write(root / "trl-gspo", "trl", "gspo", {CHANGED: [0.2] * 3})
    write(root / "archive" / "2025" / "sweep" / "deep", "verl", "grpo", {CHANGED: [0.9] * 3})
    # A run that has just started: running (its writer, this process, is alive), no metrics yet.
    started = json.loads((root / "grpo" / "s0" / schema.RUN_JSON).read_text())
    started.update(status="running", last_step=0)
    (root / "started").mkdir()
    (root / "started" / schema.RUN_JSON).write_text(json.dumps(started))
    return root


def group_rows(at, key: str, group: str):
    data = chart_named(at, f"{key} {MEAN_BY_GROUP}").data
    rows = data[data["group"] == group].set_index("step")
    assert len(rows), (group, sorted(set(data["group"])))
    return rows


def test_compare_is_the_first_page_and_groups_seeds(make_app, compare_runs: Path, downloads: dict) -> None:
    at = make_app(compare_runs).run()
    assert not at.exception and not at.error and not at.warning, texts([*at.exception, *at.error, *at.warning])
    assert [t.value for t in at.title] == ["Compare"]
    # Every readable run is selected at first (the running one too: its run.json is readable).
    selected = {Path(p).relative_to(compare_runs).as_posix() for p in at.session_state["moestab_selected_runs"]}
    assert selected == {"grpo/s0", "grpo/s1", "gspo/s0", "gspo/s1", "trl-gspo", "started"}
    # trainer and algo vary (routing_replay, model and steps do not): seeds of one condition share a group.
    assert at.multiselect(key="compare_group_by").value == ["trainer", "algo"]
    assert at.selectbox(key="compare_color").value == "algo" and at.selectbox(key="compare_dash").value == "trainer"
    groups = at.dataframe[0].value.set_index("group")
    assert groups["runs"].to_dict() == {"trainer=verl, algo=grpo": 2, "trainer=verl, algo=gspo": 2,
                                        "trainer=trl, algo=gspo": 1}
    # The six headline charts, in order, on one step axis.
    assert chart_alts(at) == [f"{key} {MEAN_BY_GROUP}" for key in DEFAULT_KEYS]
    # grpo, step 1: 0.1 and 0.3 -> mean 0.2, sd sqrt((0.1^2 + 0.1^2) / 1) = 0.141421; step 3: 0.3, 0.5 -> 0.4
    grpo = group_rows(at, CHANGED, "trainer=verl, algo=grpo")
    np.testing.assert_allclose(grpo["mean"], [0.2, 0.3, 0.4], atol=1e-12)
    np.testing.assert_allclose(grpo["sd"], [math.sqrt(0.02)] * 3, atol=1e-12)
    np.testing.assert_allclose(grpo["low"], grpo["mean"] - grpo["sd"], atol=1e-15)
    assert grpo["n"].tolist() == [2, 2, 2] and set(grpo["algo"]) == {"algo=grpo"}
    # the TRL run is a group of its own: its line, no band (one run has no sd)
    trl = group_rows(at, CHANGED, "trainer=trl, algo=gspo")
    assert trl["mean"].tolist() == [0.2] * 3 and trl["sd"].isna().all()
    spec = chart_named(at, f"{CHANGED} {MEAN_BY_GROUP}").spec
    encodings = [layer.get("encoding", {}) for layer in spec["layer"]]
    assert any(e.get("color", {}).get("field") == "algo" for e in encodings)
    assert any(e.get("strokeDash", {}).get("field") == "trainer" for e in encodings)
    domains = {json.dumps(layer["encoding"]["x"]["scale"]["domain"])
               for chart in charts_on(at) for layer in chart.spec["layer"] if "scale" in layer["encoding"].get("x", {})}
    assert domains == {"[1, 3]"}  # one step axis for every chart
    assert_interactive_with_csv(at, downloads)
    # Nothing vanishes without a word: the TRL run lacks the outcome keys, the started run has no step, the deep
    # run lies below the search depth.
    notes = texts(at.info)
    assert "`reward/mean`: trl-gspo" in notes and "`eval/accuracy`: trl-gspo" in notes
    assert "**started**: no completed step yet (the run is still running)" in notes
    sidebar = texts(at.sidebar.info)
    assert "1 run folder(s) lie more than 3 levels below" in sidebar and "`archive/2025/sweep/deep`" in sidebar


def test_smoothing_the_metric_picker_and_each_run(make_app, compare_runs: Path) -> None:
    at = make_app(compare_runs).run()
    picker = at.multiselect(key="compare_metrics")
    # Every scalar key of the runs, with how many runs logged it (the TRL run has only CHANGED).
    assert set(picker.options) == {f"{key} ({4 if key != CHANGED else 5}/5 runs)" for key in DEFAULT_KEYS}
    picker.set_value([CHANGED]).run()
    assert chart_alts(at) == [f"{CHANGED} {MEAN_BY_GROUP}"]
    assert "Not every run has every chosen metric" not in texts(at.info)  # every run has the one chosen key

    # EMA weight 0.5 (debiased), grpo/s0 0.1 0.2 0.3: 0.1, (0.05 + 0.2) / 1.5 = 0.166667, (0.125 + 0.3) / 1.75
    # = 0.242857; grpo/s1 0.3 0.4 0.5: 0.3, 0.366667, 0.442857 -> mean 0.2, 0.266667, 0.342857; the seeds stay 0.2
    # apart (the EMA is linear), so the sd stays sqrt(0.02).
    at.slider(key="compare_smoothing").set_value(0.5).run()
    grpo = group_rows(at, CHANGED, "trainer=verl, algo=grpo")
    np.testing.assert_allclose(grpo["mean"], [0.2, 0.4 / 1.5, 0.6 / 1.75], atol=1e-12)
    np.testing.assert_allclose(grpo["sd"], [math.sqrt(0.02)] * 3, atol=1e-12)

    # Group by algo alone: the TRL run joins the gspo seeds. gspo at step 1 (constant runs: the EMA keeps them):
    # 0.05, 0.15, 0.2 -> mean 0.4 / 3 = 0.133333, sd sqrt((0.083333^2 + 0.016667^2 + 0.066667^2) / 2) = 0.076376
    at.multiselect(key="compare_group_by").set_value(["algo"]).run()
    assert at.selectbox(key="compare_color").value == "algo" and at.selectbox(key="compare_dash").value == "none"
    gspo = group_rows(at, CHANGED, "algo=gspo")
    assert gspo["n"].tolist() == [3, 3, 3]
    np.testing.assert_allclose(gspo["mean"], [0.4 / 3] * 3, atol=1e-12)
    np.testing.assert_allclose(gspo["sd"], [math.sqrt((0.0069444444 + 0.0002777778 + 0.0044444444) / 2)] * 3,
                               atol=1e-9)
    spec = chart_named(at, f"{CHANGED} {MEAN_BY_GROUP}").spec
    assert not any("strokeDash" in layer.get("encoding", {}) for layer in spec["layer"])

    # Each run instead of the mean: one line per run, coloured by its algo, smoothed as before.
    at.radio(key="compare_mode").set_value("each run").run()
    data = chart_named(at, f"{CHANGED} {EACH_RUN}").data
    assert sorted(set(data["run"])) == ["grpo/s0", "grpo/s1", "gspo/s0", "gspo/s1", "trl-gspo"]
    s0 = data[data["run"] == "grpo/s0"]
    np.testing.assert_allclose(s0["value"], [0.1, 0.25 / 1.5, 0.425 / 1.75], atol=1e-12)
    assert set(data.loc[data["run"] == "trl-gspo", "group"]) == {"algo=gspo"}
    assert not at.exception and not at.error


def test_a_run_left_out_is_named_with_the_reason(make_app, compare_runs: Path) -> None:
    broken = compare_runs / "broken"
    broken.mkdir()
    (broken / schema.RUN_JSON).write_text('{"schema_version": 1, "status": "fin')
    at = make_app(compare_runs).run()
    assert "**broken** (run.json cannot be read" in texts(at.info)  # unreadable: not selected, but named
    at.switch_page(RUNS_PAGE).run()
    widget = at.multiselect(key="moestab_select_widget")
    widget.set_value([p for p in widget.value if not p.endswith("grpo/s1")]).run()
    at.switch_page(COMPARE_PAGE).run()
    assert "**grpo/s1** (not selected on the Runs page)" in texts(at.info)
    assert at.dataframe[0].value.set_index("group").at["trainer=verl, algo=grpo", "runs"] == 1
    # A run that appears later is selected at once; the one deselected stays out.
    write(compare_runs / "grpo" / "s2", "verl", "grpo", {CHANGED: [0.2] * 3})
    at.run()
    selected = {Path(p).relative_to(compare_runs).as_posix() for p in at.session_state["moestab_selected_runs"]}
    assert "grpo/s2" in selected and "grpo/s1" not in selected
    assert not at.exception


def test_every_readable_run_is_selected_even_beyond_six(make_app, tmp_path: Path) -> None:
    """The old default stopped at six runs and left the rest out unsaid; now every readable run is selected."""
    root = tmp_path / "runs"
    for i in range(8):
        write(root / f"seed-{i}", "verl", "grpo", {CHANGED: [0.1 * i] * 3})
    at = make_app(root).run()
    assert not at.exception and not at.error
    assert len(at.session_state["moestab_selected_runs"]) == 8
    assert at.multiselect(key="compare_group_by").value == []  # nothing varies: one group
    assert at.dataframe[0].value[["group", "runs"]].values.tolist() == [["all runs", 8]]
    # step 1: 0, 0.1, ..., 0.7 -> mean 0.35; sample variance of 0..7 is 42 / 7 = 6, so sd = 0.1 * sqrt(6) = 0.244949
    rows = group_rows(at, CHANGED, "all runs")
    assert rows.at[1, "mean"] == pytest.approx(0.35, abs=1e-12)
    assert rows.at[1, "sd"] == pytest.approx(0.1 * math.sqrt(6), abs=1e-12)
    assert rows.at[1, "n"] == 8


K3 = "mismatch/rollout_old/k3"


@pytest.fixture
def uneven_runs(tmp_path: Path) -> Path:
    """GRPO to step 3, GSPO to step 5 (the issue's 17 against 57, shrunk); k3 at float precision in every run."""
    root = tmp_path / "runs"
    tiny = [1e-13, 3e-14, 2e-13]
    write(root / "grpo" / "s0", "verl", "grpo", {CHANGED: [0.1, 0.2, 0.3], K3: tiny})
    write(root / "grpo" / "s1", "verl", "grpo", {CHANGED: [0.3, 0.4, 0.5], K3: [2e-13, 1e-13, 3e-13]})
    write(root / "gspo" / "s0", "verl", "gspo", {CHANGED: [0.05] * 3 + [0.9] * 2, K3: tiny + tiny[:2]})
    write(root / "gspo" / "s1", "verl", "gspo", {CHANGED: [0.15] * 3 + [0.9] * 2, K3: tiny + tiny[:2]})
    return root


def by_how_much(at) -> dict[tuple[str, str], dict]:
    """The group table of the "By how much" section: (metric title, group) -> its row."""
    frame = at.table[0].value.reset_index()
    return {(row["metric"], row["group"]): row for row in frame.to_dict("records")}


def test_by_how_much_uses_the_steps_every_run_has(make_app, uneven_runs: Path) -> None:
    at = make_app(uneven_runs).run()
    assert not at.exception and not at.error, texts([*at.exception, *at.error])
    # steps (3 against 5) is no condition: the runs group by algo alone.
    assert at.multiselect(key="compare_group_by").value == ["algo"]
    at.multiselect(key="compare_metrics").set_value([CHANGED, K3]).run()
    assert at.slider(key="compare_window").value == (1, 3)  # the steps every run has
    caption = texts(at.caption)
    assert "Every run's mean over steps 1–3, the same steps for every run" in caption
    assert "gspo/s0 (steps 1–5)" in caption and "gspo/s1 (steps 1–5)" in caption  # their later steps left out
    rows = by_how_much(at)
    # grpo: window means 0.2 and 0.4 -> 0.3 = 30%; se = sd / sqrt(2) = 0.141421 / 1.414214 = 0.1 = 10%.
    grpo = rows[("Routing change old → new", "algo=grpo")]
    assert (grpo["runs"], grpo["mean"], grpo["± se"], grpo["unit"]) == (2, "30%", "10%", "% of routed slots")
    # gspo over steps 1-3: 0.05 and 0.15 -> 10% +- 5% (over steps 1-5 it would be 39% and 45%).
    gspo = rows[("Routing change old → new", "algo=gspo")]
    assert (gspo["mean"], gspo["± se"]) == ("10%", "5%")
    # k3 ~ 1e-13 is zero at float precision, said so; its unit in words.
    k3 = rows[("Mismatch rollout → trainer (pi_old as used), k3 estimate", "algo=grpo")]
    assert (k3["mean"], k3["± se"], k3["unit"]) == ("0 (at float precision)", "0 (at float precision)",
                                                    "nats per token")
    # Narrowed to steps 2-3: grpo 0.25 and 0.45 -> 35% +- 10%.
    at.slider(key="compare_window").set_value((2, 3)).run()
    assert by_how_much(at)[("Routing change old → new", "algo=grpo")]["mean"] == "35%"
    assert "Every run's mean over steps 2–3" in texts(at.caption)
    # No seed in a diagnostics run's config: nothing to pair, and each run is named with the reason.
    assert at.selectbox(key="compare_diff_a").value == "algo=grpo"
    assert at.selectbox(key="compare_diff_b").value == "algo=gspo"
    assert "No seed has a run in both algo=grpo and algo=gspo" in texts(at.info)
    assert "Left out of the pairs of *Routing change old → new*: **grpo/s0** (its config names no seed)" in texts(
        at.caption)
    # Readable chart titles and axis labels in words with units; shares drawn in percent.
    spec = chart_named(at, f"{CHANGED} {MEAN_BY_GROUP}").spec
    assert spec["title"]["text"] == ["Routing change old → new"]
    line = spec["layer"][1]["encoding"]
    assert line["y"]["title"] == "% of routed slots" and line["y"]["axis"]["format"] == "~p"
    assert line["x"]["title"] == "training step"
    for chart in charts_on(at):
        assert "`" not in json.dumps(chart.spec["title"]), chart.spec["title"]


def test_the_runs_page_says_which_steps_its_means_cover(make_app, uneven_runs: Path) -> None:
    import pyarrow as pa

    at = make_app(uneven_runs).run()
    at.switch_page(RUNS_PAGE).run()
    table = at.dataframe[0].value.set_index("run")
    assert table["means_over"].to_dict() == {"grpo/s0": "1–3", "grpo/s1": "1–3", "gspo/s0": "1–5", "gspo/s1": "1–5"}
    warning = texts(at.warning)
    assert "The runs' means cover different steps" in warning and "gspo/s0 1–5" in warning
    # The numbers stay numbers; the cells show percent for shares and 0 at float precision for k3.
    assert table.at["grpo/s0", "old_new_changed"] == pytest.approx(0.2)
    shown = pa.ipc.open_stream(at.dataframe[0].proto.arrow_data.styler.display_values).read_pandas()
    columns = list(at.dataframe[0].value.columns)
    first = shown.iloc[0]
    assert first.iloc[columns.index("old_new_changed")] == "20%"
    assert first.iloc[columns.index("rollout_old_k3")] == "0 (at float precision)"


def assert_shown(text: str, expected: float) -> None:
    """``text`` (three significant digits) is ``expected`` rounded: within half a unit of its third digit."""
    assert shown_number(text) == pytest.approx(expected, rel=5.01e-3, abs=1e-12), (text, expected)


@pytest.mark.slow
def test_grpo_minus_gspo_paired_by_seed(make_app, algo_seed_runs: Path) -> None:
    """GRPO (4 steps) against GSPO (5 steps) on seeds 0 and 1: the page's paired difference of the old -> new routing
    change over steps 1-4 is the one computed here from metrics.jsonl's lines with plain Python."""
    at = make_app(algo_seed_runs).run()
    assert not at.exception and not at.error, texts([*at.exception, *at.error])
    assert at.multiselect(key="compare_group_by").value == ["algo"]  # steps and seed are no condition
    assert at.slider(key="compare_window").value == (1, 4)
    assert (at.selectbox(key="compare_diff_a").value, at.selectbox(key="compare_diff_b").value) == (
        "algo=grpo", "algo=gspo")

    def window_mean(run: str) -> float:
        lines = [json.loads(line) for line in (algo_seed_runs / run / schema.METRICS_JSONL).read_text().splitlines()]
        values = [line[CHANGED] for line in lines if 1 <= line["step"] <= 4]
        assert len(values) == 4
        return sum(values) / 4

    d = [window_mean(f"grpo-s{seed}") - window_mean(f"gspo-s{seed}") for seed in (0, 1)]
    mean = (d[0] + d[1]) / 2
    half = T_975_DF1 * abs(d[0] - d[1]) / math.sqrt(2) / math.sqrt(2)  # sd of two values = |d0 - d1| / sqrt(2)
    paired = at.table[1].value
    row = paired.loc["Routing change old → new"]
    assert row["seeds paired"] == 2 and row["seeds"] == "0, 1"
    assert_shown(row["difference"], mean)
    low, high = row["95% interval"].split(" to ")
    assert_shown(low, mean - half)
    assert_shown(high, mean + half)
    groups = by_how_much(at)
    grpo = [window_mean(f"grpo-s{seed}") for seed in (0, 1)]
    assert_shown(groups[("Routing change old → new", "algo=grpo")]["mean"], sum(grpo) / 2)
    assert_shown(groups[("Routing change old → new", "algo=grpo")]["± se"], abs(grpo[0] - grpo[1]) / 2)
