"""Benchmark (issue 43.3): the memory of recording one step at Qwen3-30B-A3B shape, and the largest step that fits.

What both trainers do with a measured step (``moestab train`` and the TRL integration call the same
``moestab.recording.step_records.write_step_tokens``): the step's tensors (``StepTensors``: every route set of the step
over the trainer's input positions, prompt included, router margin and confidence, the log-probs) are held on the
CPU, then its per-token table is built (schema 4: stored ids, XORs) and written by ``RunWriter``. Here the tensors
are a synthetic feed at the shape of ``--layers`` MoE layers x top-``--top-k`` of ``--experts`` (default 48 x top-8
of 128): ``--sequences`` sequences of ``--prompt`` prompt and ``--response`` response tokens, five distinct route
sets (a run without replay: rollout, old = old_free, update, new; ``routes_old`` its own tensor) drawn by
``moestab.analysis.synthetic.route_chain`` at the R3-level change rate. Each size runs in a fresh process, which
prints its resident memory after the imports, once the step's tensors exist ("held"), and its peak while the table
is built and written (VmHWM, reset once the tensors exist: the synthetic feed's own making is left out).

``--trl-parts P`` measures instead what the TRL integration adds before that: it records each forward of a policy in
micro-batch parts and puts a policy's parts together in generation order
(``moestab.integrations.trl.cycle.gather_routes``: concatenated, then reordered). The child holds pi_old's parts as
TRL's recorder gives them (ids, router margin, entropy and confidence over every input position, ``P`` parts, shuffled
rows), resets the peak and gathers them; it prints the parts held and the peak above them, per response token.

The largest step that fits in ``--budget-gib`` (default 24 GiB, this project's machine) follows from a least-squares
line of peak memory over response tokens; the last size given is best chosen near it, to check the line.

    .venv/bin/python bench/bench_recording_memory.py [--sequences 32 64 128 256] [--response 4096]
    .venv/bin/python bench/bench_recording_memory.py --trl-parts 8 [--sequences 32 64 128]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _rss() -> int:
    """Resident bytes of this process now (Linux /proc)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def _reset_peak() -> bool:
    """Start the peak (VmHWM) afresh from the memory resident now (Linux >= 4.0: ``clear_refs`` 5); False where
    the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak() -> int:
    """The peak resident bytes since the last :func:`_reset_peak` (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def step_tensors(sequences: int, prompt: int, response: int, layers: int, top_k: int, experts: int):
    """A synthetic ``StepTensors`` of ``sequences`` sequences, every position a response position after the prompt."""
    import torch

    from moestab.analysis.synthetic import route_chain
    from moestab.recording.batch import RolloutBatch
    from moestab.recording.step_tensors import StepTensors
    from moestab.routing import Routes
    from moestab.tasks import Example

    B, T, L = sequences, response, prompt + response - 1  # L: the trainer's input positions
    layer_ids = tuple(range(layers))
    sets = route_chain(B * L, layers, top_k, experts, length=4, flip=0.1, reorder=0.05)  # 4 x [B * L, layers, k]
    rollout, old, update, new = (torch.from_numpy(s.reshape(B, L, layers, top_k)) for s in sets)
    del sets
    gen = torch.Generator().manual_seed(0)

    def floats(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=gen)

    batch = RolloutBatch(
        input_ids=torch.zeros(B, L, dtype=torch.long), attention_mask=torch.ones(B, L),
        targets=torch.zeros(B, T, dtype=torch.long), response_mask=torch.ones(B, T, dtype=torch.bool),
        logp_rollout=-floats(B, T), routes=Routes(indices=rollout, layers=layer_ids, num_experts=experts),
        prompt_len=prompt, completions=["x"] * B)
    return StepTensors(
        batch=batch, examples=[Example("q", "a")] * (B // 2 or 1), rewards=floats(B), correct=None,
        advantages=floats(B) - 0.5, minibatch=torch.arange(B) % 4, logp_old=-floats(B, T), logp_old_free=-floats(B, T),
        logp_update=-floats(B, T), logp_new=-floats(B, T), clipped=floats(B, T) < 0.1, routes_old=old.clone(),
        routes_old_free=Routes(indices=old, layers=layer_ids, num_experts=experts, margin=floats(B, L, layers),
                               confidence=floats(B, L, layers)),
        routes_update=update, routes_new=Routes(indices=new, layers=layer_ids, num_experts=experts))


def trl_parts(sequences: int, parts: int, prompt: int, response: int, layers: int, top_k: int, experts: int):
    """pi_old's routes as TRL's recorder leaves them: ``parts`` micro-batch parts of ``[b, L + 1, layers, k]`` ids (TRL
    feeds the last completion token too) with margin, entropy and confidence, and each part's generation rows."""
    import torch

    from moestab.analysis.synthetic import route_chain
    from moestab.routing import Routes

    L = prompt + response  # input positions TRL's forward records
    ids = torch.from_numpy(route_chain(sequences * L, layers, top_k, experts, length=1)[0]).view(sequences, L, layers,
                                                                                               top_k)
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(sequences, generator=gen)  # each part's rows, as TRL shuffles the generation batch
    rows = list(order.chunk(parts))
    out = []
    for r in rows:
        stats = [torch.rand(len(r), L, layers, generator=gen) for _ in range(3)]  # [b, L, layers] each
        out.append(Routes(indices=ids[r].clone(), layers=tuple(range(layers)), num_experts=experts, margin=stats[0],
                          entropy=stats[1], confidence=stats[2]))
    return out, rows


def trl_child(args: argparse.Namespace, sequences: int) -> None:
    """Hold pi_old's recorded parts and gather them as the TRL integration does; print the memory as JSON."""
    from moestab.integrations.trl.cycle import gather_routes

    imported = _rss()
    parts, rows = trl_parts(sequences, args.trl_parts, args.prompt, args.response, args.layers, args.top_k,
                            args.experts)
    held = _rss()
    if not _reset_peak():
        raise SystemExit("this kernel does not let a process reset its peak memory (/proc/self/clear_refs)")
    start = time.perf_counter()
    gathered = gather_routes(parts, rows, sequences, args.prompt + args.response - 1)
    took = time.perf_counter() - start
    result = sum(t.numel() * t.element_size() for t in (gathered.indices, gathered.margin, gathered.entropy,
                                                        gathered.confidence))
    print(json.dumps({"tokens": sequences * args.response, "imported": imported, "held": held, "peak": _peak(),
                      "result": result, "gather_s": took}))


def child(args: argparse.Namespace, sequences: int, folder: str) -> None:
    """Hold one synthetic step and write its token table; print the memory as JSON."""
    from moestab.recording.step_records import write_step_tokens
    from moestab.run_folder import RunFolder, schema
    from moestab.run_folder.writer import RunWriter

    imported = _rss()
    t = step_tensors(sequences, args.prompt, args.response, args.layers, args.top_k, args.experts)
    held = _rss()
    if not _reset_peak():  # the peak would include the synthetic feed's own making
        raise SystemExit("this kernel does not let a process reset its peak memory (/proc/self/clear_refs)")
    run = Path(folder) / f"run_{sequences}"
    RunFolder(run).tokens_dir.mkdir(parents=True)
    start = time.perf_counter()
    write_step_tokens(RunWriter(run), 1, t, record_fraction=1.0, seed=0, layer_slots=list(range(args.layers)))
    wrote = time.perf_counter() - start
    peak = _peak()
    size = (run / schema.tokens_file(1)).stat().st_size
    print(json.dumps({"tokens": sequences * args.response, "imported": imported, "held": held, "peak": peak,
                      "write_s": wrote, "file": size}))


def _child_cmd(args: argparse.Namespace, sequences: int, folder: str) -> list[str]:
    return [sys.executable, __file__, "--child", str(sequences), "--folder", folder,
            *("--prompt", str(args.prompt), "--response", str(args.response), "--layers", str(args.layers)),
            *("--top-k", str(args.top_k), "--experts", str(args.experts)),
            *(("--trl-parts", str(args.trl_parts)) if args.trl_parts else ())]


def trl_main(args: argparse.Namespace) -> None:
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; pi_old's routes of "
          f"{args.sequences} sequences x ({args.prompt} prompt + {args.response} response) tokens in {args.trl_parts} "
          f"parts, {args.layers} layers x top-{args.top_k} of {args.experts} experts")
    print("| response tokens | parts held | peak while gathering | above the parts | gathered result | "
          "parts per token | above the parts per token | gather (s) |")
    print("|---|---|---|---|---|---|---|---|")
    gib = 2**30
    for sequences in args.sequences:
        r = json.loads(subprocess.run(_child_cmd(args, sequences, "-"), check=True, capture_output=True,
                                      text=True).stdout.splitlines()[-1])
        parts, above = r["held"] - r["imported"], r["peak"] - r["held"]
        print(f"| {r['tokens']:,} | {parts / gib:.2f} GiB | {r['peak'] / gib:.2f} GiB | {above / gib:.2f} GiB | "
              f"{r['result'] / gib:.2f} GiB | {parts / r['tokens']:,.0f} B | {above / r['tokens']:,.0f} B | "
              f"{r['gather_s']:.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--response", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--budget-gib", type=float, default=24.0)
    parser.add_argument("--tmp", default=None, help="folder for the temporary run folders")
    parser.add_argument("--trl-parts", type=int, default=None,
                        help="measure the TRL integration's gathering of pi_old's routes from this many parts instead")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.trl_parts:
            trl_child(args, args.child)
        else:
            child(args, args.child, args.folder)
        return
    if args.trl_parts:
        trl_main(args)
        return
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; steps of "
          f"{args.sequences} sequences x ({args.prompt} prompt + {args.response} response) tokens, {args.layers} "
          f"layers x top-{args.top_k} of {args.experts} experts")
    print("| response tokens | after imports | step held | peak while writing | held per token | peak per token | "
          "table on disk | write (s) |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        for sequences in args.sequences:
            r = json.loads(subprocess.run(_child_cmd(args, sequences, tmp), check=True, capture_output=True,
                                          text=True).stdout.splitlines()[-1])
            rows.append(r)
            gib = 2**30
            print(f"| {r['tokens']:,} | {r['imported'] / gib:.2f} GiB | {r['held'] / gib:.2f} GiB | "
                  f"{r['peak'] / gib:.2f} GiB | {(r['held'] - r['imported']) / r['tokens']:,.0f} B | "
                  f"{(r['peak'] - r['imported']) / r['tokens']:,.0f} B | {r['file'] / gib:.2f} GiB | "
                  f"{r['write_s']:.1f} |", flush=True)
    tokens = np.array([r["tokens"] for r in rows], float)
    peak = np.array([r["peak"] for r in rows], float)
    if len(rows) >= 2:
        slope, intercept = np.polyfit(tokens, peak, 1)
        largest = (args.budget_gib * 2**30 - intercept) / slope
        print(f"peak = {intercept / 2**30:.2f} GiB + {slope:,.0f} B x response tokens (least squares over "
              f"{len(rows)} sizes); the largest step within {args.budget_gib:g} GiB: {largest:,.0f} response tokens "
              f"({largest / args.response:,.0f} sequences of {args.response})")


if __name__ == "__main__":
    main()
