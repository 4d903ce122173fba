"""`moestab train` holds its run folder's lock (moestab.run_folder.lock): a folder being written is refused, for a new
run and for --resume, before anything there changes; --overwrite keeps the lock while it deletes the old run.

The same with two real processes: tests/train/test_faults.py, "two writers".
"""

import json
import os
import re
import socket

import pytest

from moestab.run_folder import RunFolder, schema
from moestab.run_folder.lock import RunLockedError, lock_path, run_lock
from moestab.train import TrainingError, train
from tests.support.train import tiny_config

QUIET = {"log": lambda s: None}
HOLDER = f"process {os.getpid()} on host {socket.gethostname()}"


def files(folder):
    """Every file under ``folder`` with its bytes."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_folder_being_written_is_refused_for_a_new_run_and_for_resume(tmp_path, cache_dir):
    run = tmp_path / "run"
    with run_lock(run, note=pytest.fail):  # another writer holds it (flock is per open file, even in one process)
        with pytest.raises(TrainingError, match=re.escape(f"{run} is being written by {HOLDER}")):
            train(tiny_config(run, cache_dir, steps=1), **QUIET)
        assert not (run / schema.RUN_JSON).exists()
    assert not run.exists()  # nothing written, no folder left behind
    train(tiny_config(run, cache_dir, steps=1), **QUIET)
    assert not lock_path(run).exists()  # released (and removed) at the end
    before = files(run)
    with run_lock(run, note=pytest.fail):
        held = lock_path(run).read_bytes()
        for config in (tiny_config(run, cache_dir, steps=2, resume=str(run)),
                       tiny_config(run, cache_dir, steps=1, overwrite=True)):
            with pytest.raises(TrainingError, match=re.escape(f"is being written by {HOLDER}")) as refused:
                train(config, **QUIET)
            assert isinstance(refused.value.__cause__, RunLockedError)
            assert files(run) == {**before, lock_path(run).relative_to(run): held}  # nothing changed
    train(tiny_config(run, cache_dir, steps=2, resume=str(run)), **QUIET)  # free again
    assert json.loads((run / schema.RUN_JSON).read_text())["last_step"] == 2


def test_a_dead_writers_lock_is_taken_over_with_a_note(tmp_path, cache_dir):
    run = tmp_path / "run"
    run.mkdir()
    lock_path(run).write_text(json.dumps({"pid": 2**22 + 1, "host": "gone", "started": "2026-01-01T00:00:00"}))
    said: list[str] = []
    train(tiny_config(run, cache_dir, steps=1), log=said.append)
    assert "lock: took over the lock of process 4194305 on host gone (since 2026-01-01T00:00:00), which is no " \
           "longer running" in said
    assert json.loads((run / schema.RUN_JSON).read_text())["status"] == "finished"
    assert not lock_path(run).exists()


def test_a_folder_holding_only_a_lock_is_empty_and_overwrite_keeps_the_lock(tmp_path, cache_dir):
    run = tmp_path / "run"
    with run_lock(run, note=pytest.fail):
        assert RunFolder(run).check_new(overwrite=False) is False  # not "a non-empty folder that is not a moestab run"
    train(tiny_config(run, cache_dir, steps=1), **QUIET)
    with run_lock(run, note=pytest.fail):
        assert RunFolder(run).check_new(overwrite=True) is True
        RunFolder(run).clear()
        assert [p.name for p in run.iterdir()] == [schema.LOCK_FILE]
        with pytest.raises(RunLockedError), run_lock(run, note=pytest.fail):  # still held while the run is redone
            pass
