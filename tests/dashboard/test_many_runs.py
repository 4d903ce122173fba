"""A runs folder of more runs than the dashboard selects for the user (issue 55.10): the Runs page reads them into the
run index a budget at a time, rerunning until the table is whole; nothing is selected for the user; a second start
reads every row from the index instead of the runs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from moestab.analysis.run_index import INDEX_FILE
from moestab.dashboard.kit import loaders, ui
from tests.support.dashboard import COMPARE_PAGE, RUNS_PAGE, assert_clean, open_page, texts

MANY = ui.AUTO_SELECT_MAX + 6


@pytest.fixture
def many_runs(trained_runs: Path, tmp_path: Path) -> Path:
    """:data:`MANY` copies of a real 6-step run, two levels down. Token tables are hard-linked (moestab renames them
    into place, never writes one in place); every other file is copied, so a test that damages a copy's run.json
    leaves the session's :func:`trained_runs` whole."""
    source, root = trained_runs / "gspo-off", tmp_path / "many"

    def link_tables(src: str, dst: str) -> None:
        (os.link if src.endswith(".parquet") else shutil.copy2)(src, dst)

    for i in range(MANY):
        shutil.copytree(source, root / f"sweep{i % 3}" / f"run{i:02d}", copy_function=link_tables,
                        ignore=shutil.ignore_patterns("checkpoints", "state"))
    return root


@pytest.mark.slow
def test_the_runs_page_reads_a_large_folder_a_budget_at_a_time(
    make_app, many_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ui, "READ_BUDGET_S", 1e-9)  # one run per script run: the page reruns MANY times
    monkeypatch.setattr(ui, "READ_MORE_S", 1e-9)
    at = open_page(make_app(many_runs), RUNS_PAGE)
    assert_clean(at)
    table = at.dataframe[0].value
    assert len(table) == MANY and set(table["status"]) == {"finished"}
    assert at.session_state[ui.SELECTED] == []  # nothing chosen for the user in a folder this large
    assert "none is selected for you" in texts(at.sidebar.caption)
    assert f"{MANY} run(s) in" in texts(at.sidebar.caption) and "not read yet" not in texts(at.sidebar.caption)
    assert (Path(os.environ["MOESTAB_CACHE"]) / INDEX_FILE).is_file()

    compare = open_page(make_app(many_runs), COMPARE_PAGE)
    assert "No run selected" in texts(compare.info)

    def not_again(run: str):
        raise AssertionError(f"{run} was read again: its row is in the run index")

    monkeypatch.setattr(loaders, "_overview_entry", not_again)
    again = open_page(make_app(many_runs), RUNS_PAGE)  # a new session (a new process would read the same file)
    assert_clean(again)
    assert list(again.dataframe[0].value["run"]) == list(table["run"])


@pytest.mark.slow
def test_a_changed_run_is_read_again_and_a_new_run_is_offered_not_chosen(
    make_app, many_runs: Path, trained_runs: Path
) -> None:
    at = open_page(make_app(many_runs), RUNS_PAGE)
    first = sorted(many_runs.glob("*/*"))[0]
    (first / "run.json").write_text("{not json")
    assert json.loads((trained_runs / "gspo-off" / "run.json").read_text())["status"] == "finished"  # a copy
    at.run()
    table = at.dataframe[0].value.set_index("run")
    assert table.loc[first.relative_to(many_runs).as_posix(), "status"] == "unreadable"
    assert at.session_state[ui.SELECTED] == []
