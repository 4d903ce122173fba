"""No code runs because a run folder names it (issue 40.3): a run.json whose task names a reward file
(``arithmetic:reward=shared/evil.py:score``) is not imported by ``moestab train --resume`` or ``moestab probe``
unless the user states that task on the command line (``--task``), which is then the user's own word.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from moestab.run_folder import schema
from moestab.tasks import TaskSpecError, refuse_code_named_by
from moestab.train import train
from moestab.train.config import load_train_config
from tests.support.train import tiny_config

EVIL = """
from pathlib import Path
Path(__file__).with_name("RAN").write_text("imported")  # what a hostile file would do instead


def score(prompt, completion, answer):
    return float(len(completion) % 2)
"""


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory) -> tuple[Path, Path, str]:
    """A finished 1-step run whose task names a reward file, and that file's marker (removed: not imported yet)."""
    root = tmp_path_factory.mktemp("shared")
    evil = root / "evil.py"
    evil.write_text(EVIL)
    task = f"arithmetic:reward={evil}:score"
    result = train(tiny_config(root / "run", root / "cache", task=task, steps=1))
    assert result.status == schema.STATUS_FINISHED
    ran = root / "RAN"
    assert ran.exists()  # the user who started the run asked for the file: it ran then
    ran.unlink()
    return root / "run", ran, task


def moestab(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moestab.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_resume_refuses_a_reward_file_named_only_by_the_run_folder(planted_run):
    run, ran, task = planted_run
    before = (run / schema.RUN_JSON).read_bytes()
    done = moestab("train", "--resume", str(run), "--steps", "2", "--cache-dir", str(run.parent / "cache"),
                   cwd=run.parent)
    assert done.returncode == 2, done.stderr
    assert "names the reward function" in done.stderr and f"--task {task}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not ran.exists() and (run / schema.RUN_JSON).read_bytes() == before  # nothing ran, nothing written


def test_probe_refuses_a_reward_file_named_only_by_the_run_folder(planted_run):
    run, ran, _ = planted_run
    done = moestab("probe", "step-volatility", str(run), "--lrs", "1e-3", "--minibatch-counts", "1", "--no-progress",
                   "--cache-dir", str(run.parent / "cache"), cwd=run.parent)
    assert done.returncode == 2, done.stderr
    assert "names the reward function" in done.stderr and "--task" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not ran.exists()


def test_stating_the_task_on_the_command_line_allows_it(planted_run):
    run, _, task = planted_run
    config = load_train_config(None, {"resume": str(run), "task": task, "steps": 2})
    assert config.task == task  # the user's own word: the resume goes on (the file is imported when the run builds it)
    with pytest.raises(TaskSpecError, match="names the reward function"):
        load_train_config(None, {"resume": str(run), "steps": 2})


def test_a_task_without_code_needs_no_word():
    refuse_code_named_by("arithmetic", "run.json")
    refuse_code_named_by("sort:length=4-8", "run.json")
    with pytest.raises(TaskSpecError, match=r"shared/evil\.py:score"):
        refuse_code_named_by("reverse:reward=shared/evil.py:score", "run.json")
