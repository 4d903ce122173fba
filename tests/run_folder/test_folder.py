"""moestab.run_folder.RunFolder: one policy for a new run, --overwrite and --resume; checkpoints whole or absent.

Run folders are made by hand here (run.json through ``RunWriter``), so each rule is checked without training; the
same rules through ``moestab train`` are tests/train/test_run_control.py and test_run_lock.py.
"""

from __future__ import annotations

import errno
import json
import os
import re

import pytest

from moestab.run_folder import Remedies, RunFolder, RunFolderError, schema
from moestab.run_folder.errors import NotARunError, RunFileError
from moestab.run_folder.folder import kept_note
from moestab.run_folder.lock import lock_path, run_lock
from moestab.run_folder.writer import RunWriter
from tests.support.runs import MODEL, a_run

TRL = Remedies(folder="run_dir", overwrite="RecordSettings(..., overwrite=True)", resume=None)


def test_the_layout_is_the_schemas(tmp_path):
    folder = RunFolder(tmp_path / "run")
    assert folder.run_json == tmp_path / "run" / schema.RUN_JSON
    assert folder.tokens_file(3) == tmp_path / "run" / "tokens" / "step_000003.parquet"
    assert folder.checkpoint_dir(12) == tmp_path / "run" / "checkpoints" / "step_000012"
    assert folder.state_file(12) == tmp_path / "run" / "state" / "step_000012.pt"
    assert not folder.holds_run and folder.complete_checkpoints() == []


def test_a_writer_makes_the_subfolders_it_fills_and_refuses_others_before_writing(tmp_path):
    config = {"algo": "gspo", "routing_replay": "off", "model": "embedded", "steps": 3}
    a_run(tmp_path / "train")  # moestab train's layout: every run subfolder
    assert sorted(p.name for p in (tmp_path / "train").iterdir() if p.is_dir()) == sorted(
        [schema.CHECKPOINTS_DIR, schema.STATE_DIR, schema.TOKENS_DIR])
    RunWriter(tmp_path / "trl").start(config=config, model=MODEL, environment={}, config_yaml="",
                                      subfolders=(schema.TOKENS_DIR,))  # a writer that saves no checkpoints
    assert sorted(p.name for p in (tmp_path / "trl").iterdir()) == [schema.CONFIG_YAML, schema.RUN_JSON,
                                                                      schema.TOKENS_DIR]
    for wrong, named in [(("tokens", "tensorboard"), "['tensorboard'] are not run subfolders"),
                         ("tokens", "got the string 'tokens'")]:
        with pytest.raises(ValueError, match=re.escape(named)):
            RunWriter(tmp_path / "wrong").start(config=config, model=MODEL, environment={}, config_yaml="",
                                                subfolders=wrong)
        assert not (tmp_path / "wrong").exists()  # refused before anything was written


def test_warnings_are_kept_in_run_json_in_order(tmp_path):
    writer = RunWriter(tmp_path / "run")
    a_run(tmp_path / "run")
    assert "warnings" not in json.loads((tmp_path / "run" / schema.RUN_JSON).read_text())  # none: no key
    writer.add_warning("step 1: first")
    writer.update(last_step=2)  # an update keeps them
    writer.add_warning("step 2: second")
    assert RunFolder(tmp_path / "run").info().warnings == ("step 1: first", "step 2: second")
    raw = json.loads((tmp_path / "run" / schema.RUN_JSON).read_text())
    assert raw["warnings"] == ["step 1: first", "step 2: second"]
    (tmp_path / "run" / schema.RUN_JSON).write_text(json.dumps({**raw, "warnings": "step 1: first"}))
    with pytest.raises(RunFileError, match="expected a list of strings"):
        RunFolder(tmp_path / "run").info()


def test_a_new_run_may_go_to_an_absent_or_empty_folder_only(tmp_path):
    assert RunFolder(tmp_path / "absent").check_new(overwrite=False) is False
    with run_lock(tmp_path / "locked", note=pytest.fail):  # the lock file of the writer checking it is no content
        assert RunFolder(tmp_path / "locked").check_new(overwrite=False) is False
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunFolderError, match=re.escape(f"--out {tmp_path / 'file'} is a file, not a folder; "
                                                   "choose another --out")):
        RunFolder(tmp_path / "file").check_new(overwrite=False)
    (tmp_path / "thesis").mkdir()
    (tmp_path / "thesis" / "thesis.tex").write_text("do not delete")
    for overwrite in (False, True):
        with pytest.raises(RunFolderError, match="is a non-empty folder that is not a moestab run") as refused:
            RunFolder(tmp_path / "thesis").check_new(overwrite=overwrite)
        assert ("--overwrite deletes only run folders" in str(refused.value)) == overwrite
    assert (tmp_path / "thesis" / "thesis.tex").read_text() == "do not delete"


def test_a_run_is_kept_unless_overwritten_and_the_message_says_how_to_go_on(tmp_path):
    resumable = a_run(tmp_path / "resumable", checkpoints=(0, 1))
    with pytest.raises(RunFolderError, match=re.escape(
            f"{resumable.path} already holds a run (finished, last step 1); continue it with `moestab train --resume "
            f"{resumable.path}` or start over with --overwrite")):
        resumable.check_new(overwrite=False)
    early = a_run(tmp_path / "early", status=schema.STATUS_FAILED, last_step=0)
    with pytest.raises(RunFolderError, match="that stopped before its first checkpoint, so there is nothing to "
                                             "resume; start over with --overwrite"):
        early.check_new(overwrite=False)
    # A writer that cannot resume (TRL) gets the same policy in its own words.
    with pytest.raises(RunFolderError, match=re.escape(
            "(finished, last step 1); choose another run_dir or start over with RecordSettings(..., overwrite=True)")):
        resumable.check_new(overwrite=False, remedies=TRL)
    assert resumable.check_new(overwrite=True, remedies=TRL) is True
    assert early.check_new(overwrite=True) is True


def test_a_run_still_being_written_is_never_overwritten(tmp_path):
    running = a_run(tmp_path / "run", status=schema.STATUS_RUNNING)  # this live process is its writer
    with pytest.raises(RunFolderError, match=f"that is still being written by process {os.getpid()}"):
        running.check_new(overwrite=True)
    with pytest.raises(RunFolderError, match=re.escape(f"--resume {running.path}: the run is still being written")):
        running.resume_point(note=print)


def test_clear_keeps_the_folder_and_the_lock_and_deletes_only_a_run(tmp_path):
    folder = a_run(tmp_path / "run", checkpoints=(0,))
    with run_lock(folder.path, note=pytest.fail):
        folder.clear()
        assert [p.name for p in folder.path.iterdir()] == [schema.LOCK_FILE]
        with pytest.raises(NotARunError):
            folder.clear()  # checked again: no longer a run folder
    assert not lock_path(folder.path).exists()


def test_clear_deletes_what_a_run_wrote_and_keeps_what_the_user_kept_there(tmp_path):
    folder = a_run(tmp_path / "run", checkpoints=(0,))
    for name in (schema.TENSORBOARD_DIR, schema.WANDB_DIR, "analysis"):
        (folder.path / name).mkdir()
        (folder.path / name / "f").write_text("x")
    (folder.path / "notes.txt").write_text("mine")
    (folder.path / ".run.json.tmp").write_text("{")  # an interrupted write's
    with run_lock(folder.path, note=pytest.fail):
        kept = folder.clear()
    assert [p.name for p in kept] == ["analysis", "notes.txt"]
    assert sorted(p.name for p in folder.path.iterdir()) == ["analysis", "notes.txt"]
    assert (folder.path / "notes.txt").read_text() == "mine" and (folder.path / "analysis" / "f").is_file()
    assert kept_note(kept) == " (kept analysis/, notes.txt: not moestab's)" and kept_note([]) == ""


def test_resume_point_is_the_last_complete_checkpoint(tmp_path):
    folder = a_run(tmp_path / "run", checkpoints=(0, 1, 2))
    folder.state_file(2).unlink()  # a kill between the two halves of step 2's checkpoint
    assert folder.complete_checkpoints() == [0, 1]
    info, step = folder.resume_point(note=print)
    assert step == 1 and info.last_step == 1
    with pytest.raises(RunFolderError, match=r"it has no complete checkpoint \(it stopped before step 0 was saved\)"):
        a_run(tmp_path / "early").resume_point(note=print)
    with pytest.raises(RunFolderError, match=re.escape(f"--resume {tmp_path / 'none'}: {tmp_path / 'none'} is not a "
                                                       "moestab run folder")):
        RunFolder(tmp_path / "none").resume_point(note=print)


def test_a_damaged_last_checkpoint_is_passed_over_saying_so(tmp_path):
    folder = a_run(tmp_path / "run", checkpoints=(0, 1, 2), last_step=2)
    weights = folder.checkpoint_dir(2) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:20])  # a copy cut short
    state = folder.state_file(1)
    state.write_bytes(state.read_bytes()[:-30])  # its zip directory gone
    notes: list[str] = []
    info, step = folder.resume_point(note=notes.append)
    assert step == 0 and info.last_step == 2
    header = int.from_bytes(weights.read_bytes()[:8], "little")
    assert notes == [f"checkpoint 2 is damaged (model.safetensors declares a {header:,}-byte header in a 20-byte "
                     "file (cut short?)); resuming from checkpoint 0",
                     "checkpoint 1 is damaged (step_000001.pt is not a whole torch.save archive (File is not a zip "
                     "file)); resuming from checkpoint 0"]
    folder.state_file(0).write_bytes(b"\x80\x04K\x01.")  # a plain pickle, not torch.save's archive
    with pytest.raises(RunFolderError, match=r"every checkpoint is damaged \(step 2: .*; step 1: .*; step 0: "
                                             r"step_000000.pt is not a whole torch.save archive"):
        folder.resume_point(note=pytest.fail)


@pytest.mark.parametrize("step_value", ['"3"', "null", "2.0", "true"])
def test_a_metrics_line_whose_step_is_not_an_integer_stops_a_resume_unchanged(tmp_path, step_value):
    folder = a_run(tmp_path / "run", checkpoints=(0, 1), last_step=1)
    text = f'{{"step": 0, "x": 1}}\n{{"step": {step_value}, "x": 2}}\n{{"step": 1, "x": 3}}\n'
    folder.metrics_file.write_text(text)
    with pytest.raises(RunFolderError, match=re.escape(f"metrics.jsonl: line 2: 'step' is {step_value}, not an "
                                                       "integer; mend or delete that line")):
        folder.resume_point(note=pytest.fail)
    with pytest.raises(RunFileError, match="line 2"):
        RunWriter(folder.path).truncate_metrics(0)
    assert folder.metrics_file.read_text() == text


def test_a_torn_metrics_line_is_dropped_on_truncation(tmp_path):
    folder = a_run(tmp_path / "run", checkpoints=(0, 1), last_step=1)
    folder.metrics_file.write_text('{"step": 0}\n{"step": 1}\n{"step": 2}\n{"ste')
    assert RunWriter(folder.path).truncate_metrics(1) == [4]
    assert folder.metrics_file.read_text() == '{"step": 0}\n{"step": 1}\n'


def test_a_checkpoint_is_whole_or_absent_and_a_failed_one_leaves_only_temporaries(tmp_path):
    folder = a_run(tmp_path / "run", checkpoints=(0,))

    def half_written(tmp):
        tmp.mkdir()
        (tmp / "config.json").write_text("{}")
        raise RuntimeError("writer crashed")

    with pytest.raises(RuntimeError, match="writer crashed"):
        folder.save_checkpoint(1, b"state", half_written, weights_bytes=0)
    assert folder.complete_checkpoints() == [0] and not folder.checkpoint_dir(1).exists()
    assert [p.name for p in folder.leftover_temporaries()] == [".step_000001.tmp"]
    assert folder.remove_temporaries() and folder.leftover_temporaries() == []
    # Written again over an existing checkpoint: replaced whole, nothing left beside it.
    folder.save_checkpoint(0, b"new", lambda tmp: (tmp.mkdir(), (tmp / "config.json").write_text('{"v": 2}')),
                           weights_bytes=0)
    assert json.loads((folder.checkpoint_dir(0) / "config.json").read_text()) == {"v": 2}
    assert folder.state_file(0).read_bytes() == b"new" and folder.leftover_temporaries() == []


def test_a_weight_writer_failing_on_a_full_disk_is_reported_as_enospc_naming_the_folder(tmp_path):
    folder = a_run(tmp_path / "run")

    def full(tmp):
        raise RuntimeError("safetensors: unexpected end of file")  # a writer's own type for a short write

    with pytest.raises(OSError) as raised:
        folder.save_checkpoint(3, b"state", full, weights_bytes=2**62)  # more than any disk has free
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(folder.checkpoint_dir(3))
    message = folder.disk_failure(raised.value, checkpoint_bytes=3 * 2**20)
    assert message.startswith(f"cannot write {folder.checkpoint_dir(3)}: the disk is full")
    assert "a checkpoint of this model needs about 3.0 MiB" in message and "MiB free on" in message
    with pytest.raises(RuntimeError, match="unexpected end"):  # with room to spare it is the writer's own error
        folder.save_checkpoint(3, b"state", full, weights_bytes=0)
    assert folder.disk_failure(OSError(errno.EIO, "I/O error"), checkpoint_bytes=0) is None


def test_check_writable_names_the_folder_and_the_remedy(tmp_path):
    RunFolder(tmp_path / "new" / "run").check_writable(remedy="choose a writable --out")  # the nearest parent
    assert not (tmp_path / "new").exists()  # creates nothing
    (tmp_path / "file").write_text("x")  # a folder that cannot be made (root writes even into read-only ones)
    with pytest.raises(RunFolderError, match=re.escape(f"cannot write to the run folder {tmp_path / 'file' / 'run'}: "
                                                       f"Not a directory ({tmp_path / 'file'}); choose a writable")):
        RunFolder(tmp_path / "file" / "run").check_writable(remedy="choose a writable --out")
