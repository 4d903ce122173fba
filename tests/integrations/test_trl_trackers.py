"""moestab's numbers in the trackers TRL's ``report_to`` names: a recording callback (what every tracker callback is
handed) and TensorBoard's event files read back, on a tiny MoE on CPU."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("trl")

from datasets import Dataset  # TRL's own dependency
from transformers import TrainerCallback

from moestab.integrations.trl import MoestabGRPOTrainer, RecordSettings
from moestab.models import EmbeddedModelSpec, build_embedded_policy
from moestab.recording.trackers import PREFIX, scalars
from moestab.run_folder import schema
from tests.support.trl import LAYERS, PROMPTS, grpo_args, reward


class Tracker(TrainerCallback):
    """A tracker as transformers' own are: each ``on_log`` with the Trainer's global step."""

    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, float]]] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logged.append((state.global_step, dict(logs)))


def test_logging_every_two_generation_batches_sends_their_mean_and_the_matrix_when_asked(tmp_path):
    pytest.importorskip("tensorboard", reason="optional extra moestab[tensorboard]")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model, tokenizer = build_embedded_policy(EmbeddedModelSpec(num_layers=LAYERS, hidden_size=64))
    # 2 moestab steps of 2 optimizer steps; TRL logs every 4 optimizer steps: once, after both steps
    args = grpo_args(tmp_path / "trl", max_steps=4, logging_steps=4, report_to="tensorboard")
    tracker = Tracker()
    trainer = MoestabGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=reward, args=args,
                                 train_dataset=Dataset.from_dict({"prompt": PROMPTS}), callbacks=[tracker],
                                 moestab=RecordSettings(tmp_path / "run", report_expert_load_matrix=True))
    trainer.train()

    lines = [json.loads(x) for x in (tmp_path / "run" / schema.METRICS_JSONL).read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    ours = [(step, {k: v for k, v in logs.items() if k.startswith(PREFIX)}) for step, logs in tracker.logged]
    ((step, values),) = [(step, values) for step, values in ours if values]
    assert step == 4
    first, second = scalars(lines[0], expert_load_matrix=True), scalars(lines[1], expert_load_matrix=True)
    assert set(values) == set(first) | set(second)
    for key, value in values.items():  # the mean over the two steps, as TRL merges its own numbers
        assert value == pytest.approx(np.mean([s[key] for s in (first, second) if key in s]), rel=1e-12), key
    load = np.array(lines[1]["experts/load"])  # [layers, experts]
    assert values[f"{PREFIX}experts/load/1/3"] == pytest.approx((lines[0]["experts/load"][1][3] + load[1, 3]) / 2)
    assert load.shape == (LAYERS, 8) and len([k for k in values if k.count("/") == 4 and "/load/" in k]) == LAYERS * 8
    assert values != first and values != second  # neither step alone

    # TensorBoard, as TRL's report_to wrote it: train/<key> at the Trainer's global step, float32
    (events_dir,) = (tmp_path / "trl" / "runs").iterdir()
    events = EventAccumulator(str(events_dir), size_guidance={"scalars": 0})
    events.Reload()
    tags = {tag.removeprefix("train/") for tag in events.Tags()["scalars"] if tag.startswith(f"train/{PREFIX}")}
    assert tags == set(values)
    for key, value in values.items():
        (event,) = events.Scalars(f"train/{key}")
        assert event.step == 4 and event.value == pytest.approx(value, rel=1e-6, abs=1e-12), key
