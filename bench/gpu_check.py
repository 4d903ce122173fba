"""One prepared GPU check (issue 38): the recorder, replay and training on CUDA, at real model sizes, in one run.

Started by bench/gpu_check.sh, which installs nothing into the machine's Python (moestab comes from this tree on
PYTHONPATH, missing wheels from .whl/) and keeps the whole output in OUT/gpu_check.log. This script writes every
number to OUT/gpu_check.csv, one number a row: section, model, case, mode, quantity, value, unit, note. Sections, in
this order (each timed; one that fails is logged with its traceback and an ``error`` row, and the rest still run):

- ``env``: versions, the device and its memory.
- ``sync``: no host synchronisation inside the hooks. RoutingRecorder (every field; sampled rows; under
  ``generate()``) and RoutingReplay (R3, TRR, score threshold; with grad, under a recorder) run under
  ``moestab.routing.host_sync.find_host_syncs``: on CUDA the hooks run with ``torch.cuda.set_sync_debug_mode("error")``
  and every call that would synchronise is named with its line.
- ``overhead``: hook overhead, interleaved rounds (order rotated), timers synchronised with the device: a plain
  forward against the same forward inside RoutingRecorder (the trainer's: routes only; and with router statistics)
  and RoutingReplay (experts; experts and gates, TRR), each context built per call with the routers' check skipped
  (as ``moestab train`` runs them), no grad and forward + backward; ``generate()`` with a KV cache plain, recorded,
  recorded with gates. Ratio of medians and p25-p75 of the per-round ratios (bench/bench_routing.py's helpers), at
  (a) docs/benchmarks.md's qwen3_moe h512, 8 layers, 32 experts, top-4 (float32) and (b) the Qwen3-30B-A3B decoder
  shape (hidden 2048, 128 experts, top-8, expert FFN 768, 32 / 4 heads of 128) with a few layers in bf16, batch x
  2,048 tokens. Target: recorder and replay <= 1.03x (reported, not asserted).
- ``gap``: the rollout->trainer gap on GPU kernels (moestab.experiments.gaps.policy_gaps, the numbers
  scripts/replay_gaps.py prints): a bf16 rollout engine samples, a float32 and a bf16 trainer score the same
  tokens freely and with R3 / TRR; routers flipped, tokens with a flipped layer, k1 / k3 / F(2). At the
  Qwen3-30B-A3B shape with random weights (moestab's character tokenizer) and at the embedded model after its warm
  start (the default job's base).
- ``train``: ``moestab train`` (the default job, bf16 rollouts) for a few steps with replay off and with R3, on the
  device and on the CPU: step time (median over the steps after the first), rollout and update time, and the
  rollout->trainer routing gap the trainer logged.
- ``fullsize``: the largest Qwen3-MoE model of the Qwen3-30B-A3B shape that fits in bf16 (48 layers when ~70 GB are
  free), random weights: one ``generate()`` and one forward recorded, the recorded forward's peak memory against a
  plain one's (the recorder's extra), and the bytes of the routes it keeps.

``--tiny`` runs every section at toy sizes: ``--device cpu --tiny`` takes a few minutes on a CPU and is run by
tests/test_gpu_check.py, so the script cannot rot. Exit status: 0 when every section ran and no hook synchronised.

Usage: python bench/gpu_check.py --out OUT [--device cuda|cpu] [--tiny] [--sections env,sync,...] [--work DIR]
"""

from __future__ import annotations

import argparse
import csv
import gc
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path

import torch
import transformers
from bench_routing import interleave, paired_ratio
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen3MoeConfig
from transformers.utils import logging as hf_logging

import moestab
from moestab.experiments.gaps import policy_gaps, replay_gaps
from moestab.models import tiny_config
from moestab.models.tokenizer import build_char_tokenizer
from moestab.routing import Routes, RoutingRecorder, RoutingReplay
from moestab.routing.host_sync import describe, find_host_syncs
from moestab.run_folder.reader import load_metrics
from moestab.tasks import task_from_spec

COLUMNS = ("section", "model", "case", "mode", "quantity", "value", "unit", "note")
TARGET = 1.03
"""Issue 38's target for the recorder's and replay's overhead on CUDA (reported, not asserted)."""
SECTIONS = ("env", "sync", "overhead", "gap", "train", "fullsize")
TRAIN_KEYS = ("routing/rollout_old/router_flip", "routing/rollout_old_free/router_flip", "mismatch/rollout_old/k3",
              "mismatch/rollout_old_free/k3")
"""The rollout->trainer gap the trainer logs (docs/metrics.md): as used in the ratio, and the free pi_old's."""


# ---- sizes ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """A Qwen3-MoE decoder's shape (every layer an MoE layer)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    top_k: int
    ffn: int
    """Each expert's FFN width."""
    layers: int
    vocab: int

    def config(self, layers: int | None = None, vocab: int | None = None) -> Qwen3MoeConfig:
        return Qwen3MoeConfig(
            vocab_size=vocab or self.vocab, hidden_size=self.hidden, intermediate_size=3 * self.hidden,
            moe_intermediate_size=self.ffn, num_hidden_layers=layers or self.layers, num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads, head_dim=self.head_dim, num_experts=self.experts,
            num_experts_per_tok=self.top_k, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
            tie_word_embeddings=False, max_position_embeddings=40960, rms_norm_eps=1e-6, pad_token_id=0,
            bos_token_id=1, eos_token_id=2,
        )

    def label(self, layers: int) -> str:
        return f"qwen3_moe h{self.hidden}, {layers}L, {self.experts}E, top-{self.top_k}, ffn {self.ffn}"

    def scaled_vocab(self, layers: int) -> int:
        """A vocabulary whose head is the same share of ``layers`` layers' work as the full vocabulary's is of all
        ``self.layers`` (a multiple of 64): with a few layers the full head would dilute the hooks' overhead."""
        return max(64, round(self.vocab * layers / self.layers / 64) * 64)


QWEN3_30B_A3B = Shape(hidden=2048, heads=32, kv_heads=4, head_dim=128, experts=128, top_k=8, ffn=768, layers=48,
                      vocab=151936)
TOY_QWEN3 = Shape(hidden=64, heads=4, kv_heads=2, head_dim=16, experts=16, top_k=4, ffn=32, layers=4, vocab=512)


@dataclass(frozen=True)
class Plan:
    """What each section runs: the GPU check's sizes, or ``--tiny``'s toy sizes that run the same code on a CPU."""

    rounds: int
    """Timed rounds per overhead case (after 2 warm-up rounds)."""
    docs_model: dict
    """``tiny_config`` arguments of model (a)."""
    docs_batch: tuple[int, int]
    """(a)'s forward: sequences x tokens."""
    docs_generate: tuple[int, int, int]
    """(a)'s generate(): prompts x prompt tokens + new tokens."""
    qwen: Shape
    qwen_layers: int
    """Layers of the Qwen3-30B-A3B shape in the overhead and sync sections (b)."""
    qwen_batch: tuple[int, int]
    qwen_generate: tuple[int, int, int]
    gap_layers: int
    """Layers of the Qwen3-30B-A3B shape in the gap section."""
    gap_prompts: int
    gap_new_tokens: int
    """New tokens per completion of the random-weight model (the embedded model's are the task's)."""
    train_steps: int
    warm_start: dict = field(default_factory=dict)
    """TrainConfig fields of the warm start (and the eval it stops on) shared by ``gap`` and ``train``."""
    train_flags: tuple[str, ...] = ()
    """``moestab train`` flags beyond the default job's."""
    fullsize_layers: int | None = None
    """None: as many of the shape's layers as fit."""
    fullsize_tokens: int = 2048
    fullsize_generate: tuple[int, int] = (128, 16)
    """generate()'s prompt tokens + new tokens (one prompt)."""


GPU = Plan(rounds=20, docs_model={"vocab_size": 1024, "hidden_size": 512, "num_moe_layers": 8, "num_experts": 32,
                                  "top_k": 4},
           docs_batch=(16, 256), docs_generate=(16, 64, 32), qwen=QWEN3_30B_A3B, qwen_layers=4,
           qwen_batch=(4, 2048), qwen_generate=(4, 2048, 32), gap_layers=8, gap_prompts=256, gap_new_tokens=64,
           train_steps=10)
TINY = Plan(rounds=3, docs_model={"vocab_size": 128, "hidden_size": 64, "num_moe_layers": 2, "num_experts": 8,
                                  "top_k": 2},
            docs_batch=(4, 16), docs_generate=(4, 8, 3), qwen=TOY_QWEN3, qwen_layers=2, qwen_batch=(2, 32),
            qwen_generate=(2, 16, 3), gap_layers=2, gap_prompts=16, gap_new_tokens=4, train_steps=2,
            warm_start={"warm_start_max_steps": 2, "eval_size": 8},
            train_flags=("--prompts-per-step", "4", "--group-size", "2", "--minibatches", "2", "--eval-every", "100"),
            fullsize_layers=2, fullsize_tokens=32, fullsize_generate=(8, 3))


# ---- output ----------------------------------------------------------------------------------------------------
@dataclass
class Report:
    """The one CSV, one number a row, appended row by row (a run cut short keeps what it measured); the log is the
    standard output."""

    path: Path
    failures: list[str] = field(default_factory=list)
    """Sections that raised and cases whose hooks synchronised: the exit status is 1 when there are any."""

    def __post_init__(self) -> None:
        with self.path.open("w", newline="") as f:
            csv.writer(f).writerow(COLUMNS)

    def row(self, section: str, model: str, case: str, mode: str, quantity: str, value: float | str,
            unit: str = "", note: str = "") -> None:
        with self.path.open("a", newline="") as f:
            csv.writer(f).writerow((section, model, case, mode, quantity, value, unit, note))

    @staticmethod
    def say(text: str = "") -> None:
        print(text, flush=True)


@dataclass(frozen=True)
class Check:
    """Everything a section needs."""

    report: Report
    plan: Plan
    device: torch.device
    work: Path
    """Scratch folder (run folders, the warm-start cache): outside OUT, which holds only the log and the CSV."""

    def sync(self) -> None:
        """Wait for the device, so that a timer read after it counts the device's work."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


# ---- models -----------------------------------------------------------------------------------------------------
def build(config: transformers.PretrainedConfig, device: torch.device, dtype: torch.dtype,
          seed: int = 0) -> PreTrainedModel:
    """A randomly initialised model built directly on ``device`` in ``dtype`` (a 30B model never passes the CPU)."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def subjects(check: Check) -> list[tuple[str, Callable[[], PreTrainedModel], tuple[int, int], tuple[int, int, int]]]:
    """(label, model builder, forward batch, generate batch) of models (a) and (b) of the sync and overhead sections;
    built one at a time by the caller, each freed before the next."""
    plan, docs = check.plan, check.plan.docs_model
    vocab = plan.qwen.scaled_vocab(plan.qwen_layers)
    return [
        (f"(a) qwen3_moe h{docs['hidden_size']}, {docs['num_moe_layers']}L, {docs['num_experts']}E, "
         f"top-{docs['top_k']}, float32", partial(build, tiny_config("qwen3_moe", **docs), check.device, torch.float32),
         plan.docs_batch, plan.docs_generate),
        (f"(b) {plan.qwen.label(plan.qwen_layers)}, vocab {vocab}, bfloat16",
         partial(build, plan.qwen.config(plan.qwen_layers, vocab=vocab), check.device, torch.bfloat16),
         plan.qwen_batch, plan.qwen_generate),
    ]


def free(check: Check) -> None:
    gc.collect()
    if check.device.type == "cuda":
        torch.cuda.empty_cache()


def left_padded(batch: int, seq: int, vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids ``[batch, seq]`` and a mask with left padding on half the rows (as bench_routing.py)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (batch, seq), generator=g)  # [batch, seq]
    mask = torch.ones_like(ids)  # [batch, seq]
    mask[: batch // 2, : seq // 4] = 0
    return ids.masked_fill(mask == 0, 0).to(device), mask.to(device)


def record_routes(model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor) -> Routes:
    """The model's own routes (with gate weights) of ``ids``: what the replay modes replay."""
    with torch.no_grad(), RoutingRecorder(model, margin=False, entropy=False, gates=True) as rec:
        model(input_ids=ids, attention_mask=mask, use_cache=False)
    return rec.routes


def greedy(model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """``generate()`` with a KV cache, exactly ``new_tokens`` tokens per sequence (no EOS stop)."""
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0, use_cache=True)


# ---- sections ---------------------------------------------------------------------------------------------------
def env(check: Check) -> None:
    facts = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
             "moestab": moestab.__version__, "commit": os.environ.get("MOESTAB_COMMIT", "unknown"),
             "torch threads": str(torch.get_num_threads()), "device": str(check.device),
             "float32 matmul precision": torch.get_float32_matmul_precision()}
    if check.device.type == "cuda":
        props = torch.cuda.get_device_properties(check.device)
        free_bytes, total = torch.cuda.mem_get_info(check.device)
        facts.update({"gpu": props.name, "cuda": str(torch.version.cuda), "gpu memory GiB": f"{total / 2**30:.1f}",
                      "gpu memory free GiB": f"{free_bytes / 2**30:.1f}"})
    for name, value in facts.items():
        check.report.say(f"{name}: {value}")
        check.report.row("env", "", "", "", name, value)


@dataclass(frozen=True)
class Inputs:
    """One model's inputs in the sync and overhead sections, and the routes the replay modes replay."""

    ids: torch.Tensor  # [batch, seq]
    mask: torch.Tensor  # [batch, seq] left-padded
    gen_ids: torch.Tensor  # [prompts, prompt tokens]
    gen_mask: torch.Tensor  # [prompts, prompt tokens]
    new_tokens: int
    routes: Routes


def each_model(check: Check, run: Callable[[Check, str, PreTrainedModel, Inputs], None]) -> None:
    """``run`` on (a), then on (b), each model freed before the next is built."""
    for label, make, (batch, seq), (prompts, prompt_len, new) in subjects(check):
        model = make()
        ids, mask = left_padded(batch, seq, model.config.vocab_size, check.device)
        gen_ids, gen_mask = left_padded(prompts, prompt_len, model.config.vocab_size, check.device)
        run(check, label, model, Inputs(ids, mask, gen_ids, gen_mask, new, record_routes(model, ids, mask)))
        del model
        free(check)


def sync(check: Check) -> None:
    """Every hook case under find_host_syncs, at (a) and (b); a case whose hooks synchronised is a failure."""
    each_model(check, sync_model)


def sync_model(check: Check, label: str, model: PreTrainedModel, inputs: Inputs) -> None:
    for case, (contexts, run) in sync_cases(model, inputs).items():
        with ExitStack() as stack:
            for context in contexts:
                stack.enter_context(context())
            found = find_host_syncs(model, run)
        verdict = "ok" if not found else "FAIL"
        check.report.say(f"{label} | {case}: {verdict}, {len(found)} host syncs in the hooks: {describe(found)}")
        check.report.row("sync", label, case, "", "host syncs in hooks", len(found), "", describe(found))
        if found:
            check.report.failures.append(f"sync: {label}: {case}")


def sync_cases(model: PreTrainedModel, inputs: Inputs) -> dict[str, tuple[list, Callable[[], object]]]:
    """Case -> (contexts to enter, what to run inside them)."""

    def forward(grad: bool) -> Callable[[], None]:
        def run() -> None:
            with torch.set_grad_enabled(grad):
                out = model(input_ids=inputs.ids, attention_mask=inputs.mask, use_cache=False)
            if grad:
                out.logits.float().mean().backward()
                model.zero_grad(set_to_none=True)
        return run

    record = partial(RoutingRecorder, model, verify=False)
    replay = partial(RoutingReplay, model, inputs.routes, verify=False)
    sample = partial(greedy, model, inputs.gen_ids, inputs.gen_mask, inputs.new_tokens)
    return {
        "recorder, every field, forward": ([partial(record, gates=True, slot_scores=True, router_logprobs=True)],
                                           forward(False)),
        "recorder, sampled rows (sequence_fraction 0.5), forward": ([partial(record, sequence_fraction=0.5)],
                                                                     forward(False)),
        "recorder, generate()": ([partial(record, margin=False, entropy=False)], sample),
        "recorder with gates, generate()": ([partial(record, margin=False, entropy=False, gates=True)], sample),
        "replay (R3) under a recorder, forward + backward": ([replay, partial(record, margin=False, entropy=False)],
                                                             forward(True)),
        "replay with gates (TRR), forward + backward": ([partial(replay, force_gates=True)], forward(True)),
        "replay, score threshold 0.5, forward + backward": ([partial(replay, score_ratio=0.5)], forward(True)),
    }


def overhead(check: Check) -> None:
    each_model(check, overhead_model)


def overhead_model(check: Check, label: str, model: PreTrainedModel, inputs: Inputs) -> None:
    recorder = partial(RoutingRecorder, model, margin=False, entropy=False, verify=False)
    replay = partial(RoutingReplay, model, inputs.routes, verify=False)
    forward_modes = {
        "plain": nullcontext,
        "recorder (routes only, the trainer's)": recorder,
        "recorder, router statistics": partial(RoutingRecorder, model, verify=False),
        "replay (R3)": replay,
        "replay with gates (TRR)": partial(replay, force_gates=True),
    }
    call = partial(model, input_ids=inputs.ids, attention_mask=inputs.mask, use_cache=False)
    tokens = "{} x {} tokens".format(*inputs.ids.shape)
    timed(check, label, f"no-grad forward, {tokens}", forward_modes, partial(no_grad_call, call))
    model.train()
    timed(check, label, f"forward + backward, {tokens}", forward_modes, partial(backward_call, model, call))
    model.eval()
    generate_modes = {"plain": nullcontext, "recorder (routes only, the rollout engine's)": recorder,
                      "recorder with gates (TRR's rollout engine)": partial(recorder, gates=True)}
    prompts = "{} x {} prompt".format(*inputs.gen_ids.shape)
    timed(check, label, f"generate(), {prompts} + {inputs.new_tokens} new tokens", generate_modes,
          partial(greedy, model, inputs.gen_ids, inputs.gen_mask, inputs.new_tokens))


def no_grad_call(call: Callable[[], object]) -> None:
    with torch.no_grad():
        call()


def backward_call(model: PreTrainedModel, call: Callable[[], object]) -> None:
    model.zero_grad(set_to_none=True)
    call().logits.float().mean().backward()


def timed(check: Check, label: str, case: str, modes: dict[str, Callable[[], AbstractContextManager]],
          body: Callable[[], object]) -> None:
    """Interleaved rounds of ``body`` inside each mode's context (built per call, routes read after it), the device
    synchronised after each call; one ratio row set per mode."""

    def run(context: Callable[[], AbstractContextManager]) -> None:
        ctx = context()
        with ctx:
            body()
        if isinstance(ctx, RoutingRecorder):
            ctx.routes  # noqa: B018 -- reading (stitching) the routes is part of recording
        check.sync()

    wall, _ = interleave({name: partial(run, context) for name, context in modes.items()}, check.plan.rounds)
    plain_ms = statistics.median(wall["plain"]) * 1e3
    check.report.row("overhead", label, case, "plain", "time", plain_ms, "ms", f"{check.plan.rounds} rounds")
    for mode in list(modes)[1:]:
        ratio, q1, q3 = paired_ratio(wall[mode], wall["plain"])
        mode_ms = statistics.median(wall[mode]) * 1e3
        within = "within" if ratio <= TARGET else "ABOVE"
        check.report.say(f"{label} | {case} | {mode}: {mode_ms:.2f} ms vs plain {plain_ms:.2f} ms = {ratio:.3f}x "
                         f"(per-round p25-p75 {q1:.3f}-{q3:.3f}; {within} the {TARGET}x target)")
        for quantity, value, unit in (("time", mode_ms, "ms"), ("ratio", ratio, "x"), ("ratio p25", q1, "x"),
                                      ("ratio p75", q3, "x")):
            check.report.row("overhead", label, case, mode, quantity, value, unit)


def gap(check: Check) -> None:
    """policy_gaps at the Qwen3-30B-A3B shape (random weights) and replay_gaps at the warm-started embedded model."""
    plan = check.plan
    tokenizer = build_char_tokenizer()
    model = build(plan.qwen.config(plan.gap_layers, vocab=len(tokenizer)), check.device, torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    texts = [ex.prompt for ex in task_from_spec("arithmetic").sample(plan.gap_prompts, random.Random(0))]
    label = f"{plan.qwen.label(plan.gap_layers)}, random weights, character vocab"
    gaps = policy_gaps(model, tokenizer, texts, max_new_tokens=plan.gap_new_tokens, seed=0,
                       trainer_dtypes=(torch.float32, torch.bfloat16))
    gap_rows(check, label, gaps)
    del model
    free(check)
    gaps = replay_gaps(0, "arithmetic", plan.gap_prompts, str(check.work / "cache"), device=str(check.device),
                       trainer_dtypes=(torch.float32, torch.bfloat16), **plan.warm_start)
    gap_rows(check, "embedded (4L, 8E, top-2, h128), warm-started base of the default job", gaps)


def gap_rows(check: Check, label: str, gaps: dict[str, float]) -> None:
    """``"bfloat16 trainer, free routing: k3"`` -> trainer bfloat16, side free routing, quantity k3."""
    for key, value in gaps.items():
        trainer, _, rest = key.rpartition(" trainer, ")
        side, _, quantity = rest.rpartition(": ")
        trainer = trainer or ("" if key == "response tokens" else "float32")
        check.report.say(f"{label} | {trainer or '-'} trainer | {side or '-'} | {quantity}: {value:.4g}")
        check.report.row("gap", label, f"rollout bfloat16 vs trainer {trainer}" if trainer else "", side, quantity,
                         value, "%" if quantity.endswith("%") else "")


def train(check: Check) -> None:
    """The default job (bf16 rollouts) with replay off and R3 on the device, then the same commands on the CPU."""
    devices = [check.device.type] + (["cpu"] if check.device.type != "cpu" else [])
    medians: dict[tuple[str, str], float] = {}
    for device in devices:
        for replay in ("off", "rollout"):
            medians[device, replay] = train_run(check, device, replay)
    for replay in ("off", "rollout"):
        if len(devices) > 1:
            ratio = medians[devices[0], replay] / medians["cpu", replay]
            check.report.say(f"moestab train --routing-replay {replay}: {devices[0]} step / cpu step = {ratio:.3f}")
            check.report.row("train", "embedded", f"--routing-replay {replay}", f"{devices[0]} / cpu",
                             "step time ratio", ratio, "x")


def train_run(check: Check, device: str, replay: str) -> float:
    """One ``moestab train`` run; its rows; the median step time after the first step."""
    out = check.work / f"train-{device}-{replay}"
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in check.plan.warm_start.items()]
    command = [sys.executable, "-m", "moestab", "train", "--device", device, "--routing-replay", replay,
               "--rollout-dtype", "bfloat16", "--steps", str(check.plan.train_steps), "--no-progress", "--overwrite",
               "--out", str(out), "--cache-dir", str(check.work / "cache"), *flags, *check.plan.train_flags]
    check.report.say("$ " + " ".join(command))
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    check.report.say((done.stdout + done.stderr).rstrip())
    if done.returncode:
        raise RuntimeError(f"moestab train exited with {done.returncode} on {device}, replay {replay}")
    metrics = load_metrics(out)
    steps = metrics["time/step_s"].to_numpy()
    later = steps[1:] if len(steps) > 1 else steps
    case = f"--routing-replay {replay}, --rollout-dtype bfloat16, {len(steps)} steps"
    values = {"command wall time": (wall, "s"), "first step time": (steps[0], "s"),
              "step time, median after the first": (statistics.median(later), "s"),
              "rollout time, median": (float(metrics["time/rollout_s"].median()), "s"),
              "update time, median": (float(metrics["time/update_s"].median()), "s")}
    values.update({key: (float(metrics[key].mean()), "") for key in TRAIN_KEYS if key in metrics})
    for quantity, (value, unit) in values.items():
        check.report.say(f"train {device} | {case} | {quantity}: {value:.4g} {unit}")
        check.report.row("train", "embedded", case, device, quantity, value, unit)
    return statistics.median(later)


def fullsize(check: Check) -> None:
    """The largest model of the Qwen3-30B-A3B shape that fits: generate(), a recorded forward, peak memory."""
    plan = check.plan
    layers = plan.fullsize_layers or layers_that_fit(plan.qwen, check.device)
    label = f"{plan.qwen.label(layers)}, bfloat16, random weights"
    start = time.perf_counter()
    model = build(plan.qwen.config(layers), check.device, torch.bfloat16)
    check.sync()
    values = {"layers": (layers, ""), "parameters": (sum(p.numel() for p in model.parameters()) / 1e9, "B"),
              "build time": (time.perf_counter() - start, "s"), "weights": (allocated(check) / 2**30, "GiB")}
    ids = torch.randint(3, plan.qwen.vocab, (1, plan.fullsize_tokens), generator=torch.Generator().manual_seed(0))
    ids = ids.to(check.device)  # [1, tokens]
    prompt, new = plan.fullsize_generate
    mask = torch.ones_like(ids[:, :prompt])  # [1, prompt]
    with RoutingRecorder(model, margin=False, entropy=False, verify=False) as rec:
        start = time.perf_counter()
        greedy(model, ids[:, :prompt], mask, new)
        check.sync()
    values["generate() time, recorded"] = (time.perf_counter() - start, "s")
    values["generate() routes recorded"] = (rec.routes.seq_len, "positions")
    plain = peak(check, lambda: no_grad_call(partial(model, input_ids=ids, use_cache=False)))
    recorder = RoutingRecorder(model)  # the library's default: router statistics, routers checked
    recorded = peak(check, lambda: recorded_forward(recorder, model, ids))
    values.update({"forward peak memory, plain": (plain / 2**30, "GiB"),
                   "forward peak memory, recorded": (recorded / 2**30, "GiB"),
                   "recorder's extra peak memory": ((recorded - plain) / 2**20, "MiB"),
                   "routes kept": (routes_bytes(recorder.routes) / 2**20, "MiB")})
    for quantity, (value, unit) in values.items():
        check.report.say(f"{label} | {plan.fullsize_tokens} tokens | {quantity}: {value:.4g} {unit}")
        check.report.row("fullsize", label, f"1 x {plan.fullsize_tokens} tokens; generate {prompt} + {new}", "",
                         quantity, value, unit)


def layers_that_fit(shape: Shape, device: torch.device, headroom: int = 8 * 2**30) -> int:
    """As many of ``shape``'s layers as fit in bf16 in the device's free memory, less ``headroom`` for the
    activations of one forward (the logits of 2,048 tokens alone are 0.6 GiB)."""
    outside, per_layer = parameter_counts(shape)
    free_bytes, _ = torch.cuda.mem_get_info(device)
    return max(1, min(shape.layers, (free_bytes - headroom - 2 * outside) // (2 * per_layer)))


def parameter_counts(shape: Shape) -> tuple[int, int]:
    """(parameters outside the decoder layers, parameters per decoder layer), counted on the meta device."""
    counts = []
    for layers in (1, 2):
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(shape.config(layers))
        counts.append(sum(p.numel() for p in model.parameters()))
    per_layer = counts[1] - counts[0]
    return counts[0] - per_layer, per_layer


def allocated(check: Check) -> float:
    return torch.cuda.memory_allocated(check.device) if check.device.type == "cuda" else math.nan


def peak(check: Check, run: Callable[[], object]) -> float:
    """Bytes the device's allocator held at most during ``run()`` above what it held before (NaN on a CPU)."""
    if check.device.type != "cuda":
        run()
        return math.nan
    check.sync()
    torch.cuda.reset_peak_memory_stats(check.device)
    before = torch.cuda.memory_allocated(check.device)
    run()
    check.sync()
    return torch.cuda.max_memory_allocated(check.device) - before


def recorded_forward(recorder: RoutingRecorder, model: PreTrainedModel, ids: torch.Tensor) -> None:
    with torch.no_grad(), recorder:
        model(input_ids=ids, use_cache=False)
    recorder.routes  # noqa: B018 -- the routes' stitching is part of the recorder's memory


def routes_bytes(routes: Routes) -> int:
    tensors = [getattr(routes, f.name) for f in fields(routes)]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


# ---- driver -----------------------------------------------------------------------------------------------------
RUNNERS: dict[str, Callable[[Check], None]] = {"env": env, "sync": sync, "overhead": overhead, "gap": gap,
                                               "train": train, "fullsize": fullsize}


@contextmanager
def section(check: Check, name: str) -> Iterator[None]:
    """Time a section; log an exception with its traceback and an ``error`` row instead of stopping the run."""
    check.report.say(f"\n== {name} ==")
    start = time.perf_counter()
    try:
        yield
    except Exception as exc:  # one broken section must not cost the others' numbers on a 15-minute loan
        check.report.say(traceback.format_exc())
        check.report.row(name, "", "", "", "error", math.nan, "", f"{type(exc).__name__}: {exc}")
        check.report.failures.append(f"{name}: {type(exc).__name__}: {exc}")
    wall = time.perf_counter() - start
    check.report.say(f"== {name}: {wall:.1f} s ==")
    check.report.row(name, "", "", "", "section wall time", wall, "s")
    free(check)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="folder of gpu_check.csv (the shell adds the log)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="toy sizes: the same code paths in minutes on a CPU")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    args = parser.parse_args(argv)
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(wanted) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; valid: {', '.join(SECTIONS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here (use --device cpu --tiny for the CPU smoke run)")
    args.out.mkdir(parents=True, exist_ok=True)
    hf_logging.disable_progress_bar()  # the log is for numbers, not for saving bars
    report = Report(args.out / "gpu_check.csv")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="moestab-gpu-check-") as scratch:
        check = Check(report, TINY if args.tiny else GPU, torch.device(args.device), args.work or Path(scratch))
        check.work.mkdir(parents=True, exist_ok=True)
        for name in wanted:
            with section(check, name):
                RUNNERS[name](check)
    total = time.perf_counter() - start
    report.row("total", "", "", "", "wall time", total, "s")
    report.say(f"\ngpu check: {total:.1f} s; {len(report.failures)} failure(s)"
               + "".join(f"\n  - {f}" for f in report.failures))
    return 1 if report.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
