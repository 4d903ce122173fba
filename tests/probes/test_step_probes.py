"""The step probes (step-volatility, depth) against a real run's logged step and a direct run_step, the lr = 0
control, and bad input refused before anything is written."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from moestab import rl
from moestab.cli import main
from moestab.models import EmbeddedModelSpec, build_embedded_policy, save_policy
from moestab.models.families import tiny_config as family_config
from moestab.models.tokenizer import build_char_tokenizer
from moestab.probes import ProbeError, ProbeSettings, load_suite, read_probe_folder, run_probe
from moestab.probes.checkpoints import resolve_checkpoints
from moestab.probes.runner import select_checkpoints
from moestab.run_folder import schema
from moestab.run_folder.reader import read_run_info
from moestab.tasks import task_from_spec
from moestab.train import train
from moestab.train.optim import build_optimizer
from moestab.train.rollout import HFRolloutEngine
from moestab.train.step import run_step
from moestab.train.step_settings import StepSettings, step_examples, step_seed
from tests.support.train import REWARD, TASK, tiny_config

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"prompts": 4, "group_size": 4}  # a 16-sequence rollout: minibatch counts 1, 2, 4, 8, 16 divide it


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A one-step grpo run (untrained embedded policy; the length-parity reward gives it signal), minibatches 2."""
    root = tmp_path_factory.mktemp("step-probes")
    train(tiny_config(root / "run", root / "cache", steps=1, algo="grpo"), log=lambda s: None)
    return root / "run"


def probe(name: str, paths: list[str | Path], **settings):
    checkpoints = select_checkpoints(name, [resolve_checkpoints([p]) for p in paths])
    return run_probe(name, checkpoints, None, ProbeSettings(**{**SMALL, **settings}))


def test_a_setting_reproduces_the_step_the_run_logged(run):
    # Independent path: the training loop's own step 1 (its metrics.jsonl line), from the run's step-0 checkpoint
    # (a plain model folder here, so the task is given) with the run's settings: lr 2e-4, 2 minibatches.
    config = read_run_info(run).config
    assert (config["lr"], config["minibatches"], config["prompts_per_step"], config["group_size"]) == (2e-4, 2, 4, 4)
    (logged,) = [json.loads(x) for x in (run / schema.METRICS_JSONL).read_text().splitlines()]
    result = probe("step-volatility", [run / schema.checkpoint_dir(0)], task=config["task"], lrs=(2e-4,),
                   minibatch_counts=(2,))
    row = result.tables["step_volatility"].iloc[0]
    assert logged["routing/old_new/changed"] > 0 and logged["advantage/nonzero_frac"] > 0  # not trivially zero
    # Same weights, prompts, seeds and ops in the same order: bit-identical (JSON round-trips a float exactly).
    for column, key in [("old_new_changed", "routing/old_new/changed"),
                        ("old_new_router_flip", "routing/old_new/router_flip"),
                        ("old_new_token_flip", "routing/old_new/token_flip"),
                        ("ratio_token_log_var", "ratio/token_log_var"), ("ratio_seq_log_var", "ratio/seq_log_var"),
                        ("clip_token_frac", "clip/token_frac"), ("reward_mean", "reward/mean"),
                        ("grad_norm", "grad_norm")]:
        assert row[column] == logged[key], column
    by_minibatch = result.tables["step_volatility_by_minibatch"]
    assert by_minibatch.update_old_changed.tolist() == logged["routing/update_old/changed_by_minibatch"]
    assert result.suite["source"].startswith("prompts of moestab train's step 1 with seed 0")


def test_lr_zero_changes_nothing_and_each_update_adds_a_minibatch_entry(run):
    # The run's task names a reward file: stated here, as a user must (a run folder alone does not run code).
    result = probe("step-volatility", [run], task=TASK, lrs=(0.0, 1e-3), minibatch_counts=(1, 2, 4))
    table, by_minibatch = result.tables["step_volatility"], result.tables["step_volatility_by_minibatch"]
    assert result.checkpoints == [f"run@1={run / schema.checkpoint_dir(1)}"]  # a run folder: its last checkpoint
    assert result.suite["name"] == f"task:{task_from_spec(TASK).spec}"  # the run's task, as stated
    assert list(zip(table.lr, table.minibatches, strict=True)) == [(0.0, 1), (0.0, 2), (0.0, 4), (1e-3, 1), (1e-3, 2),
                                                                   (1e-3, 4)]
    # One rollout for every setting: same weights, same seed.
    assert table.reward_mean.nunique() == 1 and table.advantage_nonzero_frac.nunique() == 1
    zero, moved = table[table.lr == 0], table[table.lr > 0]
    assert (zero.grad_norm > 0).all()  # there was a gradient; lr 0 stopped it
    assert (zero[["old_new_changed", "old_new_router_flip", "old_new_token_flip"]] == 0).all().all()
    assert (by_minibatch[by_minibatch.lr == 0].update_old_changed == 0).all()
    assert (moved.old_new_changed > 0).all()
    # One entry per update; the first updates from pi_old's own weights, so it has not drifted.
    counts = by_minibatch.groupby(["lr", "minibatches"]).size()
    assert all(counts[lr, n] == n for lr, n in counts.index)
    assert (by_minibatch[by_minibatch.minibatch == 0].update_old_changed == 0).all()
    assert by_minibatch[(by_minibatch.lr > 0) & (by_minibatch.minibatch > 0)].update_old_changed.gt(0).all()
    # One update: the ratio is 1 everywhere, so no variance and no clipping.
    single = table[table.minibatches == 1]
    assert (single.ratio_token_log_var == 0).all() and (single.clip_token_frac == 0).all()
    assert result.settings["lrs"] == (0.0, 1e-3) and "batch_size" not in result.settings


def test_depth_gives_one_row_per_depth_equal_to_a_direct_step():
    result = probe("depth", [], task=TASK, layers=(1, 2, 3), lr=1e-3)
    table, by_layer = result.tables["depth"], result.tables["depth_by_layer"]
    assert table.depth.tolist() == [1, 2, 3] and table.warm_start_accuracy.isna().all()
    assert by_layer.groupby("depth").layer.apply(list).to_dict() == {1: [0], 2: [0, 1], 3: [0, 1, 2]}
    # Every layer routes every token, so the whole is the mean of the layers.
    per_depth = by_layer.groupby("depth").changed.mean()
    np.testing.assert_allclose(table.set_index("depth").old_new_changed, per_depth, rtol=1e-12)

    # Independent path: run_step on a fresh 2-layer policy, seeded as moestab train's step 1 with seed 0.
    model, tokenizer = build_embedded_policy(EmbeddedModelSpec(num_layers=2, seed=0))
    task = task_from_spec(TASK)
    seed = step_seed(0, 1)
    torch.manual_seed(seed)
    metrics, _ = run_step(
        model=model, optimizer=build_optimizer(model.parameters(), lr=1e-3, weight_decay=0.0),
        engine=HFRolloutEngine(model, tokenizer), task=task,
        settings=StepSettings(preset=rl.get_preset("grpo"), replay="off", minibatches=1, group_size=4,
                              temperature=1.0, max_new_tokens=task.max_answer_chars + 1, max_grad_norm=1.0),
        examples=step_examples(task, 4, 0, 1), generator=torch.Generator().manual_seed(seed),
    )
    row = table.set_index("depth").loc[2]
    assert metrics["routing/old_new/changed"] > 0
    # Same weights, prompts, seeds and ops in the same order: bit-identical.
    for column, key in [("old_new_changed", "routing/old_new/changed"),
                        ("old_new_router_flip", "routing/old_new/router_flip"),
                        ("old_new_token_flip", "routing/old_new/token_flip"), ("reward_mean", "reward/mean"),
                        ("grad_norm", "grad_norm")]:
        assert row[column] == metrics[key], column
    assert by_layer[by_layer.depth == 2].changed.tolist() == metrics["routing/old_new/changed_by_layer"]


def test_depth_warm_start_loads_the_base_training_would_use(tmp_path, monkeypatch):
    calls = []

    def fake_base(config, task, log):  # stands in for the minutes-long warm start; records what was asked
        calls.append((config.model, config.task, config.seed, config.cache_dir))
        model, tokenizer = build_embedded_policy(EmbeddedModelSpec(num_layers=2, seed=config.seed))
        return str(save_policy(model, tokenizer, tmp_path / "base")), {"accuracy": 0.25}

    monkeypatch.setattr("moestab.probes.depth.base_policy_path", fake_base)
    table = probe("depth", [], task=TASK, layers=(2,), lr=1e-3, warm_start=True, cache_dir=str(tmp_path),
                  seed=3).tables["depth"]
    assert calls == [("embedded:layers=2", task_from_spec(TASK).spec, 3, str(tmp_path))]
    assert table.warm_start_accuracy.tolist() == [0.25] and table.old_new_changed.iloc[0] > 0


def test_cli_and_script_write_probe_folders_with_plots(run, tmp_path, capsys, monkeypatch):
    out, plots = tmp_path / "depth", tmp_path / "plots"
    code = main(["probe", "depth", "--task", TASK, "--prompts", "4", "--group-size", "4", "--layers", "1", "2",
                 "--out", str(out), "--plots", str(plots), "--no-progress"])
    assert code == 0
    assert "probe depth on its own policies" in capsys.readouterr().out
    saved = read_probe_folder(out)
    assert saved.probe == "depth" and saved.checkpoints == [] and saved.settings["layers"] == [1, 2]
    assert set(saved.tables) == {"depth", "depth_by_layer"} and saved.tables["depth"].depth.tolist() == [1, 2]
    assert (plots / "depth.png").stat().st_size > 0

    script = str(ROOT / "probes" / "step_volatility.py")
    monkeypatch.setattr(sys, "argv", [script, str(run), "--task", TASK, "--prompts", "4", "--group-size", "4",
                                      "--lrs", "1e-3", "--minibatch-counts", "1", "2",
                                      "--csv", str(tmp_path / "tables.csv"), "--plots", str(plots), "--no-progress"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(script, run_name="__main__")
    assert exit_info.value.code == 0
    stacked = pd.read_csv(tmp_path / "tables.csv")
    table = stacked[stacked.table == "step_volatility"]
    assert table.minibatches.tolist() == [1, 2]
    assert (plots / "step-volatility.png").stat().st_size > 0


def save_abc_model(path: Path) -> str:
    """A MoE folder whose tokenizer knows only 'abc': digits are <unk>."""
    tokenizer = build_char_tokenizer("abc")
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_config(family_config("qwen3_moe", vocab_size=len(tokenizer))).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["depth", "RUN"], "depth takes no checkpoint (it builds its own policies), got 1"),
        (["step-volatility"], "step-volatility takes 1 checkpoint (a run folder means its last checkpoint), got 0"),
        (["compare"], "compare takes 2 checkpoints"),
        (["depth", "--layers", "0", "3", "100"], "layers [0, 100] are not valid; valid: integers 1 to 64"),
        (["depth", "--layers", "2", "2"], "layers [2, 2] repeat a count"),
        (["step-volatility", "RUN", "--minibatch-counts", "3"],
         "minibatch_counts [3] are not valid: each must divide the rollout batch of 16 sequences (prompts x "
         "group_size = 4 x 4); valid: 1, 2, 4, 8, 16"),
        (["step-volatility", "RUN", "--lrs", "-1"], "lrs [-1.0] are not valid; valid: finite numbers >= 0"),
        (["step-volatility", "RUN", "--lrs", "nan"], "lrs [nan] are not valid"),
        (["depth", "--algo", "ppo"], "algo 'ppo' is not valid; valid: grpo, gspo"),
        (["depth", "--task", "addition"], "unknown task 'addition'; valid tasks: arithmetic"),
        (["depth", "--suite", "general"], "depth takes no --suite or --count"),
        (["depth", "--model", "embedded:layers=4"], "sets layers; the probe sets them from --layers"),
        (["depth", "--model", "some/folder"], "depth builds embedded policies; valid: 'embedded'"),
        (["depth", "--group-size", "1"], "group_size must be an integer >= 2, got 1"),
        (["step-volatility", "RUN", "--task", TASK, "--max-new-tokens", "1"],
         "max_new_tokens=1 cannot hold the task's longest"),
        (["depth", "--layers", "1", "--task", f"arithmetic:reward={REWARD}:always_zero"],
         "depth 1: every group's rewards were equal (mean reward 0), so every advantage was 0"),
        (["step-volatility", "ABC", "--task", "arithmetic"], "cannot encode task arithmetic"),
    ],
)
def test_bad_input_is_refused_naming_what_is_valid(run, tmp_path, capsys, args, expected):
    paths = {"RUN": str(run), "ABC": save_abc_model(tmp_path / "abc") if "ABC" in args else ""}
    out = tmp_path / "out"
    small = [x for flag in ("--prompts", "--group-size") if flag not in args for x in (flag, "4")]
    code = main(["probe", *[paths.get(a, a) for a in args], *small, "--out", str(out), "--no-progress"])
    assert code == 2
    assert expected in capsys.readouterr().err
    assert not out.exists()


def test_run_probe_refuses_a_wrong_suite_or_checkpoint_count_before_any_model_is_built():
    with pytest.raises(ProbeError, match="depth takes no suite"):
        run_probe("depth", [], load_suite("general", 2), ProbeSettings())
    with pytest.raises(ProbeError, match="saturation needs a suite"):
        run_probe("saturation", [], None, ProbeSettings())
    with pytest.raises(ProbeError, match=r"step-volatility takes 1 checkpoint\(s\), got 0"):
        run_probe("step-volatility", [], None, ProbeSettings())
