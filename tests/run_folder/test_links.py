"""No write through a link planted in a run folder (issue 40.1): runs folders are shared, so every name in one is
untrusted. Each case plants a link at a name moestab writes, pointing at a file or folder of the user's ("victim"),
then checks that the victim is byte-for-byte unchanged, and that the write was refused naming the link or went to a
new file in the run folder instead.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from moestab.run_folder import PlantedLinkError, RunFolder, schema
from moestab.run_folder.files import atomic_write_text, created, open_append
from moestab.run_folder.folder import replace_folder
from moestab.run_folder.lock import run_lock
from moestab.run_folder.writer import RunWriter
from tests.support.runs import a_run

PRECIOUS = b"the user's own file\n"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere" / "precious.txt"
    path.parent.mkdir()
    path.write_bytes(PRECIOUS)
    return path


def plant(link: Path, target: Path) -> Path:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return link


def test_a_link_at_the_lock_file_is_refused_and_its_target_not_truncated(tmp_path, victim):
    link = plant(tmp_path / "run" / schema.LOCK_FILE, victim)
    with pytest.raises(PlantedLinkError, match=r"\.moestab\.lock is a symbolic link .*remove the link"), \
            run_lock(tmp_path / "run", note=print):
        pass
    assert victim.read_bytes() == PRECIOUS and link.is_symlink()


def test_train_refuses_a_planted_lock_link_before_writing_anything(tmp_path, victim):
    run = tmp_path / "run"
    plant(run / schema.LOCK_FILE, victim)
    done = subprocess.run([sys.executable, "-m", "moestab.cli", "train", "--out", str(run), "--steps", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "is a symbolic link" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert victim.read_bytes() == PRECIOUS
    assert sorted(p.name for p in run.iterdir()) == [schema.LOCK_FILE]  # nothing written


def test_the_write_probe_never_writes_through_a_link(tmp_path, victim):
    probe = plant(tmp_path / "run" / ".moestab-write-test", victim)
    RunFolder(tmp_path / "run").check_writable(remedy="x")
    assert victim.read_bytes() == PRECIOUS
    assert not probe.is_symlink() and not probe.exists()  # the probe's own name: the link went, not its target


def test_metrics_jsonl_as_a_link_is_refused(tmp_path, victim):
    a_run(tmp_path / "run")
    metrics = RunFolder(tmp_path / "run").metrics_file
    metrics.unlink(missing_ok=True)
    plant(metrics, victim)
    with pytest.raises(PlantedLinkError, match=r"metrics\.jsonl"):
        RunWriter(tmp_path / "run").append_metrics({"step": 1})
    with pytest.raises(PlantedLinkError):
        RunFolder(tmp_path / "run").check_writable(remedy="x")  # refused up front too
    assert victim.read_bytes() == PRECIOUS


@pytest.mark.parametrize("sub", ["tokens", "checkpoints", "state"])
def test_a_run_subfolder_as_a_link_is_refused_before_a_run_starts(tmp_path, sub):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    plant(tmp_path / "run" / sub, elsewhere)
    with pytest.raises(PlantedLinkError, match=f"{sub} is a symbolic link"):
        RunFolder(tmp_path / "run").check_writable(remedy="x")
    assert list(elsewhere.iterdir()) == []


def test_temporaries_at_planted_links_are_replaced_not_written_through(tmp_path, victim):
    folder = a_run(tmp_path / "run")
    run, writer = folder.path, RunWriter(folder.path)
    for name in (f".{schema.RUN_JSON}.tmp", ".config.yaml.tmp", f".{folder.tokens_file(1).name}.tmp"):
        target_dir = folder.tokens_file(1).parent if name.startswith(".step") else run
        plant(target_dir / name, victim)
    writer.update(last_step=1)  # run.json through its temporary
    atomic_write_text(folder.config_yaml, "steps: 2\n")
    writer.write_tokens(1, pa.table({"x": [1, 2, 3]}))
    assert victim.read_bytes() == PRECIOUS
    assert writer.read_info().last_step == 1 and folder.config_yaml.read_text() == "steps: 2\n"
    assert folder.tokens_file(1).is_file() and not folder.tokens_file(1).is_symlink()
    assert folder.leftover_temporaries() == []


def test_a_checkpoint_write_replaces_links_at_its_names(tmp_path, victim):
    folder = a_run(tmp_path / "run")
    state = folder.state_file(1)
    plant(state.with_name(f".{state.name}.tmp"), victim)
    elsewhere = tmp_path / "elsewhere-folder"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_bytes(PRECIOUS)
    step_dir = folder.checkpoint_dir(1)
    plant(step_dir.with_name(f".{step_dir.name}.tmp"), elsewhere)
    plant(step_dir, elsewhere)  # the checkpoint's own name: replaced by the new folder, the target kept
    folder.save_checkpoint(1, b"state", lambda tmp: (tmp.mkdir(), (tmp / "config.json").write_text("{}")),
                           weights_bytes=0)
    assert victim.read_bytes() == PRECIOUS and (elsewhere / "keep.txt").read_bytes() == PRECIOUS
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt"]
    assert state.read_bytes() == b"state" and (step_dir / "config.json").read_text() == "{}"
    assert not step_dir.is_symlink()


def test_leftover_temporary_links_are_cleaned_up_without_touching_their_targets(tmp_path, victim):
    folder = a_run(tmp_path / "run", checkpoints=(0,))
    elsewhere = tmp_path / "elsewhere-folder"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_bytes(PRECIOUS)
    links = [plant(folder.checkpoint_dir(1).with_name(".step_000001.tmp"), elsewhere),
             plant(folder.state_file(1).with_name(".step_000001.pt.tmp"), victim),
             plant(folder.path / ".step_000002.old", tmp_path / "nowhere")]  # dangling
    assert folder.remove_temporaries() == sorted(links)
    assert not any(link.is_symlink() for link in links)
    assert victim.read_bytes() == PRECIOUS and (elsewhere / "keep.txt").read_bytes() == PRECIOUS


def test_overwrite_unlinks_links_in_the_old_run_without_following_them(tmp_path, victim):
    folder = a_run(tmp_path / "run")
    plant(folder.path / "notes-link.txt", victim)
    folder.clear()
    assert victim.read_bytes() == PRECIOUS


def test_the_file_helpers_refuse_or_replace_links(tmp_path, victim):
    link = plant(tmp_path / "x.jsonl", victim)
    with pytest.raises(PlantedLinkError, match=r"x\.jsonl"):
        open_append(link)
    with created(link) as f:  # a name moestab owns: the link is removed and a new file made
        f.write(b"new")
    assert link.read_bytes() == b"new" and not link.is_symlink()
    plant(tmp_path / "dir-link", tmp_path / "elsewhere")
    replace_folder(tmp_path / "dir-link", lambda tmp: tmp.mkdir())
    assert victim.read_bytes() == PRECIOUS and (tmp_path / "dir-link").is_dir()
    assert not (tmp_path / "dir-link").is_symlink()
