"""Every dashboard page under Streamlit's AppTest, on real runs, an empty folder and damaged runs.

AppTest runs dashboard/app.py in this process (no browser): it checks what each page renders (its charts, the
frames they draw against the analyzers' own results, and the CSV beside each chart), that no exception or error
box appears for good runs, and that one bad run leaves the others working.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.support.dashboard import (
    COMPARE_PAGE,
    PAGES,
    PROBES_PAGE,
    RUNS_PAGE,
    assert_clean,
    assert_interactive_with_csv,
    chart_alts,
    charts_on,
    open_page,
    texts,
)

# Charts each page must show for the two real runs (substrings of the charts' accessible names).
FLOAT_NOISE = {
    COMPARE_PAGE: ["mismatch/rollout_old/k3 against step, mean ± sd by group"],
    "app_pages/training.py": ["Rollout vs pi_old as used in the ratio, k3 (R3 / TRR lower it) against step",
                              "Rollout vs the trainer's free pi_old, k3 against step"],
}
"""Charts whose values are 0 at float precision in these runs (fp32 rollouts): said in words instead."""
EXPECTED_CHARTS = {
    COMPARE_PAGE: [
        "reward/mean against step, mean ± sd by group",
        "eval/accuracy against step, mean ± sd by group",
        "routing/old_new/changed against step, mean ± sd by group",
        "ratio/token_log_var against step, mean ± sd by group",
    ],
    "app_pages/training.py": [
        "Reward (mean over the rollout batch) against step",
        "Eval accuracy",
        "Response length (mean) against step",
        "Policy loss (mean over minibatches) against step",
        "KL from pi_old to the updated policy",
        "Gradient norm (before clipping, mean over minibatches) against step",
        "Clipped tokens, minibatches 2..n (GSPO Fig. 2) against step",
        "Routing's share of the variance of log w",  # the R2 run measures it (--routing-share); the off run's is absent
    ],
    "app_pages/volatility.py": [
        "Heatmap of routing change old_new by layer and step for gspo-off",
        "Heatmap of routing change rollout_old_free by layer and step for gspo-off",
        "Heatmap of routing change old_new by layer and step for gspo-r2",
        "Heatmap of routing change old_new by layer and position for gspo-off",
        "Heatmap of routing change rollout_old_free by layer and position for gspo-r2",
        "old → new (trainer, free routing) by step",
        "rollout → trainer (free pi_old) by step",
        "rollout → trainer (pi_old as used) by step",
        "update → old (the two sides of log w) by minibatch",
        "old → new (trainer, free routing) by position",
    ],
    "app_pages/ratios.py": [
        "Histogram of log_w per run",
        "Histogram of log_s per run",
        "Clipped tokens (minibatches 2..n) by step",
        "Variance of log w (over tokens) by response length",
    ],
    "app_pages/attribution.py": [
        "Mean |log w| of flipped and unflipped tokens per run",
        "Clipped share of flipped and unflipped tokens per run",
        "Router flip rate against router margin per run",
    ],
    "app_pages/experts.py": [
        "Heatmap of expert load by layer for gspo-off",
        "Load entropy per layer against step for gspo-r2",
        "Co-activation matrix of layer 0 for gspo-off",
    ],
}


def share_formats(spec: dict) -> list[tuple[str, object]]:
    """(title, number format) of every y axis and colour legend of a chart spec whose title names a share ("% of",
    "share")."""
    out = []
    for layer in spec.get("layer", [spec]):
        encoding = layer.get("encoding", {})
        for channel, guide in (("y", "axis"), ("color", "legend")):
            title = encoding.get(channel, {}).get("title")
            if isinstance(title, str) and (title.startswith("%") or "share" in title):
                out.append((title, (encoding[channel].get(guide) or {}).get("format")))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("page", list(PAGES))
def test_page_renders_real_runs(make_app, trained_runs: Path, downloads: dict, page: str) -> None:
    at = open_page(make_app(trained_runs), page)
    assert_clean(at)
    assert [t.value for t in at.title] == [PAGES[page]]
    alts = chart_alts(at)
    for expected in EXPECTED_CHARTS.get(page, []):
        assert any(expected in alt for alt in alts), f"no chart {expected!r} among {alts}"
    for said in FLOAT_NOISE.get(page, []):  # fp32 rollouts: k3 ~1e-13, said in words, not drawn (issue 54.7)
        assert not any(said in alt for alt in alts), f"{said!r} is float noise, drawn as a chart"
        assert any(said in i.value and "0 at float precision" in i.value for i in at.info), [i.value for i in at.info]
    assert_interactive_with_csv(at, downloads)
    for chart in charts_on(at):  # one unit per quantity (issue 54.4): every share on an axis or a legend in percent
        for title, shown in share_formats(chart.spec):
            assert shown == "~p", f"{chart.alt}: {title!r} drawn as {shown!r}, not in percent"
    if page == RUNS_PAGE:
        table = at.dataframe[0].value
        assert list(table["run"]) == ["gspo-off", "gspo-r2"]
        assert list(table["status"]) == ["finished", "finished"]
        assert list(table["replay"]) == ["off", "R2"]
        assert list(table["steps"]) == ["6 / 6", "6 / 6"]
        assert table["final_accuracy"].notna().all()
        # Every readable run is selected at first.
        assert len(at.multiselect(key="moestab_select_widget").value) == 2
    if page == "app_pages/volatility.py":
        note = texts(at.info)
        assert "old → new is always measured with free routing" in note
        assert "replayed under R2" in note and "against pi_old *as used* in the ratio" in note
        replay = at.dataframe[0].value.set_index("run")["pi_old in the ratio and the update forward"]
        assert "pi_old's free routes (R2)" in replay["gspo-r2"] and "route freely" in replay["gspo-off"]
    if page in ("app_pages/ratios.py", "app_pages/attribution.py", "app_pages/experts.py"):
        assert at.dataframe, "the page shows its numbers as a table too"


@pytest.mark.slow
def test_selection_is_kept_and_used_by_other_pages(make_app, trained_runs: Path) -> None:
    at = open_page(make_app(trained_runs), RUNS_PAGE)
    at.multiselect(key="moestab_select_widget").set_value([str(trained_runs / "gspo-off")]).run()
    assert at.session_state["moestab_selected_runs"] == [str(trained_runs / "gspo-off")]
    at.switch_page("app_pages/training.py").run()
    labels = texts(at.markdown)
    assert "**gspo-off**" in labels and "**gspo-r2**" not in labels  # the raw-metrics sections
    at.switch_page("app_pages/volatility.py").run()
    alts = chart_alts(at)
    assert any("for gspo-off" in alt for alt in alts) and not any("gspo-r2" in alt for alt in alts)
    # Back on the Runs page the widget shows the kept selection.
    at.switch_page(RUNS_PAGE).run()
    assert at.multiselect(key="moestab_select_widget").value == [str(trained_runs / "gspo-off")]
    # Nothing selected: the pages point back to the Runs page instead of drawing.
    at.multiselect(key="moestab_select_widget").set_value([]).run()
    at.switch_page("app_pages/ratios.py").run()
    assert "No run selected" in texts(at.info)
    assert not chart_alts(at)
    assert not at.exception


@pytest.mark.slow
def test_damaged_runs_are_reported_and_the_good_run_still_renders(make_app, runs_copy: Path) -> None:
    good = "gspo-r2"
    # A truncated per-token table in one run ...
    table = runs_copy / "gspo-off" / "tokens" / "step_000002.parquet"
    table.write_bytes(table.read_bytes()[: table.stat().st_size // 2])
    # ... a run.json that is not JSON ...
    (runs_copy / "broken").mkdir()
    (runs_copy / "broken" / "run.json").write_text('{"schema_version": 1, "status": "fin')
    # ... and a run that has just started: running, no metrics and no tokens yet.
    partial = runs_copy / "partial"
    partial.mkdir()
    started = json.loads((runs_copy / good / "run.json").read_text())
    started.update(status="running", last_step=0)
    started.pop("final", None)
    (partial / "run.json").write_text(json.dumps(started))

    at = open_page(make_app(runs_copy), RUNS_PAGE)
    assert not at.exception, texts(at.exception)
    table = at.dataframe[0].value.set_index("run")
    assert table.loc["broken", "status"] == "unreadable"
    assert "broken/run.json" in table.loc["broken", "problem"]
    assert table.loc["partial", "status"] == "running"
    assert table.loc[good, "status"] == "finished"
    assert "broken/run.json" in texts(at.error)
    # The Runs table reads run.json and metrics.jsonl only; the damaged token table shows on the pages that read it.
    # Compare all four on every page.
    at.multiselect(key="moestab_select_widget").set_value([str(p) for p in sorted(runs_copy.iterdir())]).run()
    for page in PAGES:
        if page in (RUNS_PAGE, PROBES_PAGE):
            continue
        at.switch_page(page).run()
        assert not at.exception, (page, texts(at.exception))
        assert [t.value for t in at.title] == [PAGES[page]]
        assert "broken" in texts(at.error) and "not valid JSON" in texts(at.error), page
        assert "**partial**" in texts(at.info) and "yet (the run is still running)" in texts(at.info), page
        if page not in ("app_pages/training.py", COMPARE_PAGE):  # their curves come from metrics.jsonl, still whole
            assert "step_000002.parquet" in texts(at.warning), page
        assert any(good in alt or "per run" in alt or "against step" in alt for alt in chart_alts(at)), page


@pytest.mark.slow
def test_a_changed_run_is_reloaded_without_refresh(make_app, runs_copy: Path) -> None:
    """Cache keys hold file times and sizes: a run that gains its first step shows it on the next rerun."""
    run = runs_copy / "gspo-off"
    metrics = run / "metrics.jsonl"
    saved = metrics.read_text()
    metrics.unlink()
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, "status": "running"}))
    shutil.rmtree(run / "tokens")

    at = make_app(runs_copy).run()
    at.switch_page("app_pages/training.py").run()
    assert "**gspo-off**: no completed step yet" in texts(at.info)
    metrics.write_text(saved)
    at.run()
    assert "no completed step" not in texts(at.info)
    assert "**gspo-off**" in texts(at.markdown)
    # The Refresh button empties the caches and redraws; auto-refresh starts its watcher.
    at.sidebar.button[0].click().run()
    assert not at.exception and "**gspo-off**" in texts(at.markdown)
    at.sidebar.toggle(key="moestab_auto_refresh").set_value(True).run()
    assert not at.exception
    assert at.sidebar.select_slider(key="moestab_every").value == 10


@pytest.mark.slow
def test_app_only_reads_run_folders(make_app, runs_copy: Path) -> None:
    def snapshot() -> dict[str, tuple[int, int]]:
        return {
            str(p.relative_to(runs_copy)): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in sorted(runs_copy.rglob("*"))
        }

    before = snapshot()
    at = make_app(runs_copy)
    for page in PAGES:
        open_page(at, page)
        assert not at.exception, page
    assert snapshot() == before


def test_empty_folder_says_so_on_every_page(make_app, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    at = make_app(empty).run()
    for page in PAGES:
        if page != COMPARE_PAGE:  # the page the app opens on
            at.switch_page(page).run()
        assert not at.exception and not at.error, (page, texts(at.exception), texts(at.error))
        assert [t.value for t in at.title] == [PAGES[page]]
        assert ("No probe folders in" if page == PROBES_PAGE else "No runs in") in texts(at.info), page
        assert not chart_alts(at)


def test_missing_folder_says_so(make_app, tmp_path: Path) -> None:
    at = make_app(tmp_path / "nowhere").run()
    assert not at.exception
    assert "does not exist" in texts(at.warning)
    at.switch_page("app_pages/training.py").run()
    assert "does not exist" in texts(at.warning)


def test_runs_folder_from_environment(make_app, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = make_app(None)  # no folder after `--`
    monkeypatch.setenv("MOESTAB_RUNS", str(tmp_path))
    at.run()
    assert at.sidebar.text_input(key="moestab_runs_dir").value == str(tmp_path)
    assert f"No runs in `{tmp_path}`" in texts(at.info)


@pytest.fixture
def no_runs_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset $MOESTAB_RUNS and look-alikes (MOESTAB_RUNS_DIR, ...) the shell running the tests may set."""
    for name in [n for n in os.environ if n.upper().startswith("MOESTAB_RUN")]:
        monkeypatch.delenv(name)


def folder_line(at) -> str:
    """The sidebar's "Runs folder: `PATH` (why)" line."""
    (line,) = [c.value for c in at.sidebar.caption if c.value.startswith("Runs folder:")]
    return line


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ("given", "from-env", "`{tmp}/given` (from the command line)"),  # the command line wins over the variable
        (None, "from-env", "`{tmp}/from-env` (from `$MOESTAB_RUNS`)"),
        (None, None, "`{tmp}/runs` (default: ./runs)"),
    ],
)
@pytest.mark.usefixtures("no_runs_variables")
def test_sidebar_says_which_runs_folder_and_why(
    make_app, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: str | None, env: str | None, expected: str
) -> None:
    monkeypatch.chdir(tmp_path)  # relative folders (and the default ./runs, missing here) are under tmp_path
    (tmp_path / "given").mkdir()
    (tmp_path / "from-env").mkdir()
    at = make_app(Path(argv) if argv else None)
    if env:
        monkeypatch.setenv("MOESTAB_RUNS", env)
    at.run()
    assert not at.exception, texts(at.exception)
    assert folder_line(at) == "Runs folder: " + expected.format(tmp=tmp_path.resolve())  # made absolute
    assert not at.sidebar.warning, texts(at.sidebar.warning)


def test_sidebar_says_a_typed_folder_was_typed(make_app, tmp_path: Path) -> None:
    at = make_app(tmp_path).run()
    assert folder_line(at) == f"Runs folder: `{tmp_path.resolve()}` (from the command line)"
    at.sidebar.text_input(key="moestab_runs_dir").set_value(str(tmp_path / "other")).run()
    assert folder_line(at) == f"Runs folder: `{tmp_path.resolve() / 'other'}` (typed in the box above)"


@pytest.mark.parametrize("name", ["MOESTAB_RUNS_DIR", "MOESTAB_RUN_DIR", "MOESTAB_RUNSDIR", "moestab_runs"])
@pytest.mark.usefixtures("no_runs_variables")
def test_misspelt_runs_variable_is_reported_as_ignored(
    make_app, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.chdir(tmp_path)
    at = make_app(None)
    monkeypatch.setenv(name, str(tmp_path / "mine"))
    at.run()
    assert not at.exception, texts(at.exception)
    assert folder_line(at) == f"Runs folder: `{tmp_path.resolve() / 'runs'}` (default: ./runs)"  # not read
    assert f"`${name}` is set but ignored: the runs folder variable is `$MOESTAB_RUNS`." in texts(at.sidebar.warning)
    # With $MOESTAB_RUNS set as well, that one is used and the other is not mentioned.
    monkeypatch.setenv("MOESTAB_RUNS", str(tmp_path / "mine"))
    at = make_app(None).run()
    assert folder_line(at) == f"Runs folder: `{tmp_path.resolve() / 'mine'}` (from `$MOESTAB_RUNS`)"
    assert name not in texts(at.sidebar.warning)


def test_a_run_whose_steps_repeat_is_shown_damaged_not_finished(make_app, tmp_path: Path) -> None:
    from tests.support.runs import write_run

    good, mixed = write_run(tmp_path, "good"), write_run(tmp_path, "mixed")
    lines = (mixed.path / "metrics.jsonl").read_text().splitlines()[:2]
    (mixed.path / "metrics.jsonl").write_text("\n".join(lines * 2) + "\n")  # two writers' steps 1, 2, 1, 2
    at = open_page(make_app(tmp_path), RUNS_PAGE)
    assert not at.exception, texts(at.exception)
    table = at.dataframe[0].value.set_index("run")
    assert table.loc["mixed", "status"] == "damaged" and table.loc[good.path.name, "status"] == "finished"
    assert "line 3 is step 1, after step 2 on line 2" in table.loc["mixed", "problem"]
    assert "**mixed** is damaged" in texts(at.error) and "two writers" in texts(at.error)
