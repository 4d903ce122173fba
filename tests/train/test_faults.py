"""Fault injection on the real `moestab train` CLI: every way a run can stop, and what the user sees next.

Each test drives `python -m moestab.cli train` in a subprocess (real signals, real file systems) and
checks the exit code, the message, run.json's status afterwards, that data written before the fault
is unchanged (hashes), and that `--resume` continues bit-identically to a run that never stopped.
Disk-full and read-only cases mount a small tmpfs in a private mount namespace (`unshare`), and skip
with the reason where the machine does not allow it.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moestab.run_folder import schema
from tests.support.train import TASK

pytestmark = pytest.mark.slow

TINY = ["--task", TASK, "--prompts-per-step", "4", "--group-size", "4", "--minibatches", "2", "--eval-size", "8",
        "--eval-every", "1", "--save-every", "1", "--warm-start-max-steps", "0", "--no-progress", "--threads", "1"]


def cli(*args: str, cwd: Path, cache: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "moestab.cli", "train", *TINY, "--cache-dir", str(cache), *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=_env())


def _env() -> dict[str, str]:
    root = Path(__file__).resolve().parents[2]
    return {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def start(*args: str, cwd: Path, cache: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "moestab.cli", "train", *TINY, "--cache-dir", str(cache), *args]
    return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())


def info(run: Path) -> dict:
    return json.loads((run / schema.RUN_JSON).read_text())


def metrics(run: Path, *, torn_ok: bool = False) -> list[dict]:
    """metrics.jsonl without the wall times; ``torn_ok`` skips a last line a kill cut short."""
    lines = [x for x in (run / schema.METRICS_JSONL).read_text().splitlines() if x.strip()]
    if torn_ok and lines:
        try:
            json.loads(lines[-1])
        except json.JSONDecodeError:
            lines = lines[:-1]
    return [{k: v for k, v in json.loads(x).items() if not k.startswith("time/")} for x in lines]


def digest(*paths: Path) -> str:
    """Hash of every file under ``paths`` (names and bytes)."""
    h = hashlib.sha256()
    for path in paths:
        for f in sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file()):
            h.update(str(f.relative_to(path.parent)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"process ended early: {proc.stdout.read()}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("timed out")


def steps_logged(run: Path) -> int:
    path = run / schema.METRICS_JSONL
    return path.read_text().count("\n") if path.exists() else 0


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("faults-cache")


@pytest.fixture(scope="module")
def straight(tmp_path_factory, cache) -> list[dict]:
    """Metrics of 4 uninterrupted steps: what every resumed run must reproduce."""
    root = tmp_path_factory.mktemp("straight")
    assert cli("--out", "run", "--steps", "4", cwd=root, cache=cache).returncode == 0
    return metrics(root / "run")


# ---- 1. --resume with any spelling of the folder ------------------------------------------------


def test_resume_accepts_any_spelling_of_the_run_folder_and_moved_or_copied_folders(tmp_path, cache, straight):
    first = cli("--steps", "2", cwd=tmp_path, cache=cache)  # no --out: runs/<algo>-<replay>-seed0
    assert first.returncode == 0, first.stderr
    made = tmp_path / "runs" / "gspo-off-seed0"
    before = digest(made / schema.checkpoint_dir(2))
    moved, copied = tmp_path / "elsewhere" / "moved", tmp_path / "copy"
    spellings = {
        "runs/gspo-off-seed0": None, "./runs/gspo-off-seed0": None, "runs/gspo-off-seed0/": None,
        str(made): None, str(moved): "move", str(copied): "copy",
    }
    for spelling, how in spellings.items():
        source = tmp_path / "pristine"
        if not source.exists():
            shutil.copytree(made, source)
        target = Path(spelling) if Path(spelling).is_absolute() else tmp_path / spelling
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, target) if how != "move" else shutil.move(str(shutil.copytree(source, target)),
                                                                          str(target))
        done = cli("--resume", spelling, "--steps", "3", cwd=tmp_path, cache=cache)
        assert done.returncode == 0, (spelling, done.stderr)
        assert metrics(target) == straight[:3], spelling  # bit-identical to the run that never stopped
        assert info(target)["status"] == "finished" and info(target)["last_step"] == 3
        assert digest(target / schema.checkpoint_dir(2)) == before  # what existed is untouched


def test_resume_refuses_a_changed_setting_naming_it(tmp_path, cache):
    assert cli("--out", "run", "--steps", "1", cwd=tmp_path, cache=cache).returncode == 0
    done = cli("--resume", "run", "--steps", "2", "--lr", "0.5", cwd=tmp_path, cache=cache)
    assert done.returncode == 2
    assert "settings differ from the run's (lr: run has 0.0002, asked 0.5)" in done.stderr
    assert info(tmp_path / "run")["last_step"] == 1


# ---- 2. a stop before the step-0 checkpoint ----------------------------------------------------


def test_an_error_before_the_first_checkpoint_fails_the_run_and_overwrite_starts_over(tmp_path, cache):
    from moestab.models import build_embedded_policy, save_policy

    save_policy(*build_embedded_policy(), tmp_path / "model")
    (tmp_path / "boom.py").write_text("def boom(prompt, completion, answer):\n    raise ValueError('bad reward')\n")
    task = "arithmetic:reward=boom.py:boom"
    args = ["--model", str(tmp_path / "model"), "--out", "run", "--steps", "1"]
    done = cli(*args, "--task", task, cwd=tmp_path, cache=cache)
    assert done.returncode == 2
    assert "ValueError: bad reward" in done.stderr and "start over with --overwrite" in done.stderr
    state = info(tmp_path / "run")
    assert state["status"] == "failed" and "bad reward" in state["error"]  # not "running"
    again = cli(*args, cwd=tmp_path, cache=cache)  # fixed task, same folder, no --overwrite
    assert again.returncode == 2 and "stopped before its first checkpoint" in again.stderr
    assert "--overwrite" in again.stderr
    resumed = cli("--resume", "run", cwd=tmp_path, cache=cache)
    assert resumed.returncode == 2 and "no complete checkpoint" in resumed.stderr and "--overwrite" in resumed.stderr
    over = cli(*args, "--overwrite", cwd=tmp_path, cache=cache)
    assert over.returncode == 0, over.stderr
    assert info(tmp_path / "run")["status"] == "finished"


def test_overwrite_refuses_a_folder_that_is_not_a_run(tmp_path, cache):
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "thesis.tex").write_text("do not delete")
    done = cli("--out", "precious", "--overwrite", "--steps", "1", cwd=tmp_path, cache=cache)
    assert done.returncode == 2 and "is a non-empty folder that is not a moestab run" in done.stderr
    assert (tmp_path / "precious" / "thesis.tex").read_text() == "do not delete"


@pytest.mark.parametrize("signals", [1, 2])
def test_ctrl_c_during_the_start_evaluation(tmp_path, cache, signals):
    # A large eval set keeps the process in the start evaluation long enough to signal it there.
    proc = start("--out", "run", "--steps", "2", "--eval-size", "3000", cwd=tmp_path, cache=cache)
    run = tmp_path / "run"
    wait_for(lambda: (run / schema.RUN_JSON).exists(), proc)
    for _ in range(signals):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
    out = proc.communicate(timeout=300)[0]
    state = info(run)
    assert state["status"] == "interrupted", out
    if signals == 1:  # deferred: the evaluation finishes, step 0 is saved, no step runs; 130 = 128 + SIGINT
        assert proc.returncode == 130 and state["last_step"] == 0
        assert (run / schema.checkpoint_dir(0)).is_dir() and "moestab train --resume" in out
    else:  # at once: nothing to resume, and the message says how to start over
        assert proc.returncode != 0 and not (run / schema.checkpoint_dir(0)).exists()
        assert "start over with --overwrite" in state["error"]


# ---- 3. invalid values are refused before anything is written: tests/train/test_run_control.py -----


# ---- 4. SIGTERM, SIGKILL -------------------------------------------------------------------------


def test_sigterm_saves_marks_interrupted_and_resumes_bit_identically(tmp_path, cache, straight):
    proc = start("--out", "run", "--steps", "200", cwd=tmp_path, cache=cache)
    run = tmp_path / "run"
    wait_for(lambda: steps_logged(run) >= 2, proc)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 143, out  # 128 + SIGTERM: a script tells it from a finished run
    state = info(run)
    assert state["status"] == "interrupted" and "interrupted (SIGTERM)" in out
    last = state["last_step"]
    assert (run / schema.checkpoint_dir(last)).is_dir()
    saved = digest(run / schema.checkpoint_dir(1))
    done = cli("--resume", "run", "--steps", "4", cwd=tmp_path, cache=cache)
    assert done.returncode == 0, done.stderr
    assert metrics(run)[:4] == straight and digest(run / schema.checkpoint_dir(1)) == saved


def test_resume_to_a_step_the_run_has_passed_is_refused_and_changes_nothing(tmp_path, cache):
    first = cli("--out", "run", "--steps", "2", cwd=tmp_path, cache=cache)
    assert first.returncode == 0, first.stderr
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()}
    for steps in ("1", "2"):  # before its last step, and the step it finished at
        done = cli("--resume", "run", "--steps", steps, cwd=tmp_path, cache=cache)
        assert done.returncode == 2, done.stderr
        assert f"--steps {steps}: the run has finished step 2 (of 2)" in done.stderr, done.stderr
        assert "give --steps above 2" in done.stderr and "Traceback" not in done.stderr
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()} == before


@pytest.mark.parametrize("trial", [0, 1])
def test_sigkill_leaves_running_that_readers_call_stopped_and_resume_continues(tmp_path, cache, straight, trial,
                                                                                capsys):
    from moestab.cli import main

    proc = start("--out", "run", "--steps", "200", cwd=tmp_path, cache=cache)
    run = tmp_path / "run"
    wait_for(lambda: steps_logged(run) >= 1, proc)
    first = info(run)
    time.sleep(random.Random(trial).uniform(0.0, 2.0))  # a random moment: in a step, an eval or a write
    proc.kill()
    proc.wait()
    assert info(run)["status"] == "running"  # nothing could write it
    analyzed = subprocess.run([sys.executable, "-m", "moestab.cli", "analyze", str(run), "--json"],
                              capture_output=True, text=True, env=_env())
    assert json.loads(analyzed.stdout)[0]["status"] == "stopped"
    assert json.loads((run / schema.LOCK_FILE).read_text())["pid"] == proc.pid  # its lock file is left behind
    assert main(["train", "--out", str(run), *TINY, "--cache-dir", str(cache)]) == 2  # not silently reused
    assert f"took over the lock of process {proc.pid} on host {socket.gethostname()}" in capsys.readouterr().out
    logged = metrics(run, torn_ok=True)
    assert logged[:4] == straight[: len(logged)]  # what was logged before the kill was right all along
    target = max(len(logged) + 1, 4)
    done = cli("--resume", "run", "--steps", str(target), cwd=tmp_path, cache=cache)
    assert done.returncode == 0, done.stderr
    resumed = metrics(run)
    assert len(resumed) == target and info(run)["status"] == "finished"
    assert resumed[:4] == straight and resumed[: len(logged)] == logged  # recomputed steps are bit-identical
    after = info(run)
    assert (after["created"], after["config"]) == (first["created"], first["config"])


# ---- 5. disk full, read-only --out -------------------------------------------------------------


def _in_tmpfs(size: str, script: str) -> subprocess.CompletedProcess:
    """Run ``script`` (sh) in a private mount namespace with a tmpfs of ``size`` mounted at $MNT."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) for a private mount namespace")
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a private mount namespace here: {probe.stderr.decode().strip()}")
    wrapped = f"set -e; MNT=$(mktemp -d); mount -t tmpfs -o size={size} tmpfs $MNT; {script}"
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", wrapped],
                          capture_output=True, text=True, env=_env(), timeout=300)


def _train_cmd(cache: Path, *args: str) -> str:
    parts = [sys.executable, "-m", "moestab.cli", "train", *TINY, "--cache-dir", str(cache), *args]
    return " ".join(f'"{p}"' for p in parts)  # double quotes: $MNT expands


def test_disk_full_fails_the_run_naming_the_file_and_the_space_and_leaves_no_temporaries(tmp_path, cache, straight):
    # A checkpoint of the embedded policy (weights + AdamW state) is ~20 MiB: 50 MiB hold a few steps,
    # and the disk fills while a later checkpoint is written.
    report = tmp_path / "report.json"
    script = (
        f"{_train_cmd(cache, '--out', '$MNT/run', '--steps', '3')} > {tmp_path}/out.txt 2>&1"
        f" || echo $? > {tmp_path}/rc;"
        f"{sys.executable} -c \"import json,pathlib,sys; r=pathlib.Path(sys.argv[1]);"
        f" print(json.dumps({{'info': json.loads((r/'run.json').read_text()),"
        f" 'metrics': (r/'metrics.jsonl').read_text().splitlines(),"
        f" 'files': sorted(str(p.relative_to(r)) for p in r.rglob('*'))}}))\" $MNT/run > {report}"
    )
    done = _in_tmpfs("50m", script)
    assert done.returncode == 0, done.stderr
    out = (tmp_path / "out.txt").read_text()
    assert (tmp_path / "rc").read_text().strip() == "2", out
    assert "the disk is full" in out and "a checkpoint of this model needs about" in out and "MiB free" in out
    seen = json.loads(report.read_text())
    assert seen["info"]["status"] == "failed" and "the disk is full" in seen["info"]["error"]
    last = seen["info"]["last_step"]  # the disk filled while the checkpoint after it was written
    assert 1 <= last < 3 and "--resume" in seen["info"]["error"], seen["info"]
    assert f"step_{last + 1:06d}" in seen["info"]["error"]  # the file that could not be written is named
    assert not [f for f in seen["files"] if f.split("/")[-1].startswith(".")]  # no temporaries left
    assert f"checkpoints/step_{last:06d}/model.safetensors" in seen["files"]
    logged = [{k: v for k, v in json.loads(x).items() if not k.startswith("time/")} for x in seen["metrics"]]
    assert logged[:last] == straight[:last]  # what was written before the disk filled is intact


def test_read_only_out_is_refused_before_anything_is_loaded(tmp_path, cache):
    script = (f"mount -o remount,ro $MNT; {_train_cmd(cache, '--out', '$MNT/run', '--steps', '1')} "
              "|| echo rc=$?; ls -A $MNT")
    done = _in_tmpfs("1m", script)
    assert "cannot write to the run folder" in done.stderr and "Read-only file system" in done.stderr
    assert done.stdout.strip() == "rc=2"  # exit 2, and `ls -A` shows the folder still empty
    assert "warm start" not in done.stdout  # refused before the base model was built


# ---- 6. a torn line of metrics.jsonl -----------------------------------------------------------


def test_resume_drops_a_torn_metrics_line_and_says_so(tmp_path, cache, straight):
    assert cli("--out", "run", "--steps", "2", cwd=tmp_path, cache=cache).returncode == 0
    run = tmp_path / "run"
    with (run / schema.METRICS_JSONL).open("a") as f:
        f.write('{"step": 3, "reward/me')  # what a kill during an append leaves
    (run / schema.CHECKPOINTS_DIR / ".step_000003.tmp").mkdir()  # and an unfinished checkpoint
    (run / schema.CHECKPOINTS_DIR / ".step_000002.old").mkdir()  # and a half-replaced one
    done = cli("--resume", "run", "--steps", "3", cwd=tmp_path, cache=cache)
    assert done.returncode == 0, done.stderr
    assert "dropped 1 torn line(s) of metrics.jsonl (line 3)" in done.stdout
    assert "removed the leftover checkpoints/.step_000003.tmp" in done.stdout
    assert metrics(run) == straight[:3]
    assert not list((run / schema.CHECKPOINTS_DIR).glob(".*"))


# ---- 7. messages -------------------------------------------------------------------------------


def test_a_missing_model_folder_is_named(tmp_path, cache):
    done = cli("--model", "./no/such/model", "--out", "run", cwd=tmp_path, cache=cache)
    assert done.returncode == 2 and "model: the folder './no/such/model' does not exist" in done.stderr
    assert not (tmp_path / "run").exists()


def test_truncated_weights_name_the_file(tmp_path, cache):
    from moestab.models import build_embedded_policy, save_policy

    folder = save_policy(*build_embedded_policy(), tmp_path / "model")
    weights = Path(folder) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    done = cli("--model", str(folder), "--out", "run", cwd=tmp_path, cache=cache)
    assert done.returncode == 2 and "model.safetensors" in done.stderr and "cannot load model" in done.stderr
    assert "Traceback" not in done.stderr.split("the error was raised here")[0]
    assert not (tmp_path / "run" / schema.RUN_JSON).exists()


def test_a_wrongly_shaped_weight_is_named_without_a_traceback(tmp_path, cache):
    from tests.support.models import damaged_model

    done = cli("--model", damaged_model(tmp_path, "shape"), "--out", "run", cwd=tmp_path, cache=cache)
    assert done.returncode == 2 and "cannot load model" in done.stderr and "Traceback" not in done.stderr
    assert "model.layers.0.mlp.gate.weight | MISMATCH" in done.stderr  # transformers' report names the weight
    assert not (tmp_path / "run").exists()


# ---- 7. two writers of one folder --------------------------------------------------------------


def test_two_writers_started_together_one_runs_and_the_other_is_refused_naming_it(tmp_path, cache, straight):
    procs = [start("--out", "run", "--steps", "4", cwd=tmp_path, cache=cache) for _ in range(2)]
    outs = [proc.communicate(timeout=300)[0] for proc in procs]
    assert sorted(proc.returncode for proc in procs) == [0, 2], outs
    winner, loser = (0, 1) if procs[0].returncode == 0 else (1, 0)
    refusal = outs[loser]
    assert f"is being written by process {procs[winner].pid} on host {socket.gethostname()}" in refusal, refusal
    run = tmp_path / "run"
    assert metrics(run) == straight  # steps 1-4 once each, as a run alone writes them: the refused one wrote nothing
    state = info(run)
    assert (state["status"], state["writer"]["pid"]) == ("finished", procs[winner].pid)
    assert not (run / schema.LOCK_FILE).exists()  # released at the end


def test_resume_and_a_new_run_of_a_folder_being_written_are_refused_before_anything_changes(tmp_path, cache):
    proc = start("--out", "run", "--steps", "200", "--max-zero-advantage-steps", "0", cwd=tmp_path, cache=cache)
    run = tmp_path / "run"
    try:
        wait_for(lambda: steps_logged(run) >= 1, proc)
        config = (run / schema.CONFIG_YAML).read_bytes()
        for args in (["--resume", "run"], ["--out", "run", "--overwrite"]):
            done = cli(*args, cwd=tmp_path, cache=cache)
            assert done.returncode == 2, done.stderr
            assert f"is being written by process {proc.pid} on host {socket.gethostname()}" in done.stderr
            assert proc.poll() is None  # the writer goes on
        assert (run / schema.CONFIG_YAML).read_bytes() == config
        assert json.loads((run / schema.LOCK_FILE).read_text())["pid"] == proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 143, out
    steps = [m["step"] for m in metrics(run)]
    assert steps == list(range(1, len(steps) + 1)) and info(run)["writer"]["pid"] == proc.pid
