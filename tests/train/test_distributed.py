"""Multi-process training (FSDP2 over gloo, 2 CPU processes) against one process on the same data.

The rollout engine of these runs (tests/support/distributed_engines.py) samples every sequence from its own prompt's
seed, so a one-process and a two-process run see the same rollouts; everything after that (advantages, minibatch
split, losses, gradients, metrics, records) must then agree up to float summation order.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from moestab.configs import ConfigError, config_to_dict
from moestab.recording import measurements
from moestab.run_folder import schema
from moestab.run_folder.reader import load_metrics, load_tokens, read_routes
from moestab.run_folder.run_info import read_run_info
from moestab.train import train
from moestab.train.distributed import World, local_chunks
from moestab.train.launch import torchrun_command
from tests.support.distributed_engines import PerPromptEngine
from tests.support.measurements import COLUMN
from tests.support.measurements import add as add_measurement
from tests.support.train import tiny_config

WORKER = Path(__file__).parents[1] / "support" / "dist_worker.py"

# Keys that differ by design: wall times, and (for the record) nothing else.
TIMES = ("time/step_s", "time/rollout_s", "time/update_s")


def _torchrun(config, engine: str, timeout: float = 300, measurement: str | None = None
              ) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(WORKER),
               json.dumps(config_to_dict(config)), engine, *([measurement] if measurement else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)


def _close(a, b, key: str, tol: dict) -> None:
    if isinstance(a, list):
        assert len(a) == len(b), key
        for x, y in zip(a, b, strict=True):
            _close(x, y, key, tol)
    elif a is None or b is None or isinstance(a, str):
        assert a == b, key
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), key
    else:
        assert b == pytest.approx(a, **tol), key


# Summation order differs between one and two processes. The runs are compared in float64, where that moves results
# by ~1e-15 relative whatever the CPU: in float32 the same comparison passed or failed by machine (a loss 1.1e-4
# relative apart on one CPU, within 1e-4 on another), because two float32 updates amplify rounding by the inverse
# gradient scale of AdamW's first steps. A real error is far larger: AdamW's step count moved by one, a bug this test
# caught, changed the loss by 3e-3.
TOLERANCE = {"rel": 1e-10, "abs": 1e-13}
TABLE_ATOL = 1e-6
"""Per-token tables store float32: a float64 value rounded to float32 moves by up to 6e-8 relative (|log-prob| <= 10:
6e-7), and two runs whose float64 values differ by 1e-15 can round to neighbouring float32 values."""
CASES = {
    # objective, replay, minibatches, what it covers (every case in float64, see TOLERANCE)
    "gspo-r3": ("gspo", "rollout", 4, {}),  # sequence ratio, rollout routes replayed
    # token ratio, seq-mean-token-mean, old-policy routes replayed; routing's share (its free forward) measured
    "grpo-r2": ("grpo", "old", 4, {"routing_share": True}),
    "dapo": ("dapo", "off", 4, {"dynamic_sampling": False}),  # token-mean: each rank's share is its token count
    # DAPO's dynamic sampling: groups without signal (prompts starting 0-4) dropped, more drawn, the whole step's
    # groups kept in one process's order and handed out in blocks
    "dapo-dynamic-sampling": ("dapo", "off", 4, {"task": "arithmetic:reward=tests/support/rewards.py:"
                                                         "low_first_digit_is_free"}),
    "dr-grpo": ("dr-grpo", "off", 4, {}),  # Dr. GRPO's constant over the global minibatch
    # every minibatch lies on one rank: the other runs a stand-in (for routing's share's replayed forward too)
    "one-row-minibatches": ("gspo", "off", 16, {"routing_share": True}),
    # the measurement budget's steps: step 2 runs no measure-only forward (free pi_old under R3, pi_new) on any rank
    "measure-every-2": ("gspo", "rollout", 4, {"measure_every": 2}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_two_processes_match_one_on_the_same_data(case, tmp_path, cache_dir):
    algo, replay, minibatches, extra = CASES[case]
    settings = {"algo": algo, "routing_replay": replay, "minibatches": minibatches, "steps": 2, "lr": 1e-3,
                "max_zero_advantage_steps": 0, "dtype": "float64", **extra}
    tol = TOLERANCE
    one = tiny_config(tmp_path / "one", cache_dir, **settings)
    two = tiny_config(tmp_path / "two", cache_dir, nproc=2, **settings)
    train(one, rollout_engine=PerPromptEngine, log=lambda _: None)
    done = _torchrun(two, "per-prompt")
    assert done.returncode == 0, done.stderr[-3000:]

    info = read_run_info(two.out)
    assert info.status == schema.STATUS_FINISHED and info.environment["world_size"] == 2
    # The metrics of both steps: step 2 starts from the weights step 1 left, so it also checks the update.
    m1, m2 = load_metrics(one.out), load_metrics(two.out)
    assert len(m1) == len(m2) == 2
    assert m1["advantage/nonzero_frac"].gt(0).all()  # a step that learns nothing would prove little
    if "sampling/groups_dropped" in m1:
        assert m1["sampling/groups_dropped"].gt(0).all() and m1["sampling/extra_rollouts"].gt(0).any()
    for key in m1.columns:
        if key not in TIMES:
            for a, b in zip(m1[key].tolist(), m2[key].tolist(), strict=True):
                _close(a, b, key, tol)
    # One Hugging Face folder per checkpoint, with the same weights, element by element.
    for step in (1, 2):
        w1 = load_file(Path(one.out) / schema.checkpoint_dir(step) / "model.safetensors")
        w2 = load_file(Path(two.out) / schema.checkpoint_dir(step) / "model.safetensors")
        assert w1.keys() == w2.keys()
        for name in w1:
            torch.testing.assert_close(w2[name], w1[name], rtol=tol["rel"], atol=tol["abs"], msg=name)
    # The ranks' per-token records merge to the one-process tables: same tokens, same routes.
    t1, t2 = load_tokens(one.out), load_tokens(two.out)
    assert len(t1) == len(t2) > 0
    keys = [schema.COL_STEP, schema.COL_SEQ, schema.COL_POSITION, schema.COL_PROMPT, schema.COL_MINIBATCH]
    assert t1[keys].equals(t2[keys])
    for column in t1.columns.difference(keys):
        np.testing.assert_allclose(t2[column].to_numpy(float), t1[column].to_numpy(float), rtol=tol["rel"],
                                   atol=TABLE_ATOL, err_msg=column)
    top_k = info.model.top_k
    measured_steps = [1, 2] if one.measure_every == 1 else [1]
    assert sorted(t1[schema.COL_STEP].unique()) == measured_steps  # an unmeasured step writes no table
    for step in measured_steps:
        for column in (schema.COL_ROUTES_ROLLOUT, schema.COL_ROUTES_OLD_FREE, schema.COL_ROUTES_NEW):
            r1 = np.sort(read_routes(Path(one.out) / schema.tokens_file(step), column, top_k), -1)
            r2 = np.sort(read_routes(Path(two.out) / schema.tokens_file(step), column, top_k), -1)
            assert np.array_equal(r1, r2), (step, column)


@pytest.mark.slow
def test_resume_continues_with_the_same_process_count_and_refuses_another(tmp_path, cache_dir):
    config = tiny_config(tmp_path / "run", cache_dir, nproc=2, steps=1)
    assert _torchrun(config, "per-prompt").returncode == 0
    resumed = tiny_config(tmp_path / "run", cache_dir, nproc=2, steps=2, resume=str(tmp_path / "run"))
    done = _torchrun(resumed, "per-prompt")
    assert done.returncode == 0, done.stderr[-3000:]
    info = read_run_info(tmp_path / "run")
    assert (info.status, info.last_step) == (schema.STATUS_FINISHED, 2)
    assert load_metrics(tmp_path / "run")["step"].tolist() == [1, 2]
    other = tiny_config(tmp_path / "run", cache_dir, nproc=1, steps=3, resume=str(tmp_path / "run"))
    with pytest.raises(Exception, match="nproc: run has 2, asked 1"):
        train(other, rollout_engine=PerPromptEngine, log=lambda _: None)


@pytest.mark.slow
def test_a_dying_rank_stops_the_others_with_a_message(tmp_path, cache_dir):
    config = tiny_config(tmp_path / "run", cache_dir, nproc=2, steps=4)
    done = _torchrun(config, "dying", timeout=240)  # no hang: the survivors notice the dead peer
    assert done.returncode != 0
    # torchrun names the rank that failed first and how; rank 0, blocked in the sharded forward's all-gather, hears
    # from gloo that its peer is gone and records it.
    assert re.search(r"rank\s*: 1 \(local_rank: 1\)\s*exitcode\s*: -9", done.stderr), done.stderr[-2000:]
    info = read_run_info(tmp_path / "run")
    assert info.status == schema.STATUS_FAILED
    # gloo says "closed" when it reads the peer's end of the socket and "reset" when the kernel answers for the dead
    # process (a race between the two, seen on a loaded machine); either is the peer gone, with gloo's hint after it.
    assert info.error.startswith("step 2: ") and re.search(r"Connection (closed|reset) by peer", info.error), info.error
    assert "remote worker" in info.error and "--resume" in info.error, info.error


@pytest.mark.slow
def test_cli_launches_the_processes_and_refuses_bad_counts_before_writing(tmp_path, cache_dir, capsys):
    from moestab.cli import main

    out = tmp_path / "run"
    flags = ["--steps", "1", "--prompts-per-step", "4", "--group-size", "4", "--minibatches", "2", "--eval-size", "8",
             "--warm-start-max-steps", "0", "--cache-dir", str(cache_dir), "--no-progress", "--out", str(out),
             "--task", "arithmetic:reward=tests/support/rewards.py:length_parity"]
    assert main(["train", "--nproc", "3", *flags]) == 2
    assert "nproc=3 does not divide prompts_per_step=4" in capsys.readouterr().err and not out.exists()
    assert main(["train", "--nproc", "2", *flags]) == 0
    info = read_run_info(out)
    assert (info.status, info.config["nproc"], info.environment["world_size"]) == (schema.STATUS_FINISHED, 2, 2)
    # The processes fail (no such model) after the launcher's checks: a failure, though the old run.json says
    # "finished", and --overwrite deleted nothing.
    assert main(["train", "--nproc", "2", *flags, "--overwrite", "--model", str(tmp_path / "no-model")]) != 0
    assert read_run_info(out).updated == info.updated


def _cli(tmp_path, cache_dir, *flags: str) -> list[str]:
    return [sys.executable, "-m", "moestab", "train", "--nproc", "2", "--prompts-per-step", "4", "--group-size", "4",
            "--minibatches", "2", "--eval-size", "8", "--warm-start-max-steps", "0", "--cache-dir", str(cache_dir),
            "--no-progress", "--out", str(tmp_path / "run"), *flags]


@pytest.mark.slow
def test_an_error_on_one_rank_is_printed_by_that_rank(tmp_path, cache_dir):
    task = "arithmetic:reward=tests/support/rewards.py:fails_on_rank_1"
    done = subprocess.run(_cli(tmp_path, cache_dir, "--steps", "2", "--task", task), capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode != 0
    assert re.search(r"moestab train \(rank 1\): error: .*this reward fails on rank 1 only", done.stderr), \
        done.stderr[-3000:]
    assert read_run_info(tmp_path / "run").status == schema.STATUS_FAILED


@pytest.mark.slow
def test_sigterm_lets_every_process_finish_its_step_and_save(tmp_path, cache_dir):
    task = "arithmetic:reward=tests/support/rewards.py:length_parity"
    command = _cli(tmp_path, cache_dir, "--steps", "500", "--task", task, "--max-zero-advantage-steps", "0")
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    metrics = tmp_path / "run" / schema.METRICS_JSONL
    deadline = time.monotonic() + 240
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2) and time.monotonic() < deadline:
        time.sleep(0.2)
    launcher.send_signal(signal.SIGTERM)
    out, err = launcher.communicate(timeout=240)
    assert launcher.returncode == 143, err[-3000:]  # 128 + SIGTERM, once every process saved
    info = read_run_info(tmp_path / "run")
    assert info.status == schema.STATUS_INTERRUPTED and 2 <= info.last_step < 500
    assert (tmp_path / "run" / schema.checkpoint_dir(info.last_step)).is_dir()  # the last step was saved
    assert f"run interrupted at step {info.last_step} (2 processes)" in out


def test_library_train_refuses_a_process_count_it_was_not_launched_with(tmp_path, cache_dir):
    config = tiny_config(tmp_path / "run", cache_dir, nproc=2)
    with pytest.raises(ConfigError, match=r"nproc=2 but this is 1 of 1 process\(es\); launch it with "
                                          r"`moestab train --nproc 2"):
        train(config, log=lambda _: None)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("rank", [0, 1])
def test_local_chunks_give_each_rank_its_rows_of_every_minibatch(rank):
    # 8 rows over 2 ranks (rows 0-3 on rank 0, 4-7 on rank 1); minibatch 1 lies entirely on rank 1.
    chunks = [torch.tensor([0, 5]), torch.tensor([4, 6]), torch.tensor([1, 2, 3, 7])]
    mine = local_chunks(chunks, World(rank=rank, size=2), 8)
    expected = {0: [[0], [], [1, 2, 3]], 1: [[1], [0, 2], [3]]}[rank]
    assert [c.tolist() for c in mine] == expected


def test_torchrun_command_runs_this_interpreter_on_one_machine(tmp_path):
    command = torchrun_command(tmp_path / "c.yaml", 4)
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--standalone" in command and "--nproc-per-node=4" in command
    assert command[-5:] == ["-m", "moestab", "train", "--config", str(tmp_path / "c.yaml")]


@pytest.mark.slow
def test_a_measurement_s_own_column_survives_two_processes(tmp_path, cache_dir):
    """tests/support/measurements.py's column-filling measurement, added in both processes (issue 56.1)."""
    settings = {"steps": 1, "dtype": "float64", "max_zero_advantage_steps": 0}
    one = tiny_config(tmp_path / "one", cache_dir, **settings)
    two = tiny_config(tmp_path / "two", cache_dir, nproc=2, **settings)
    done = _torchrun(two, "per-prompt", measurement="logp-new-again")
    assert done.returncode == 0, done.stderr[-3000:]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(measurements, "MEASUREMENTS", add_measurement("logp-new-again"))
        train(one, rollout_engine=PerPromptEngine, log=lambda _: None)
    t1 = load_tokens(one.out, columns=[schema.COL_LOGP_NEW, COLUMN])
    t2 = load_tokens(two.out, columns=[schema.COL_LOGP_NEW, COLUMN])
    assert len(t1) == len(t2) > 0 and t2[COLUMN].equals(t2[schema.COL_LOGP_NEW])
    np.testing.assert_allclose(t2[COLUMN].to_numpy(float), t1[COLUMN].to_numpy(float), rtol=TOLERANCE["rel"],
                               atol=TABLE_ATOL)
