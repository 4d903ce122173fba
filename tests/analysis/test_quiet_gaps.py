"""`moestab analyze` says what it could not read even where the summary does not need it (issue #24, point 6)."""

from __future__ import annotations

import json
import shutil

import pytest

from moestab.analysis.summary import run_summary
from moestab.run_folder import schema
from moestab.run_folder.errors import RunFileError
from tests.support.runs import write_run


def test_an_empty_metrics_file_of_a_run_with_steps_is_said_naming_it(fake_run, cli_main, capsys):
    (fake_run.path / schema.METRICS_JSONL).write_text("")  # run.json: finished at step 3
    with pytest.raises(RunFileError, match=r"metrics\.jsonl: holds no step, though run.json says the run reached "
                                           r"step 3"):
        run_summary(fake_run.path)  # strict by default
    assert cli_main(["analyze", str(fake_run.path), "--json"]) == 0
    captured = capsys.readouterr()
    assert f"warning: skipped {fake_run.path / schema.METRICS_JSONL}: holds no step" in captured.err
    assert "recomputed from the token tables" in captured.err
    assert json.loads(captured.out)[0]["old_new_changed"] is not None  # the token tables still give the numbers


def test_an_empty_metrics_file_without_token_tables_says_there_are_no_numbers(fake_run, cli_main, capsys):
    (fake_run.path / schema.METRICS_JSONL).write_text("")
    shutil.rmtree(fake_run.path / schema.TOKENS_DIR)
    assert cli_main(["analyze", str(fake_run.path)]) == 0
    assert "the run has no token tables, so it has no stability numbers" in capsys.readouterr().err


def test_a_run_that_logged_no_step_yet_is_not_warned_about(tmp_path, cli_main, capsys):
    run = write_run(tmp_path, status="running", final_accuracy=None)
    raw = json.loads((run.path / schema.RUN_JSON).read_text())
    (run.path / schema.RUN_JSON).write_text(json.dumps({**raw, "last_step": 0}))
    (run.path / schema.METRICS_JSONL).write_text("")
    shutil.rmtree(run.path / schema.TOKENS_DIR)
    assert cli_main(["analyze", str(run.path)]) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("plots", [False, True])
def test_a_corrupt_token_table_is_said_with_or_without_plots_once(fake_run, cli_main, capsys, tmp_path, plots):
    (fake_run.path / schema.tokens_file(2)).write_bytes(b"garbage")  # metrics.jsonl is fine: the summary needs none
    extra = ["--plots", str(tmp_path / "figs")] if plots else []
    assert cli_main(["analyze", str(fake_run.path), "--json", *extra]) == 0
    err = capsys.readouterr().err
    name = f"{fake_run.path / schema.tokens_file(2)}: not a readable Parquet file"
    assert err.count(name) == 1, err  # said, and said once when --plots reads the file again
