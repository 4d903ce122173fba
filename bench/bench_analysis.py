"""Benchmark: router decisions per second of the routing-volatility analysis (moestab.analysis).

A decision is one (token, layer). Default table: one step of a Qwen3-30B-A3B-sized model
(48 MoE layers, top-8 of 128 experts) over 1M tokens = 48M decisions per route column.

Measured:
1. in memory, ``intersection_sizes`` (the kernel) and ``volatility_counts`` (kernel + aggregation
   by step x minibatch x position bin x layer), on the pairs of ``CASES``: R3-level change (10% of
   decisions with the k-th expert swapped out), GSPO-level change (10% of activated experts differ:
   80% of decisions swap their k-th expert) and a worst case (every decision swapped and reordered);
2. streaming: ``run_volatility`` over a run folder whose step table (the R3-level pair) is a
   Parquet file in a temp dir, in a fresh process, with its peak RSS (``resource.getrusage``).

Target (docs/benchmarks.md): >= 50M decisions/s. Run:
    .venv/bin/python bench/bench_analysis.py [--tokens 1000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# (name, share of decisions with the k-th expert swapped out, share of the others reordered,
#  whether flipped decisions are reordered too)
CASES = (
    ("R3-level", 0.1, 0.05, False),  # ~10% of routers differ (R3, rollout vs trainer); changed = 1.25%
    ("GSPO-level", 0.8, 0.05, False),  # changed = 10% of activated experts (GSPO §5.3)
    ("worst case", 1.0, 0.0, True),  # every decision changed and reordered: all take the k*k compares
)


def _best(fn, rounds: int) -> tuple[float, float]:
    """Best wall and CPU seconds of ``rounds`` calls of ``fn``."""
    wall, cpu = [], []
    for _ in range(rounds):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return min(wall), min(cpu)


def _keys(tokens: int) -> dict[str, np.ndarray]:
    from moestab.analysis.bins import DEFAULT_POSITION_EDGES, bin_left_edges

    rng = np.random.default_rng(1)
    lengths = rng.integers(200, 4000, tokens // 200 + 2)
    position = np.concatenate([np.arange(n) for n in lengths])[:tokens]
    seq = np.repeat(np.arange(lengths.size), lengths)[:tokens]
    return {
        "step": np.ones(tokens, np.int32),
        "minibatch": (seq * 4 // (seq.max() + 1)).astype(np.int16),
        "position_bin": bin_left_edges(position, DEFAULT_POSITION_EDGES),
    }


def bench_memory(args: argparse.Namespace) -> list[dict]:
    from moestab.analysis.synthetic import synthetic_routes
    from moestab.analysis.volatility import intersection_sizes, volatility_counts, volatility_table

    results = []
    decisions = args.tokens * args.layers
    keys = _keys(args.tokens)
    for case, flip, reorder, reorder_flipped in CASES:
        t = time.perf_counter()
        a, b = synthetic_routes(
            args.tokens,
            args.layers,
            args.top_k,
            args.experts,
            flip=flip,
            reorder=reorder,
            reorder_flipped=reorder_flipped,
        )
        made = time.perf_counter() - t
        for threads in args.threads:
            wall, cpu = _best(lambda a=a, b=b, th=threads: intersection_sizes(a, b, threads=th), args.rounds)
            results.append(dict(case=case, what="intersection_sizes", threads=threads, wall=wall, cpu=cpu))
            wall, cpu = _best(lambda a=a, b=b, th=threads: volatility_counts(a, b, keys, threads=th), args.rounds)
            results.append(dict(case=case, what="volatility_counts", threads=threads, wall=wall, cpu=cpu))
        changed = volatility_table(volatility_counts(a, b)).iloc[0]["changed"]
        print(f"[{case}] generated in {made:.1f}s; changed = {changed:.4f}", file=sys.stderr)
        for r in results[-2 * len(args.threads) :]:
            r["decisions_per_s"] = decisions / r["wall"]
            r["cpu_decisions_per_s"] = decisions / r["cpu"]
        del a, b
    return results


def write_run_folder(root: Path, args: argparse.Namespace) -> Path:
    """A minimal run folder (run.json + one step table) holding the synthetic pair as routes_old_free/new."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from moestab.analysis.synthetic import synthetic_routes
    from moestab.records import schema
    from moestab.records.run_info import ModelInfo, RunInfo

    run = root / "bench_run"
    (run / schema.TOKENS_DIR).mkdir(parents=True)
    info = RunInfo(
        config={"algo": "gspo", "routing_replay": "off", "model": "synthetic", "steps": 1},
        model=ModelInfo(family="synthetic", moe_layers=tuple(range(args.layers)), num_experts=args.experts,
                        top_k=args.top_k, recorded_layers=tuple(range(args.layers))),
        status=schema.STATUS_FINISHED, last_step=1,
    )
    (run / schema.RUN_JSON).write_text(json.dumps(info.to_json()))
    keys = _keys(args.tokens)
    a, b = synthetic_routes(args.tokens, args.layers, args.top_k, args.experts, flip=0.1, reorder=0.05)
    width = args.layers * args.top_k
    arrays = {
        schema.COL_STEP: pa.array(keys["step"]),
        schema.COL_MINIBATCH: pa.array(keys["minibatch"]),
        schema.COL_POSITION: pa.array(np.arange(args.tokens, dtype=np.int32) % 4000),
        schema.COL_ROUTES_OLD_FREE: pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1)), width),
        schema.COL_ROUTES_NEW: pa.FixedSizeListArray.from_arrays(pa.array(b.reshape(-1)), width),
    }
    pq.write_table(pa.table(arrays), run / schema.tokens_file(1), row_group_size=args.row_group)
    return run


def _vm_hwm() -> float | None:
    """Peak RSS of this process image from /proc (bytes), as a cross-check of getrusage."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def stream_child(run: str, batch_rows: int | None, threads: int | None) -> None:
    """Run in a fresh process: stream the run folder once; print timings and peak RSS as JSON.

    getrusage's ru_maxrss survives fork/exec (Linux), so the parent stays small until every child
    has run: the Parquet file is written by another child.
    """
    from moestab.analysis.volatility import run_volatility, volatility_table

    t, c = time.perf_counter(), time.process_time()
    counts = run_volatility(run, "old_new", batch_rows=batch_rows, threads=threads)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    table = volatility_table(counts).iloc[0]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    print(
        json.dumps({"wall": wall, "cpu": cpu, "peak_rss": peak, "vm_hwm": _vm_hwm(), "routers": int(table["routers"])})
    )


def _shape_args(args: argparse.Namespace) -> list[str]:
    return [
        *("--tokens", str(args.tokens), "--layers", str(args.layers), "--top-k", str(args.top_k)),
        *("--experts", str(args.experts), "--row-group", str(args.row_group)),
    ]


def bench_stream(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        t = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--write-run", tmp, *_shape_args(args)], check=True)
        run = Path(tmp) / "bench_run"
        size = (run / "tokens" / "step_000001.parquet").stat().st_size
        print(f"[stream] wrote {size / 2**20:.0f} MiB Parquet in {time.perf_counter() - t:.1f}s", file=sys.stderr)
        best = None
        for _ in range(args.rounds):
            cmd = [sys.executable, __file__, "--child", str(run)]
            if args.batch_rows:
                cmd += ["--batch-rows", str(args.batch_rows)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            if best is None or result["wall"] < best["wall"]:
                best = result
        best["file_mib"] = size / 2**20
        best["decisions_per_s"] = best["routers"] / best["wall"]
        best["cpu_decisions_per_s"] = best["routers"] / best["cpu"]
        best["route_bytes_in_memory_mib"] = 2 * args.tokens * args.layers * args.top_k * 2 / 2**20
        return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3, help="best of N")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch-rows", type=int, default=None, help="rows per streamed batch (default: auto)")
    parser.add_argument("--row-group", type=int, default=65_536, help="Parquet row-group size of the bench file")
    parser.add_argument("--tmp", default=None, help="folder for the temporary Parquet file")
    parser.add_argument("--skip-stream", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--write-run", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        stream_child(args.child, args.batch_rows, None)
        return
    if args.write_run:
        write_run_folder(Path(args.write_run), args)
        return

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"numpy {np.__version__}, load average at start {os.getloadavg()[0]:.2f}"
    )
    print(f"table: {args.tokens:,} tokens x {args.layers} layers x top-{args.top_k} of {args.experts} experts")
    # Streaming first, while this process is small (children inherit its ru_maxrss).
    if not args.skip_stream:
        s = bench_stream(args)
        batch = args.batch_rows or "auto"
        print(
            f"  streaming  Parquet {s['file_mib']:.0f} MiB, batch rows {batch}, row groups {args.row_group}: "
            f"{s['wall']:.2f} s  {s['decisions_per_s'] / 1e6:.1f} M decisions/s "
            f"(per CPU-second {s['cpu_decisions_per_s'] / 1e6:.1f} M); peak RSS {s['peak_rss'] / 2**20:.0f} MiB "
            f"(VmHWM {s['vm_hwm'] / 2**20:.0f} MiB; the two route columns in memory: "
            f"{s['route_bytes_in_memory_mib']:.0f} MiB)"
        )
    for r in bench_memory(args):
        print(
            f"  in memory  {r['case']:<11} {r['what']:<18} threads={r['threads']}: "
            f"{r['wall']:.3f} s  {r['decisions_per_s'] / 1e6:6.1f} M decisions/s "
            f"(per CPU-second {r['cpu_decisions_per_s'] / 1e6:.1f} M)"
        )
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
