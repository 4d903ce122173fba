"""What a run keeps of its checkpoints (moestab.train.checkpoint.superseded_checkpoints): every save_every step's
and the last step's weights, the two newest training states, and a refresh-only checkpoint of --base-refresh-every
only while a kept state resumes its route copy from it."""

from __future__ import annotations

import importlib.util
import itertools
import json
import shutil
from pathlib import Path

import pytest

from moestab.run_folder import RunFolder, schema
from moestab.train import loop, train
from moestab.train.checkpoint import KEEP_STATES, superseded_checkpoints
from tests.support.train import tiny_config


def _simulate(steps: int, save_every: int, refresh_every: int) -> tuple[set[int], set[int], list[str]]:
    """A run's saves one by one (the loop's rule: step 0, save_every steps, the last, and each refresh), pruning
    after each as the trainer does; returns the weights and states left and every broken promise seen on the way:
    a resume from any kept state must find its copy's weights, and the newest checkpoint must keep its state."""
    weights: set[int] = set()
    states: set[int] = set()
    broken = []
    for step in range(steps + 1):
        if not (step % save_every == 0 or step == steps or (refresh_every and step % refresh_every == 0)):
            continue
        weights.add(step)
        states.add(step)
        whole, dropped = superseded_checkpoints(sorted(weights), sorted(states), save_every=save_every,
                                                steps=steps, refresh_every=refresh_every)
        weights -= set(whole)
        states -= set(whole) | set(dropped)
        if step not in states:
            broken.append(f"step {step}: the newest checkpoint lost its state")
        for resumable in states:
            source = refresh_every * (resumable // refresh_every) if refresh_every else 0
            if source not in weights:
                broken.append(f"step {step}: a resume from {resumable} needs step {source}'s weights, gone")
    return weights, states, broken


@pytest.mark.parametrize(("steps", "save_every", "refresh_every"),
                         list(itertools.product((1, 5, 7, 20, 23), (1, 2, 5, 10), (0, 1, 2, 3, 10, 33))))
def test_every_kept_state_resumes_and_nothing_regular_is_lost(steps, save_every, refresh_every):
    weights, states, broken = _simulate(steps, save_every, refresh_every)
    assert broken == []
    regular = {s for s in range(steps + 1) if s % save_every == 0 or s == steps}
    assert regular <= weights  # the analyses' checkpoints all stay
    assert len(weights - regular) <= KEEP_STATES  # at most the refreshes the kept states resume from
    saved = sorted(regular | ({s for s in range(steps + 1) if s % refresh_every == 0} if refresh_every else set()))
    assert sorted(states) == saved[-KEEP_STATES:]


def test_a_copy_refreshed_every_step_ends_with_its_regular_checkpoints():
    """Issue 52's K = 1 arm: 100 steps, save_every 20. Unpruned it kept 101 checkpoints and 101 states."""
    weights, states, _ = _simulate(100, 20, 1)
    assert sorted(weights) == [0, 20, 40, 60, 80, 99, 100]  # 99: the state kept beside 100 resumes from it
    assert sorted(states) == [99, 100]


def test_a_run_keeps_every_checkpoints_weights_and_its_two_newest_states(tmp_path):
    run = tmp_path / "run"
    train(tiny_config(run, tmp_path / "cache", steps=4, save_every=1, eval_every=10))
    assert sorted(p.name for p in (run / schema.CHECKPOINTS_DIR).iterdir()) == [
        f"step_00000{s}" for s in range(5)]
    assert sorted(p.name for p in (run / schema.STATE_DIR).iterdir()) == ["step_000003.pt", "step_000004.pt"]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[2] / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_prune_script_leaves_an_older_run_as_pruning_training_would(tmp_path, monkeypatch, capsys):
    """A run written before pruning (every checkpoint whole) is pruned to what a run writes now; the two then are the
    same run by scripts/same_run.py. A run whose lock is held, or whose run.json is not a run's, loses nothing."""
    settings = {"routing_replay": "base", "base_refresh_every": 1, "save_every": 2, "eval_every": 10, "steps": 3}
    pruned, older = tmp_path / "runs" / "pruned", tmp_path / "runs" / "older"
    train(tiny_config(pruned, tmp_path / "cache", **settings))
    with monkeypatch.context() as m:
        m.setattr(loop, "prune_checkpoints", lambda *a, **k: ([], []))
        train(tiny_config(older, tmp_path / "cache", **settings))
    assert len(list((older / schema.STATE_DIR).iterdir())) == 4
    hostile = tmp_path / "runs" / "hostile"
    shutil.copytree(older, hostile)
    info = json.loads((hostile / schema.RUN_JSON).read_text())
    info["config"]["save_every"] = "2"
    (hostile / schema.RUN_JSON).write_text(json.dumps(info))
    prune = _script("prune_runs")
    with RunFolder(older).lock(note=print):  # being written: skipped
        assert prune.main([str(older)]) == 0
    assert "skipped" in capsys.readouterr().out and len(list((older / schema.STATE_DIR).iterdir())) == 4
    linked = tmp_path / "runs" / "linked"  # its state/ a link to another run's: deleting through it is refused
    shutil.copytree(older, linked, ignore=shutil.ignore_patterns(schema.STATE_DIR))
    (linked / schema.STATE_DIR).symlink_to(hostile / schema.STATE_DIR)
    assert prune.main([str(older)]) == 0  # states only by default: the refresh-only checkpoints stay
    assert len(list((older / schema.STATE_DIR).iterdir())) == 2
    assert len(list((older / schema.CHECKPOINTS_DIR).iterdir())) == 4
    assert prune.main([str(tmp_path / "runs"), "--refresh-checkpoints"]) == 0
    out = capsys.readouterr().out
    assert "hostile" in out and "'save_every': '2'" in out and "skipped" in out and "linked" in out
    assert len(list((hostile / schema.STATE_DIR).iterdir())) == 4  # nothing deleted there, nor through the link
    for sub in (schema.CHECKPOINTS_DIR, schema.STATE_DIR):
        assert sorted(p.name for p in (older / sub).iterdir()) == sorted(p.name for p in (pruned / sub).iterdir())
    differences, compared = _script("same_run").compare(older, pruned)
    assert differences == [], differences
    assert " 0 checkpoint files" not in compared
    (older / schema.state_file(0)).write_bytes((older / schema.state_file(3)).read_bytes())  # 0 kept weights only
    differences, _ = _script("same_run").compare(older, pruned)
    assert differences == [f"checkpoint 0: a training state in {older} only"]


def test_a_probe_of_a_checkpoint_without_its_state_is_refused_naming_the_valid_ones(tmp_path, capsys):
    """scripts/volatility_sources.py restores a checkpoint's optimizer state: one kept as weights only is refused
    before any work (step 0 needs none: AdamW before its first step)."""
    run = tmp_path / "run"
    train(tiny_config(run, tmp_path / "cache", steps=3, save_every=1, eval_every=10))
    assert _script("volatility_sources").main([str(run), "--checkpoints", "0", "1"]) == 2
    err = capsys.readouterr().err
    assert "checkpoint 1 of" in err and "no training state" in err and "valid: 0 and [2, 3]" in err
    assert _script("volatility_sources").main([str(run), "--checkpoints", "7"]) == 2
    assert "has no weights" in capsys.readouterr().err
