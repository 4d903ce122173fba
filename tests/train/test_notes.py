"""The run's notes: ``train()`` logs them (``moestab.train.loop``'s logger, INFO) unless given ``log``; the CLI prints.

The CLI side (``moestab: message`` on stderr while a command runs): tests/test_startup.py.
"""

import json
import logging

from moestab.run_folder import schema
from moestab.run_folder.lock import lock_path
from moestab.train import train
from tests.support.train import tiny_config

TAKEN_OVER = "lock: took over the lock of process 4194305 on host gone"


def test_without_log_the_notes_go_to_logging_and_nothing_is_printed(tmp_path, cache_dir, caplog, capsys):
    run = tmp_path / "run"
    run.mkdir()  # a dead writer's lock: the run takes it over and says so, a note that needs no action
    lock_path(run).write_text(json.dumps({"pid": 2**22 + 1, "host": "gone", "started": "2026-01-01T00:00:00"}))
    with caplog.at_level(logging.INFO, logger="moestab"):
        train(tiny_config(run, cache_dir, steps=1))
    notes = [r.getMessage() for r in caplog.records if r.name == "moestab.train.loop" and r.levelno == logging.INFO]
    assert any(note.startswith(TAKEN_OVER) for note in notes), notes
    assert any(note.startswith("start: eval accuracy") for note in notes), notes
    assert capsys.readouterr().out == ""  # the library printed nothing
    assert json.loads((run / schema.RUN_JSON).read_text())["status"] == "finished"
