"""Bad input through the real `moestab` entry point (issue #24): each case gets one clear line naming the argument
or file and what is valid, a non-zero exit, a bounded message, and nothing written.

Every case fails at validation, before any model is built or any folder made; the working folder and the cache
are the test's own, so a case that went further would show up as a written file. The read-only resume needs a
finished run and a private mount namespace: it is slow and skips where `unshare` is not allowed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from moestab.cli import main
from moestab.run_folder import schema
from tests.support.models import damaged_model

MAX_ERR = 2000  # characters of stderr a refusal may take: a line or two, never the echo of a huge value


def _laughs(levels: int) -> str:
    """YAML whose single ``task`` value is a list of nested aliases: tiny as text, 9**levels strings as a str()."""
    rows = ["  - &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    rows += [f"  - &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "task:\n" + "\n".join(rows) + "\n"


def _file(tmp: Path, name: str, content: str | bytes) -> str:
    path = tmp / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


def _corrupt_model(tmp: Path) -> str:
    from moestab.models import build_embedded_policy, save_policy

    folder = save_policy(*build_embedded_policy(), tmp / "model")
    weights = Path(folder) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # what an interrupted copy leaves
    return str(folder)


def _model_folder(tmp: Path) -> str:
    """A folder that passes for a Hugging Face model until it is loaded: enough for checks made before loading."""
    folder = tmp / "hf-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return str(folder)


def _foreign_run(tmp: Path) -> str:
    folder = tmp / "other-tool-run"
    folder.mkdir()
    (folder / schema.RUN_JSON).write_text(json.dumps({"name": "exp-7", "framework": "other", "epochs": 3}))
    return str(folder)


Setup = Callable[[Path], list[str]]
OUT = ["--out", "run"]  # relative: the test runs in its own folder
CASES: list[tuple[str, Setup, str]] = [
    # ---- point 2: YAML values and keys ----
    ("nested-aliases", lambda t: ["train", "--config", _file(t, "c.yaml", _laughs(7)), *OUT],
     "task: got a list of 7 items; task takes one value, a string"),
    ("nested-aliases-in-a-list-field", lambda t: ["train", "--config", _file(
        t, "c.yaml", _laughs(7).replace("task:", "report_to:")), *OUT],
     "report_to: item 1 is a list of 9 items; report_to takes a list of single values, each a string"),
    ("mapping-for-a-number", lambda t: ["train", "--config", _file(t, "c.yaml", "steps: {a: 1}\n"), *OUT],
     "steps: got a mapping of 1 item; steps takes one value, an integer"),
    ("duplicate-key", lambda t: ["train", "--config", _file(t, "c.yaml", "algo: grpo\nsteps: 2\nsteps: 3\n"), *OUT],
     "line 3: key 'steps' is given twice (first on line 2); give each key once"),
    ("huge-string-echo", lambda t: ["train", "--algo", "x" * 1_000_000, *OUT], "algo: unknown 'xxxx"),
    ("huge-yaml-integer", lambda t: ["train", "--config", _file(t, "c.yaml", "steps: " + "9" * 5000 + "\n"), *OUT],
     "is not usable YAML"),
    # ---- point 3: raw tracebacks ----
    ("binary-config", lambda t: ["train", "--config", _file(t, "c.yaml", bytes(range(256)) * 4), *OUT],
     "is not text (byte 128 is not UTF-8); give a YAML file"),
    ("seed-past-torch", lambda t: ["train", "--seed", "99999999999999999999999", *OUT],
     "seed must be an integer 0 <= seed < 2**63 (what torch's random generators take), got 99999999999999999999999"),
    ("negative-seed", lambda t: ["train", "--seed", "-1", *OUT], "seed must be an integer 0 <= seed < 2**63"),
    ("cache-dir-is-a-file", lambda t: ["train", "--cache-dir", _file(t, "cache", "not a folder"), *OUT],
     "is a file, not a folder; give a folder (it is created if missing)"),
    ("cache-dir-under-a-file", lambda t: ["train", "--cache-dir", _file(t, "cache", "x") + "/sub", *OUT],
     "cannot be a folder:"),
    ("negative-length", lambda t: ["train", "--task", "reverse:length=-3", *OUT],
     "invalid length='-3': out of range; valid: integer 1-128"),
    ("probe-corrupt-weights", lambda t: ["probe", "numerics", _corrupt_model(t), "--count", "2", *OUT],
     "cannot load the model and tokenizer (weights: model.safetensors)"),
    ("probe-binary-suite", lambda t: ["probe", "numerics", _model_folder(t), "--suite",
                                      _file(t, "s.jsonl", bytes(range(256))), *OUT],
     "is not text (byte 128 is not UTF-8)"),
    # ---- point 4: accepted without a word ----
    ("steps-past-bound", lambda t: ["train", "--steps", "99999999999999999999999", *OUT],
     "steps must be at most 10,000,000"),
    ("max-new-tokens-past-bound", lambda t: ["train", "--max-new-tokens", "100000000", *OUT],
     "max_new_tokens must be at most 65,536"),
    ("threads-past-bound", lambda t: ["train", "--threads", "99999999999999999999", *OUT],
     "threads must be at most 4,096"),
    ("probe-threads-past-bound", lambda t: ["probe", "numerics", "x", "--threads", "99999999999999999999", *OUT],
     "--threads must be at most 4,096"),
    ("empty-out", lambda t: ["train", "--out", ""], "out is empty; give a folder"),
    ("empty-cache-dir", lambda t: ["train", "--cache-dir", " ", *OUT], "cache_dir is empty; give a folder"),
    ("empty-number", lambda t: ["train", "--max-new-tokens", "", *OUT],
     "max_new_tokens: the value is empty; give an integer"),
    ("empty-config-file", lambda t: ["train", "--config", _file(t, "c.yaml", ""), *OUT],
     "is empty; give settings (field: value lines) or leave out --config"),
    ("comments-only-config", lambda t: ["train", "--config", _file(t, "c.yaml", "# steps: 3\n"), *OUT],
     "is empty; give settings"),
    ("empty-config-name", lambda t: ["train", "--config", "", *OUT], "--config is empty"),
    ("probe-seed-past-torch", lambda t: ["probe", "step-volatility", "x", "--seed", "99999999999999999999999", *OUT],
     "seed must be an integer 0 <= seed < 2**63"),
    ("probe-max-new-tokens", lambda t: ["probe", "step-volatility", "x", "--max-new-tokens", "100000000", *OUT],
     "max_new_tokens must be an integer 1 to 65,536"),
    ("probe-cache-dir-is-a-file", lambda t: ["probe", "depth", "--cache-dir", _file(t, "cache", "x"), *OUT],
     "is a file, not a folder"),
    ("probe-empty-out", lambda t: ["probe", "numerics", "x", "--out", ""], "argument --out: the value is empty"),
    ("probe-empty-suite", lambda t: ["probe", "numerics", _model_folder(t), "--suite", "", *OUT], "--suite is empty"),
    # ---- point 6: another tool's run.json ----
    ("probe-foreign-run-json", lambda t: ["probe", "numerics", _foreign_run(t), *OUT],
     "is not a moestab run folder: its run.json is not moestab's"),
    # ---- issue 40: bounds from memory and time (moestab.configs: MAX_STEP_SEQUENCES, MAX_EVAL_SIZE, RATE_BOUNDS) ----
    ("eval-size-past-bound", lambda t: ["train", "--eval-size", "1000000000", *OUT],
     "eval_size must be at most 100,000"),
    ("prompts-per-step-past-bound", lambda t: ["train", "--prompts-per-step", "100000000", *OUT],
     "prompts_per_step*group_size must be at most 1,048,576"),
    ("group-size-past-bound", lambda t: ["train", "--group-size", "100000000", *OUT],
     "prompts_per_step*group_size must be at most 1,048,576"),
    *[(f"{flag.strip('-')}-{value}", lambda t, flag=flag, value=value: ["train", flag, value, *OUT],
       f"{flag.strip('-').replace('-', '_')} must be a finite number in")
      for flag, value in (("--lr", "1e300"), ("--lr", "1e-320"), ("--weight-decay", "1e300"),
                          ("--clip-high", "1e300"), ("--kl-coef", "1e300"), ("--router-aux-loss-coef", "1e300"),
                          ("--temperature", "1e300"), ("--temperature", "1e-30"))],
    ("output-over-a-runs-metrics", lambda t: ["analyze", str(_finished_run_folder(t)), "--json",
                                              str(t / "fake-run" / schema.METRICS_JSONL)],
     "would replace run"),
    ("dashboard-unknown-host", lambda t: ["dashboard", str(t), "--host", "no-such-host.invalid", "--no-browser"],
     "cannot resolve --host 'no-such-host.invalid'"),
    ("model-empty-folder", lambda t: ["train", "--model", _folder(t, "empty-model"), *OUT],
     "is not a Hugging Face model folder (it has no config.json)"),
    ("model-without-weights", lambda t: ["train", "--model", _model_folder(t), *OUT],
     "is not a Hugging Face model folder (its config.json names no model_type)"),
    ("out-name-too-long", lambda t: ["train", "--out", "x" * 300], "out: the name 'xxx"),
    ("embedded-spec-too-large", lambda t: ["train", "--model", "embedded:layers=100000", *OUT],
     "the embedded policy takes at most 1,000,000,000"),
    ("model-nan-router", lambda t: ["train", "--model", damaged_model(t, "nan-router"), *OUT],
     "router model.layers.0.mlp.gate: weight holds 1,024 NaN or infinite values of 1,024; the model's weights are "
     "damaged"),
    ("probe-nan-router", lambda t: ["probe", "numerics", damaged_model(t, "nan-router"), "--count", "2", *OUT],
     "router model.layers.0.mlp.gate: weight holds 1,024 NaN or infinite values"),
    ("model-tokenizer-past-the-embedding", lambda t: ["train", "--model", damaged_model(t, "tokenizer"), *OUT],
     "its tokenizer has 109 tokens but the model's embedding has 89 rows (ids 89-108 have none)"),
    ("probe-tokenizer-past-the-embedding", lambda t: ["probe", "numerics", damaged_model(t, "tokenizer"), *OUT],
     "its tokenizer has 109 tokens but the model's embedding has 89 rows"),
    ("probe-out-an-existing-run", lambda t: ["probe", "numerics", _model_folder(t), "--out",
                                             str(_finished_run_folder(t))],
     "exists and is not a probe folder; choose an empty or new folder"),
]


def _folder(tmp: Path, name: str) -> str:
    (tmp / name).mkdir()
    return str(tmp / name)


def _finished_run_folder(tmp: Path) -> Path:
    """A run folder as ``RunWriter`` lays it out (no training): enough for checks made before any reading."""
    from tests.support.runs import a_run

    folder = a_run(tmp / "fake-run").path
    (folder / schema.METRICS_JSONL).write_text('{"step": 1}\n')
    return folder


def _files(root: Path) -> dict[str, tuple[int, int] | None]:
    """Every path under ``root``, with its size and modification time if it is a file."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else None
            for p in sorted(root.rglob("*"))}


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` with its size and modification time: what a case must leave as it was."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize(("setup", "message"), [pytest.param(s, m, id=i) for i, s, m in CASES])
def test_bad_input_is_refused_in_one_bounded_line_and_writes_nothing(tmp_path, monkeypatch, capsys, setup, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MOESTAB_CACHE", str(tmp_path / "default-cache"))  # a warm start would show up here
    argv = setup(tmp_path)
    before = _tree(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refuses some values itself
        code = exc.code
    err = capsys.readouterr().err
    assert code != 0 and code is not None
    assert message in err, err[:MAX_ERR]
    assert len(err) < MAX_ERR, err[:MAX_ERR]
    assert "Traceback" not in err
    assert _tree(tmp_path) == before  # no run folder, probe folder or cache, nothing changed


def test_bounds_are_documented_in_the_help(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "1 to 10,000,000" in text and "1 to 65,536" in text and "0 <= seed < 2**63" in text


# ---- a finished run's files, damaged or planted: --resume refuses before anything changes ---------------------


class _Planted:
    """Unpickled, it would create ``marker``: what a planted training state would do with torch.load's old default."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _metrics_step(run: Path, value: object) -> None:
    lines = (run / schema.METRICS_JSONL).read_text().splitlines()
    row = json.loads(lines[1])
    row["step"] = value
    lines[1] = json.dumps(row)
    (run / schema.METRICS_JSONL).write_text("\n".join(lines) + "\n")


def _state(run: Path, value: object, steps: tuple[int, ...] = (2,)) -> None:
    for step in steps:
        torch.save(value, run / schema.state_file(step))


def _cut_states(run: Path) -> None:
    for path in (run / schema.STATE_DIR).iterdir():
        path.write_bytes(path.read_bytes()[:100])


def _link(run: Path, name: str) -> None:
    """``name`` in the run folder replaced by a link to a file of the user's beside it."""
    victim = run.parent / "victim.txt"
    victim.write_text("the user's")
    path = run / name
    if path.exists():
        path.unlink()
    path.symlink_to(victim)


RESUME = ["--steps", "3", "--no-progress", "--threads", "1"]
RUN_CASES: list[tuple[str, Callable[[Path], None], bool, str]] = [
    # (id, damage done to a copy of a finished run, whether --task names the run's reward file, message)
    # ---- point 1: no write through a planted link ----
    ("lock-file-is-a-link", lambda run: _link(run, schema.LOCK_FILE), True,
     f"{schema.LOCK_FILE} is a symbolic link"),
    ("metrics-is-a-link", lambda run: _link(run, schema.METRICS_JSONL), True,
     f"{schema.METRICS_JSONL} is a symbolic link"),
    # ---- point 3: no code runs from a run folder ----
    ("reward-file-named-by-the-run", lambda run: None, False,
     "its run.json names the reward function"),
    # ---- point 6: damaged or planted files ----
    ("metrics-step-a-string", lambda run: _metrics_step(run, "3"), True,
     "metrics.jsonl: line 2: 'step' is \"3\", not an integer; mend or delete that line"),
    ("metrics-step-null", lambda run: _metrics_step(run, None), True,
     "metrics.jsonl: line 2: 'step' is null, not an integer"),
    ("state-holds-objects", lambda run: _state(run, {"optimizer": _Planted(run.parent / "planted-ran")}), True,
     "step_000002.pt: holds Python objects other than tensors and plain containers"),
    ("state-not-a-training-state", lambda run: _state(run, [1, 2]), True,
     "step_000002.pt: is not a training state (a dict with an 'optimizer' dict)"),
    ("state-of-another-optimizer", lambda run: _state(run, {"optimizer": {"state": {}, "param_groups": [{}]}}), True,
     "step_000002.pt: does not fit this run's optimizer (KeyError: 'params')"),
    ("every-checkpoint-cut-short", _cut_states, True,
     "every checkpoint is damaged (step 2: step_000002.pt is not a whole torch.save archive"),
]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished 2-step run of the tiny budget (checkpoints 0-2), trained once for the module; cases copy it."""
    from moestab.train import train
    from tests.support.train import tiny_config

    root = tmp_path_factory.mktemp("finished")
    train(tiny_config(root / "run", root / "cache", steps=2, max_zero_advantage_steps=0), log=lambda line: None)
    return root / "run"


@pytest.mark.parametrize(("damage", "task", "message"), [pytest.param(d, t, m, id=i) for i, d, t, m in RUN_CASES])
def test_a_damaged_run_is_refused_on_resume_and_left_as_it_was(tmp_path, monkeypatch, capsys, finished_run, damage,
                                                               task, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MOESTAB_CACHE", str(tmp_path / "default-cache"))
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    damage(run)
    before = _files(tmp_path)
    from tests.support.train import TASK

    code = main(["train", "--resume", str(run), *(["--task", TASK] if task else []), *RESUME])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err, err[:MAX_ERR]
    assert len(err) < MAX_ERR and "Traceback" not in err, err[:MAX_ERR]
    # Every file as it was (run.json still finished, metrics and checkpoints untouched); the run folder's own time
    # moves: its lock was taken and let go.
    assert _files(tmp_path) == before
    assert not (tmp_path / "planted-ran").exists()


# ---- --resume on a read-only mount --------------------------------------------------------------------------


@pytest.mark.slow
def test_resume_on_a_read_only_mount_is_refused_in_one_line(tmp_path):
    from tests.support.train import TASK

    _private_mount_or_skip()
    tiny = ["--task", TASK, "--prompts-per-step", "4", "--group-size", "4", "--minibatches", "2", "--eval-size", "8",
            "--eval-every", "1", "--save-every", "1", "--warm-start-max-steps", "0", "--no-progress", "--threads", "1",
            "--cache-dir", str(tmp_path / "cache")]
    train = [sys.executable, "-m", "moestab.cli", "train", *tiny]
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    first = subprocess.run([*train, "--out", str(tmp_path / "run"), "--steps", "2"], capture_output=True, text=True,
                           env=env, timeout=600)
    assert first.returncode == 0, first.stderr
    resume = " ".join(f'"{p}"' for p in [*train, "--resume", "$MNT/run", "--steps", "3"])
    rc, err = _on_a_read_only_mount(tmp_path, env, f"cp -a {tmp_path}/run $MNT/run",
                                    f"ls -lR --time-style=full-iso $MNT > {tmp_path}/before; {resume}",
                                    f"ls -lR --time-style=full-iso $MNT > {tmp_path}/after")
    assert rc == 2, err
    assert "Read-only file system" in err and "/run" in err and "Traceback" not in err, err
    assert len(err) < MAX_ERR and err.count("error:") == 1, err
    assert (tmp_path / "before").read_text() == (tmp_path / "after").read_text()


# ---- Ctrl-C during start-up, an output on a read-only mount ---------------------------------------------------


def test_ctrl_c_during_start_up_says_interrupted_without_a_traceback(tmp_path):
    """Before the steps nothing defers a Ctrl-C: one sent while the warm start builds the base policy (start-up's
    longest part, announced on stdout) stops the command at once with one line and no run folder."""
    root = Path(__file__).resolve().parents[1]
    # Unbuffered: a piped stdout is block-buffered, and the line would arrive only when the buffer fills, long after
    # the warm start (in the steps, where a Ctrl-C is deferred to the step's end).
    env = {**os.environ, "PYTHONPATH": str(root), "MOESTAB_CACHE": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "moestab.cli", "train", "--out", "run", "--no-progress",
                             "--threads", "1"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    line = proc.stdout.readline()
    assert line.startswith("warm start: building the base policy"), line
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    # 130 is what moestab returns, after its one line. Once in a full-suite run on a loaded machine the process
    # printed that line and still ended by SIGINT (-2 here; a shell shows 130 for both); the cause was not found
    # (CPython ends so when an interrupt escaped code run through PyRun_String, caught later or not). Either way the
    # process reports a Ctrl-C, without a traceback.
    assert proc.returncode in (130, -signal.SIGINT), err[-MAX_ERR:]
    assert err.rstrip().endswith("moestab train: interrupted") and "Traceback" not in err, err[-MAX_ERR:]
    assert not (tmp_path / "run").exists()


def _on_a_read_only_mount(tmp: Path, env: dict, fill: str, command: str, after: str = "true") -> tuple[int, str]:
    """Run ``command`` (shell; ``$MNT`` names the mount) in a private mount namespace on a 200 MB tmpfs that ``fill``
    filled before it was made read-only, then ``after``; the command's exit status and stderr."""
    script = (f"set -e; MNT=$(mktemp -d); mount -t tmpfs -o size=200m tmpfs $MNT; {fill}; mount -o remount,ro $MNT; "
              f"{command} 2> {tmp}/err && echo 0 > {tmp}/rc || echo $? > {tmp}/rc; {after}")
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    return int((tmp / "rc").read_text()), (tmp / "err").read_text()


def _private_mount_or_skip() -> None:
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) for a private mount namespace")
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a private mount namespace here: {probe.stderr.decode().strip()}")


@pytest.mark.parametrize("argv", [["analyze", "RUN", "--csv", "$MNT/out/summary.csv"],
                                  ["analyze", "RUN", "--json", "$MNT/new/summary.json"],
                                  ["probe", "numerics", "MODEL", "--out", "$MNT/probe"]])
def test_an_output_on_a_read_only_mount_is_refused_before_any_work(tmp_path, argv):
    """README: exit 2 when --json / --csv cannot be written (probe --out likewise), said before anything is read.
    Root writes through permissions, so only a read-only mount tests this as root: a private mount namespace."""
    _private_mount_or_skip()
    run, model = _finished_run_folder(tmp_path), _model_folder(tmp_path)
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    command = " ".join(f'"{a}"' for a in [sys.executable, "-m", "moestab.cli", *argv]).replace(
        '"RUN"', f'"{run}"').replace('"MODEL"', f'"{model}"')
    rc, err = _on_a_read_only_mount(tmp_path, env, "mkdir $MNT/out", command)
    assert rc == 2, err
    assert "is not writable (read-only or not yours)" in err and "Traceback" not in err, err
    assert len(err) < MAX_ERR and err.count("error:") == 1, err
