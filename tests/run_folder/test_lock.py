"""moestab.run_folder.lock: one writer per run folder, a dead holder's lock taken over, nothing left behind."""

from __future__ import annotations

import json
import os
import pickle
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moestab.run_folder import schema
from moestab.run_folder.lock import RunLockedError, folder_contents, lock_path, run_lock

ROOT = Path(__file__).resolve().parents[2]
HOST = socket.gethostname()


def dead_pid() -> int:
    """The pid of a process that has exited."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_a_held_lock_refuses_a_second_writer_naming_the_holder_and_changes_nothing(tmp_path):
    run = tmp_path / "run"
    with run_lock(run, note=pytest.fail):
        held = lock_path(run).read_bytes()
        assert json.loads(held)["pid"] == os.getpid() and json.loads(held)["host"] == HOST
        # flock belongs to the open file, so a second open in this same process is refused like another process.
        refusal = re.escape(f"{run} is being written by process {os.getpid()} on host {HOST}")
        with pytest.raises(RunLockedError, match=refusal), run_lock(run, note=pytest.fail):
            pytest.fail("entered a held lock")
        assert lock_path(run).read_bytes() == held and folder_contents(run) == []
    assert not run.exists()  # created for the lock, left empty: removed


def test_a_lock_held_by_another_process_is_refused_and_taken_over_once_it_is_killed(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom moestab.run_folder.lock import run_lock\n"
         "with run_lock(sys.argv[1], note=print):\n    print('locked', flush=True)\n    time.sleep(600)\n", str(run)],
        stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunLockedError, match=f"process {holder.pid} on host {re.escape(HOST)}") as refused, \
                run_lock(run, note=pytest.fail):
            pytest.fail("entered a held lock")
        assert refused.value.holder["pid"] == holder.pid
    finally:
        holder.kill()  # SIGKILL: no clean-up ran, the file still names it; the OS released the flock
        holder.wait()
    assert json.loads(lock_path(run).read_text())["pid"] == holder.pid
    notes: list[str] = []
    with run_lock(run, note=notes.append):
        assert json.loads(lock_path(run).read_text())["pid"] == os.getpid()
    assert notes == [notes[0]] and f"took over the lock of process {holder.pid} on host {HOST}" in notes[0]
    assert "which is no longer running" in notes[0]
    assert not lock_path(run).exists()


def test_a_lock_file_naming_a_dead_process_is_taken_over_with_a_note(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    pid = dead_pid()
    lock_path(run).write_text(json.dumps({"pid": pid, "host": HOST, "started": "2026-01-01T00:00:00+00:00"}) + "\n")
    (run / "kept.txt").write_text("x")
    notes: list[str] = []
    with run_lock(run, note=notes.append):
        assert json.loads(lock_path(run).read_text())["pid"] == os.getpid()
    assert notes == [f"took over the lock of process {pid} on host {HOST} (since 2026-01-01T00:00:00+00:00), "
                     "which is no longer running"]
    assert [p.name for p in run.iterdir()] == ["kept.txt"]  # the folder existed: only the lock file goes


def test_a_lock_file_left_empty_is_taken_without_a_note(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lock_path(run).touch()  # what a holder that ended normally but could not remove the file leaves
    with run_lock(run, note=pytest.fail):
        pass
    assert not lock_path(run).exists()


def test_folders_created_for_the_lock_go_unless_the_run_was_written_there(tmp_path):
    with run_lock(tmp_path / "a" / "b" / "run", note=pytest.fail):
        assert (tmp_path / "a" / "b" / "run" / schema.LOCK_FILE).is_file()
    assert list(tmp_path.iterdir()) == []  # a refused or failed start leaves no stray folder
    with pytest.raises(RuntimeError, match="boom"), run_lock(tmp_path / "x" / "run", note=pytest.fail):
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []  # on every way out
    run = tmp_path / "a" / "run"
    with run_lock(run, note=pytest.fail):
        (run / schema.RUN_JSON).write_text("{}")
    assert [p.name for p in run.iterdir()] == [schema.RUN_JSON]


def test_a_file_is_no_run_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="a file, not a folder"), run_lock(tmp_path / "file", note=print):
        pytest.fail("locked a file")
    assert (tmp_path / "file").read_text() == "x"


def test_a_holder_that_has_not_named_itself_yet_is_waited_for_then_called_another_process(tmp_path, monkeypatch):
    import fcntl

    from moestab.run_folder import lock as lock_module

    run = tmp_path / "run"
    run.mkdir()
    fd = os.open(lock_path(run), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # locked, nothing written yet
        monkeypatch.setattr(lock_module, "NAME_WAIT_S", 0.3)
        started = time.monotonic()
        with pytest.raises(RunLockedError, match="another process"), run_lock(run, note=pytest.fail):
            pass
        assert time.monotonic() - started >= 0.3
    finally:
        os.close(fd)


def test_the_refusal_crosses_processes_intact(tmp_path):
    error = RunLockedError(tmp_path, {"pid": 12, "host": "h", "started": "t"})
    copy = pickle.loads(pickle.dumps(error))  # rank 0's refusal is broadcast to the other ranks
    assert str(copy) == str(error) and copy.holder == error.holder


def test_folder_contents_leave_out_the_lock(tmp_path):
    lock_path(tmp_path).touch()
    assert folder_contents(tmp_path) == []
    (tmp_path / "a").touch()
    assert folder_contents(tmp_path) == [tmp_path / "a"]
