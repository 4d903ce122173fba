"""What moestab's records cost inside TRL's GRPOTrainer: recorded vs plain generation cycles, side by side.

One ``MoestabGRPOTrainer`` (``moestab.integrations.trl``) trains with
``RecordSettings(budget=MeasureBudget(every=2))``: its generation cycles alternate between recorded (even cycles:
hooks on every forward, pi_new forward, step metrics, Parquet table) and plain (odd cycles: TRL's step untouched, no
hook installed). A cycle is one generation batch and the
optimizer steps made from it, timed from the end of the previous cycle to the end of its last ``on_step_end``
(the records are written in an ``on_step_end`` that runs before the clock's). Between cycles, off the clock, the
garbage collector runs, so a recorded cycle's garbage is not charged to the plain cycle after it. The first pair
of cycles is warm-up. Ratios are median(recorded) / median(plain), in wall and process CPU time, with the p25-p75
of the per-pair ratios; the "finalising" column is the part of a recorded cycle spent after its last optimizer
step (pi_new forward, step metrics, writing), timed by a callback placed before the records'.

Setup (same as bench/bench_train.py): the embedded tiny Qwen3-MoE (4 layers, 8 experts, top-2, hidden 128) built
in code, a moestab task's prompts and reward, ``prompts x group`` sequences per generation, ``minibatches``
optimizer steps per generation (``steps_per_generation = minibatches``, ``gradient_accumulation_steps=1``, so TRL
computes pi_old in a no-grad forward), ``loss_type="grpo"``, CPU float32, no gradient checkpointing, no logging.

``--routing-share`` records with ``RecordSettings(routing_share=True)`` (one more no-grad forward of each
micro-batch, with pi_old's routes replayed, in the recorded cycles).

Usage: .venv/bin/python bench/bench_trl_callback.py [--pairs 10] [--threads 1] [--task arithmetic] [--level token]
       [--measure-fraction 1.0] [--routing-share]
"""

from __future__ import annotations

import argparse
import gc
import logging
import platform
import random
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
from transformers import PrinterCallback, TrainerCallback

from moestab.models import EmbeddedModelSpec, build_embedded_policy
from moestab.tasks import Example, task_from_spec


def clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


class CycleClock(TrainerCallback):
    """Wall and CPU seconds of each cycle (``minibatches`` optimizer steps), garbage collected off the clock."""

    def __init__(self, minibatches: int) -> None:
        self.minibatches = minibatches
        self.cycles: list[tuple[float, float]] = []
        self.ends: list[float] = []  # perf_counter at each cycle's end
        self._start = (0.0, 0.0)

    def on_train_begin(self, args, state, control, **kwargs):
        self._start = clock()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.minibatches:
            return
        now = clock()
        self.cycles.append((now[0] - self._start[0], now[1] - self._start[1]))
        self.ends.append(now[0])
        gc.collect()
        self._start = clock()


class FinishClock(TrainerCallback):
    """Placed before the records' callback: when each cycle's last optimizer step ended, before it is written."""

    def __init__(self, minibatches: int) -> None:
        self.minibatches = minibatches
        self.marks: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.minibatches == 0:
            self.marks.append(time.perf_counter())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=10, help="timed (recorded, plain) cycle pairs after 1 warm-up pair")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--task", default="arithmetic", help="moestab task spec (prompts and reward)")
    p.add_argument("--level", default="token", choices=("token", "sequence"), help="importance_sampling_level")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--minibatches", type=int, default=4)
    p.add_argument("--measure-fraction", type=float, default=1.0,
                   help="RecordSettings(budget=MeasureBudget(fraction=...)): pi_new's share of pi_old's chunks")
    p.add_argument("--routing-share", action="store_true", help="RecordSettings.routing_share")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)

    from datasets import Dataset
    from trl import GRPOConfig

    from moestab.integrations.trl import MoestabGRPOTrainer, RecordSettings
    from moestab.recording.measure_budget import MeasureBudget

    task = task_from_spec(a.task)
    cycles = 2 * (a.pairs + 1)
    examples = task.sample(a.prompts * cycles, random.Random(0))
    data = Dataset.from_dict({"prompt": [e.prompt for e in examples], "answer": [e.answer for e in examples]})

    def reward(prompts, completions, answer, **_):
        return [task.reward(Example(q, r), c) for q, c, r in zip(prompts, completions, answer, strict=True)]

    model, tokenizer = build_embedded_policy(EmbeddedModelSpec())
    max_new = task.max_answer_chars + 1  # answer + EOS, as moestab train sets it
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
            per_device_train_batch_size=a.prompts * a.group // a.minibatches, gradient_accumulation_steps=1,
            steps_per_generation=a.minibatches, num_iterations=1, num_generations=a.group,
            max_completion_length=max_new, temperature=1.0, top_k=0, top_p=1.0, beta=0.0, loss_type="grpo",
            importance_sampling_level=a.level, epsilon=0.2, epsilon_high=0.27, learning_rate=2e-4,
            lr_scheduler_type="constant", max_steps=a.minibatches * cycles, shuffle_dataset=False,
            logging_strategy="no", save_strategy="no", eval_strategy="no", report_to="none", disable_tqdm=True,
            log_completions=False, seed=0,
        )
        trainer = MoestabGRPOTrainer(model=model, args=args, processing_class=tokenizer, reward_funcs=reward,
                                     train_dataset=data, moestab=RecordSettings(
                                         Path(tmp) / "run", budget=MeasureBudget(fraction=a.measure_fraction, every=2),
                                         routing_share=a.routing_share))
        trainer.remove_callback(PrinterCallback)
        cycle_clock, finish_clock = CycleClock(a.minibatches), FinishClock(a.minibatches)
        trainer.callback_handler.callbacks.insert(0, finish_clock)  # before the records' on_step_end
        trainer.add_callback(cycle_clock)  # after it
        trainer.train()
        steps = (Path(tmp) / "run" / "metrics.jsonl").read_text().count("\n")
    recorded = cycle_clock.cycles[2::2]  # warm-up pair dropped
    plain = cycle_clock.cycles[3::2]
    finishing = [end - mark for end, mark in zip(cycle_clock.ends, finish_clock.marks, strict=True)][2::2]
    print(f"task {a.task}, level {a.level}: {a.prompts} prompts x {a.group} = {a.prompts * a.group} sequences, "
          f"{a.minibatches} optimizer steps per generation, max {max_new} new tokens, {a.threads} torch thread(s), "
          f"measure fraction {a.measure_fraction}, routing_share {a.routing_share}; "
          f"{len(recorded)} recorded / {len(plain)} plain cycles timed, {steps} steps written")
    print(f"torch {torch.__version__}, python {platform.python_version()}, {platform.machine()}")
    for name, k in (("wall", 0), ("cpu", 1)):
        rec, pla = [c[k] for c in recorded], [c[k] for c in plain]
        pairs = sorted(r / q for r, q in zip(rec, pla, strict=True))
        q = statistics.quantiles(pairs, n=4) if len(pairs) > 1 else [pairs[0]] * 3
        print(f"{name}: recorded {statistics.median(rec) * 1e3:.1f} ms, plain {statistics.median(pla) * 1e3:.1f} ms, "
              f"ratio {statistics.median(rec) / statistics.median(pla):.3f}x (per-pair p25-p75 {q[0]:.3f}-{q[2]:.3f})")
    print(f"finalising a recorded cycle (pi_new forward, step metrics, writing): median "
          f"{statistics.median(finishing) * 1e3:.1f} ms wall")


if __name__ == "__main__":
    main()
