"""Resume, NaN stop, Ctrl-C and configuration errors of `moestab train`."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from moestab.cli import main
from moestab.configs import ConfigError
from moestab.run_folder import RunFolder, schema
from moestab.train import TrainingError, train
from tests.support.train import TASK, tiny_config

QUIET = {"log": lambda s: None}


def metric_lines(run_dir):
    lines = [json.loads(line) for line in (run_dir / schema.METRICS_JSONL).read_text().splitlines()]
    return [{k: v for k, v in m.items() if not k.startswith("time/")} for m in lines]


def test_resume_after_a_kill_reproduces_an_uninterrupted_run(tmp_path, cache_dir):
    straight = tmp_path / "straight"
    train(tiny_config(straight, cache_dir, steps=4, save_every=2), **QUIET)

    killed = tmp_path / "killed"
    train(tiny_config(killed, cache_dir, steps=3, save_every=2), **QUIET)
    # Simulate a kill during step 4 after step 3 was logged but before its checkpoint existed.
    for path in [killed / schema.checkpoint_dir(3), killed / schema.STATE_DIR / "step_000003.pt"]:
        if path.is_dir():
            import shutil

            shutil.rmtree(path)
        else:
            path.unlink()
    assert RunFolder(killed).complete_checkpoints()[-1] == 2
    train(tiny_config(killed, cache_dir, steps=4, save_every=2, resume=str(killed)), **QUIET)

    assert metric_lines(killed) == metric_lines(straight)
    info = json.loads((killed / schema.RUN_JSON).read_text())
    assert info["status"] == "finished" and info["last_step"] == 4


def test_a_damaged_last_checkpoint_is_passed_over_and_the_resumed_run_reproduces_an_uninterrupted_one(
        tmp_path, cache_dir):
    straight = tmp_path / "straight"
    train(tiny_config(straight, cache_dir, steps=4, save_every=2), **QUIET)

    copied = tmp_path / "copied"
    train(tiny_config(copied, cache_dir, steps=3, save_every=1), **QUIET)
    weights = copied / schema.checkpoint_dir(3) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a sync cut short
    notes: list[str] = []
    train(tiny_config(copied, cache_dir, steps=4, save_every=2, resume=str(copied)), log=notes.append)

    assert any(n.startswith("resume: checkpoint 3 is damaged (model.safetensors holds ") and
               n.endswith("; resuming from checkpoint 2") for n in notes), notes
    assert "resume: deleted the damaged checkpoint 3 (this run writes that step again)" in notes
    assert metric_lines(copied) == metric_lines(straight)
    assert RunFolder(copied).saved_checkpoints() == [0, 1, 2, 4]  # save_every 2 from step 2: 3 not saved again
    assert RunFolder(copied).complete_checkpoints() == [2, 4]  # the two newest keep their training states


def test_nan_loss_stops_with_a_clear_message_and_keeps_the_last_good_checkpoint(tmp_path, cache_dir, monkeypatch):
    import moestab.train.step as step_module

    real = step_module.rl.compute_loss_parts
    calls = {"n": 0}

    def poisoned(name, **kwargs):
        calls["n"] += 1
        parts = real(name, **kwargs)
        return dataclasses.replace(parts, loss=parts.loss * float("nan")) if calls["n"] > 2 else parts

    monkeypatch.setattr(step_module.rl, "compute_loss_parts", poisoned)
    run = tmp_path / "run"
    with pytest.raises(TrainingError, match=r"step 2: policy loss is nan.*last good checkpoint is step 1"):
        train(tiny_config(run, cache_dir, steps=3), **QUIET)
    info = json.loads((run / schema.RUN_JSON).read_text())
    assert info["status"] == "failed" and "nan" in info["error"] and info["last_step"] == 1
    assert RunFolder(run).complete_checkpoints() == [0, 1]


@pytest.mark.slow
def test_ctrl_c_saves_and_exits_cleanly(tmp_path, cache_dir):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "moestab.cli", "train", "--task", TASK, "--steps", "200", "--prompts-per-step", "4",
           "--group-size", "4", "--minibatches", "2", "--eval-size", "8", "--eval-every", "100",
           "--save-every", "100", "--warm-start-max-steps", "0", "--cache-dir", str(cache_dir), "--out", str(run),
           "--no-progress", "--threads", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = run / schema.METRICS_JSONL
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out  # 128 + SIGINT: stopped, not finished
    info = json.loads((run / schema.RUN_JSON).read_text())
    assert info["status"] == "interrupted", out
    last = info["last_step"]
    assert 2 <= last < 200 and RunFolder(run).complete_checkpoints()[-1] == last
    assert f"continue with `moestab train --resume {run}`" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--algo", "ppo"], "algo: unknown 'ppo'; valid: grpo, gspo, gspo-token, dapo, dr-grpo, cispo, gmpo, rspo"),
        (["--routing-replay", "r2"],
         "invalid choice: 'r2' (choose from 'off', 'old', 'rollout', 'rollout-gates', 'base')"),
        (["--steps", "0"], "steps must be an integer >= 1, got 0"),
        (["--group-size", "1"], "group_size must be an integer >= 2"),
        (["--lr", "abc"], "lr: 'abc' is not a valid float"),
        (["--task", "chess"], "chess"),
        (["--record-fraction", "1.5"], "record_fraction must be in (0, 1]"),
        # 32 prompts x 8 samples = 256 sequences: 5 minibatches used to run as 4 while run.json said 5
        (["--minibatches", "5"], "minibatches=5 does not divide the rollout batch of 256 sequences "
                                 "(prompts_per_step*group_size = 32*8); valid: 1, 2, 4, 8, 16, 32, 64, 128, 256"),
        (["--prompts-per-step", "5", "--group-size", "2", "--minibatches", "4"], "valid: 1, 2, 5, 10"),
        # values that used to fail only at step 1, with a traceback, after the folder existed
        (["--clip-low", "1.5"], "clip_low must be a finite number in (0, 1]"),
        (["--kl-coef", "nan"], "kl_coef must be a finite number in [0, 100]"),
        (["--weight-decay", "nan"], "weight_decay must be a finite number in [0, 10]"),
        (["--lr", "inf"], "lr must be a finite number in [1e-09, 1]"),
        (["--temperature", "inf"], "temperature must be a finite number in [0.01, 100]"),
        (["--record-layers", "a"], "record_layers: 'a' is not a comma-separated list of int values"),
        (["--record-layers", "9", "--warm-start-max-steps", "0"], "record_layers [9] are not MoE layers"),
        # 2-digit sums have answers of up to 3 characters: 2 tokens could never hold one (+ EOS)
        (["--max-new-tokens", "2"], "max_new_tokens=2 cannot hold the task's longest answer plus the "
                                    "end-of-sequence token (4 tokens)"),
        (["--resume", "nowhere"], "--resume nowhere: nowhere is not a moestab run folder"),
        (["--resume", "x", "--overwrite"], "resume and overwrite exclude each other"),
    ],
)
def test_bad_configuration_fails_before_anything_starts(tmp_path, capsys, args, message):
    out = tmp_path / "run"
    try:
        code = main(["train", "--out", str(out), *args])
    except SystemExit as exc:  # argparse rejects invalid choices itself
        code = exc.code
    captured = capsys.readouterr()
    assert code == 2
    assert message in captured.err  # errors go to stderr
    assert not out.exists()


def test_yaml_booleans_are_not_numbers(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("steps: true\n")  # used to read as 1
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "run")]) == 2
    assert "steps: True is not a valid int" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_yaml_config_with_unknown_field_is_rejected(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("algo: grpo\nlearning_rate: 0.1\n")
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "run")]) == 2
    assert "unknown config field 'learning_rate'; valid fields: algo, routing_replay" in capsys.readouterr().err


def test_existing_run_needs_resume_and_resume_needs_a_run(tmp_path, cache_dir):
    run = tmp_path / "run"
    with pytest.raises(TrainingError, match="is not a moestab run folder"):
        train(tiny_config(run, cache_dir, resume=str(run)), **QUIET)
    train(tiny_config(run, cache_dir, steps=1), **QUIET)
    with pytest.raises(TrainingError, match=r"already holds a run \(finished, last step 1\); continue it with "
                                            r"`moestab train --resume .*` or start over with --overwrite"):
        train(tiny_config(run, cache_dir, steps=1), **QUIET)
    with pytest.raises(TrainingError, match=r"settings differ from the run.s \(lr: run has 0.0002, asked 1\.0\)"):
        train(tiny_config(run, cache_dir, steps=2, resume=str(run), lr=1.0), **QUIET)
    assert os.path.isdir(run / schema.checkpoint_dir(1))



def test_overwrite_deletes_the_old_run_only_once_every_setting_is_checked(tmp_path, cache_dir):
    run = tmp_path / "run"
    train(tiny_config(run, cache_dir, steps=1), **QUIET)
    before = (run / schema.RUN_JSON).read_bytes()
    # record_layers is checked against the model, i.e. after loading it: the old run must survive
    with pytest.raises(ConfigError, match=r"record_layers \[9\] are not MoE layers"):
        train(tiny_config(run, cache_dir, steps=1, overwrite=True, record_layers=(9,)), **QUIET)
    assert (run / schema.RUN_JSON).read_bytes() == before and (run / schema.checkpoint_dir(1)).is_dir()
    train(tiny_config(run, cache_dir, steps=2, overwrite=True), **QUIET)
    assert json.loads((run / schema.RUN_JSON).read_text())["last_step"] == 2


def test_a_run_whose_every_advantage_is_zero_stops_and_says_what_to_change(tmp_path, cache_dir):
    from tests.support.train import REWARD

    run = tmp_path / "run"
    config = tiny_config(run, cache_dir, steps=5, task=f"arithmetic:reward={REWARD}:always_zero",
                         max_zero_advantage_steps=2)
    with pytest.raises(TrainingError, match=r"steps 1-2: every group's rewards were equal, so every advantage was 0 "
                                            r"and nothing can be learned .* a longer warm start"):
        train(config, **QUIET)
    info = json.loads((run / schema.RUN_JSON).read_text())
    assert info["status"] == "failed" and info["last_step"] == 2 and "--max-zero-advantage-steps 0" in info["error"]
    lines = [json.loads(x) for x in (run / schema.METRICS_JSONL).read_text().splitlines()]
    assert [m["advantage/nonzero_frac"] for m in lines] == [0.0, 0.0]
    # and a reward that varies never trips it
    other = tmp_path / "other"
    train(tiny_config(other, cache_dir, steps=3, max_zero_advantage_steps=1), **QUIET)
    assert json.loads((other / schema.RUN_JSON).read_text())["status"] == "finished"


def test_router_aux_loss_is_added_in_the_updates(tmp_path, cache_dir):
    plain, balanced = tmp_path / "plain", tmp_path / "balanced"
    train(tiny_config(plain, cache_dir, steps=1, minibatches=1), **QUIET)  # one update: both from the same weights
    train(tiny_config(balanced, cache_dir, steps=1, minibatches=1, router_aux_loss_coef=0.5), **QUIET)
    (p,) = [json.loads(x) for x in (plain / schema.METRICS_JSONL).read_text().splitlines()]
    (b,) = [json.loads(x) for x in (balanced / schema.METRICS_JSONL).read_text().splitlines()]
    assert "loss/objective/router_aux_loss" not in p
    aux = b["loss/objective/router_aux_loss"]
    # Switch-style balance loss: E * sum_e f_e P_e, ~top_k when the load is uniform (E=8, k=2: >= 2 here).
    assert aux >= 1.9
    assert b["loss"] == pytest.approx(b["loss/objective/policy_loss"] + 0.5 * aux, rel=1e-6)
    # the same first rollout, another objective: the policy loss terms agree, the totals do not
    assert b["loss/objective/policy_loss"] == pytest.approx(p["loss/objective/policy_loss"], rel=1e-6)
    assert b["loss"] != p["loss"]


@pytest.mark.families("deepseek_v3")
def test_router_aux_loss_is_refused_where_a_family_has_none(tmp_path, cache_dir):
    from transformers import AutoModelForCausalLM

    from moestab.models import build_char_tokenizer, save_policy
    from moestab.models import tiny_config as family_config

    tokenizer = build_char_tokenizer()
    model = AutoModelForCausalLM.from_config(family_config("deepseek_v3", vocab_size=len(tokenizer)))
    save_policy(model, tokenizer, tmp_path / "ds")
    with pytest.raises(ConfigError, match="deepseek_v3 has no load-balancing loss"):
        train(tiny_config(tmp_path / "ds-run", cache_dir, model=str(tmp_path / "ds"), router_aux_loss_coef=0.1),
              **QUIET)
    assert not (tmp_path / "ds-run").exists()
