"""SRPO's history resampling: prompts whose last group was all correct are skipped, and the set survives --resume."""

from __future__ import annotations

import json

import torch

from moestab.run_folder import schema
from moestab.tasks import Example
from moestab.train import train
from moestab.train.history import SolvedPrompts
from tests.support.train import REWARD, tiny_config


def ex(prompt: str) -> Example:
    return Example(prompt=prompt, answer="")


def test_solved_prompts_hand_worked():
    history = SolvedPrompts()
    # groups of 2: "a" all right, "b" half right, "c" all right
    history.record([ex("a"), ex("b"), ex("c")], torch.tensor([True, True, True, False, True, True]), 2)
    assert history.prompts == {"a", "c"}
    history.record([ex("c")], torch.tensor([True, False]), 2)  # c was not all right this time: forgiven
    assert history.prompts == {"a"}
    pool = [[ex("a"), ex("d")], [ex("e"), ex("f")]]
    kept, counts = history.replace_solved([ex("a"), ex("b"), ex("c")], lambda r: pool[r] if r < 2 else [])
    assert [e.prompt for e in kept] == ["b", "c", "d"]  # "a" skipped, refilled with the first unsolved draw
    assert counts == {"sampling/history_skipped": 1.0, "sampling/history_kept_solved": 0.0}
    dry, counts = history.replace_solved([ex("a"), ex("b")], lambda r: [])
    assert [e.prompt for e in dry] == ["b", "a"] and counts["sampling/history_kept_solved"] == 1.0
    assert SolvedPrompts.from_state(history.state()).prompts == {"a"}


def test_history_resampling_skips_solved_prompts_and_resumes_bit_identically(tmp_path, cache_dir):
    # 1-digit sums: 100 prompts, 4 a step, so prompts come back; prompts starting with 0-4 are always right.
    task = f"arithmetic:digits=1,reward={REWARD}:low_first_digit_is_free"
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    common = {"task": task, "history_resampling": True, "save_every": 1, "max_zero_advantage_steps": 0}
    train(tiny_config(straight, cache_dir, steps=12, **common), log=lambda s: None)
    lines = [json.loads(x) for x in (straight / schema.METRICS_JSONL).read_text().splitlines()]
    assert sum(m["sampling/history_skipped"] for m in lines[4:]) > 0  # solved prompts came back and were skipped
    train(tiny_config(resumed, cache_dir, steps=4, **common), log=lambda s: None)
    train(tiny_config(resumed, cache_dir, steps=12, resume=str(resumed), **common), log=lambda s: None)
    again = [json.loads(x) for x in (resumed / schema.METRICS_JSONL).read_text().splitlines()]

    def strip(ms):
        return [{k: v for k, v in m.items() if not k.startswith("time/")} for m in ms]

    assert strip(again) == strip(lines)  # the solved set was saved with the checkpoint and restored
