"""Benchmark: router decisions per second of the routing-volatility analysis (moestab.analysis).

A decision is one (token, layer). Default table: one step of a Qwen3-30B-A3B-sized model
(48 MoE layers, top-8 of 128 experts) over 1M tokens = 48M decisions per route column.

Measured:
1. in memory, ``intersection_sizes`` (the kernel) and ``volatility_counts`` (kernel + aggregation
   by step x minibatch x position bin x layer), on the pairs of ``CASES``: R3-level change (10% of
   decisions with the k-th expert swapped out), GSPO-level change (10% of activated experts differ:
   80% of decisions swap their k-th expert) and a worst case (every decision swapped and reordered);
2. streaming: ``run_volatility`` over a run folder whose step table (the R3-level or the GSPO-level pair,
   ``STREAM_CASES``, drawn by ``moestab.analysis.synthetic.route_chain``) is a Parquet file in a temp dir, in a fresh
   process, with its peak RSS
   (``resource.getrusage``); one run folder per route-column layout (``--versions``: schema version 2's
   ``FixedSizeList<int16>``, version 3's ``FixedSizeBinary``, version 4's XOR with a reference), all written by
   ``RunWriter``, their rounds interleaved so that all see the same machine, with each layout's bytes per router
   decision of a route column (on disk, from the Parquet footer; in Arrow memory);
3. with ``--sizes`` (slow, ~6 GiB of memory at the default shape): a whole step table, every column of the run
   format, at the R3-level and GSPO-level change rates of ``CASES`` (``SIZE_RELATIONS``: which route columns equal
   which), in each layout (``--versions``, default 3 and 4), with the time to encode its route columns and write it,
   and its size on disk and in memory, column by column; per pair and layout one line
   ``all route columns: <N> B per token x layer``.

Target (docs/benchmarks.md): >= 50M decisions/s. Run:
    .venv/bin/python bench/bench_analysis.py [--tokens 1000000] [--rounds 3]
    .venv/bin/python bench/bench_analysis.py --sizes   # the step-table sizes only
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

LAYOUTS = {2: "FixedSizeList<int16>", 3: "FixedSizeBinary", 4: "FixedSizeBinary, XOR with a reference, zstd"}
"""Route-column layout of each run-format version (moestab.run_folder.route_columns)."""
STREAM_MODES = ("run_volatility", "run_volatility, no read-ahead", "decode only")
STREAM_CASES = ("R3-level", "GSPO-level")
"""Change rates of ``CASES`` whose route pair a streamed run folder holds."""
"""What a streaming child does: the whole analysis (its reader thread one batch ahead, as by default, or none), or
only the reading and decoding of what it reads."""

# (name, share of decisions with the k-th expert swapped out, share of the others reordered,
#  whether flipped decisions are reordered too)
CASES = (
    ("R3-level", 0.1, 0.05, False),  # ~10% of routers differ (R3, rollout vs trainer); changed = 1.25%
    ("GSPO-level", 0.8, 0.05, False),  # changed = 10% of activated experts (GSPO §5.3)
    ("worst case", 1.0, 0.0, True),  # every decision changed and reordered: all take the k*k compares
)

SIZE_RELATIONS = {
    "R3 run": {"routes_rollout": 0, "routes_old": 0, "routes_old_free": 1, "routes_update": 0, "routes_new": 2},
    "no replay": {"routes_rollout": 0, "routes_old": 1, "routes_old_free": 1, "routes_update": 2, "routes_new": 3},
}
"""Which route set of a chain (``moestab.analysis.synthetic.route_chain``: each set changed from the one before at a
case's rate) each route column of a ``--sizes`` table holds. R3 run: pi_old and the updates replay the rollout's
routes (old = update = rollout), pi_old's free routes differ from them, pi_new's from pi_old's; no replay: pi_old's
routes are its free ones (old = old_free), which differ from the rollout's, the updates' from them, pi_new's from the
updates'. The first is the one ``all route columns`` is printed for."""


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


def _bench_info(args: argparse.Namespace, version: int):
    from moestab.run_folder import schema
    from moestab.run_folder.run_info import ModelInfo, RunInfo

    return RunInfo(
        config={"algo": "gspo", "routing_replay": "off", "model": "synthetic", "steps": 1},
        model=ModelInfo(family="synthetic", moe_layers=tuple(range(args.layers)), num_experts=args.experts,
                        top_k=args.top_k, recorded_layers=tuple(range(args.layers))),
        status=schema.STATUS_FINISHED, last_step=1, schema_version=version,
    )


def write_run_folder(root: Path, args: argparse.Namespace, version: int) -> Path:
    """A minimal run folder of schema ``version`` (run.json + one step table, written by ``RunWriter``) holding the
    synthetic pair as routes_old_free/new; prints the route columns' Arrow bytes as JSON."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from moestab.analysis.synthetic import route_chain
    from moestab.run_folder import RunFolder, schema
    from moestab.run_folder.route_columns import (
        encode_route_columns,
        route_layout_for,
        token_parquet_options,
        with_route_layout,
    )
    from moestab.run_folder.writer import RunWriter

    run = root / f"bench_run_v{version}"
    folder = RunFolder(run)
    folder.tokens_dir.mkdir(parents=True)
    folder.run_json.write_text(json.dumps(_bench_info(args, version).to_json()))
    keys = _keys(args.tokens)
    # Routes as incompressible as a router's (route_chain), which version 4's zstd has to decode
    flip, reorder = next((f, r) for name, f, r, _ in CASES if name == args.case)
    a, b = route_chain(args.tokens, args.layers, args.top_k, args.experts, length=2, flip=flip, reorder=reorder)
    layout = route_layout_for(args.experts, args.layers, args.top_k, schema_version=version)
    routes, layout = encode_route_columns({schema.COL_ROUTES_OLD_FREE: a, schema.COL_ROUTES_NEW: b}, layout)
    arrays = {
        schema.COL_STEP: pa.array(keys["step"]),
        schema.COL_MINIBATCH: pa.array(keys["minibatch"]),
        schema.COL_POSITION: pa.array(np.arange(args.tokens, dtype=np.int32) % 4000),
        **routes,
    }
    table = with_route_layout(pa.table(arrays), layout)
    if args.full_codec is None or version != 4:
        RunWriter(run).write_tokens(1, table, row_group_size=args.row_group)
    else:  # what RunWriter writes, the column stored in full compressed otherwise
        options = token_parquet_options(table.schema, full=(args.full_codec, None if args.full_codec == "none" else 1))
        pq.write_table(table, run / schema.tokens_file(1), row_group_size=args.row_group, **options)
    print(json.dumps({"route_arrow_bytes": [table.column(c).nbytes for c in (schema.COL_ROUTES_OLD_FREE,
                                                                               schema.COL_ROUTES_NEW)]}))
    return run


def _column_disk_bytes(path: Path) -> dict[str, int]:
    """Compressed bytes of each top-level column of a Parquet file, summed over its row groups (footer only)."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    out: dict[str, int] = {}
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            name = chunk.path_in_schema.split(".")[0]
            out[name] = out.get(name, 0) + chunk.total_compressed_size
    return out


def _vm_hwm() -> float | None:
    """Peak RSS of this process image from /proc (bytes), as a cross-check of getrusage."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _decode(run: str, batch_rows: int | None) -> int:
    """Stream what ``run_volatility`` reads (its two route columns decoded, its key columns) and nothing else;
    returns the decisions decoded per route column."""
    from moestab.run_folder import schema
    from moestab.run_folder.reader import iter_run_routes, read_run_info

    columns = [schema.COL_ROUTES_OLD_FREE, schema.COL_ROUTES_NEW]
    others = [schema.COL_STEP, schema.COL_MINIBATCH, schema.COL_POSITION]
    decisions = 0
    for _, _, routes in iter_run_routes(run, columns, read_run_info(run).top_k, others, batch_rows=batch_rows):
        decisions += routes[columns[0]].shape[0] * routes[columns[0]].shape[1]
    return decisions


def stream_child(run: str, batch_rows: int | None, threads: int | None, decode_only: bool = False,
                 read_ahead: int = 1) -> None:
    """Run in a fresh process: stream the run folder once (``run_volatility``, or only the decoding it does);
    print timings and peak RSS as JSON.

    getrusage's ru_maxrss survives fork/exec (Linux), so the parent stays small until every child
    has run: the Parquet file is written by another child.
    """
    from moestab.analysis.volatility import run_volatility, volatility_table

    imported = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # what the imports alone hold
    t, c = time.perf_counter(), time.process_time()
    if decode_only:
        routers = _decode(run, batch_rows)
    else:
        counts = run_volatility(run, "old_new", batch_rows=batch_rows, threads=threads, read_ahead=read_ahead)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    if not decode_only:
        routers = int(volatility_table(counts).iloc[0]["routers"])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    print(json.dumps({"wall": wall, "cpu": cpu, "peak_rss": peak, "vm_hwm": _vm_hwm(), "imported_rss": imported,
                      "routers": routers}))


def _shape_args(args: argparse.Namespace) -> list[str]:
    return [
        *("--tokens", str(args.tokens), "--layers", str(args.layers), "--top-k", str(args.top_k)),
        *("--experts", str(args.experts), "--row-group", str(args.row_group)),
    ]


def bench_stream(args: argparse.Namespace) -> dict[tuple[str, int, str], dict]:
    """Best-of-``rounds`` streaming of one run folder per change rate of ``STREAM_CASES`` and layout of
    ``args.versions``, by ``run_volatility`` and by its decoding alone (:data:`STREAM_MODES`), rounds interleaved."""
    from moestab.run_folder import schema

    decisions = args.tokens * args.layers
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        runs, written_by = {}, {}
        for case in STREAM_CASES:
            for version in args.versions:
                t = time.perf_counter()
                root = Path(tmp) / case
                cmd = [sys.executable, __file__, "--write-run", str(root), "--version", str(version), "--case", case,
                       *_shape_args(args)]
                cmd += ["--full-codec", args.full_codec] if args.full_codec else []
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                written = json.loads(out.splitlines()[-1])
                runs[case, version] = root / f"bench_run_v{version}"
                path = runs[case, version] / schema.tokens_file(1)
                on_disk = _column_disk_bytes(path)
                written_by[case, version] = {
                    "file_mib": path.stat().st_size / 2**20,
                    "route_bytes_on_disk": [on_disk[c] / decisions for c in (schema.COL_ROUTES_OLD_FREE,
                                                                             schema.COL_ROUTES_NEW)],
                    "route_bytes_in_arrow": [n / decisions for n in written["route_arrow_bytes"]],
                }
                print(f"[stream] {case} v{version}: wrote {written_by[case, version]['file_mib']:.0f} MiB Parquet in "
                      f"{time.perf_counter() - t:.1f}s", file=sys.stderr)
        best = {(case, v, mode): dict(written_by[case, v]) for case, v in runs for mode in STREAM_MODES}
        for _ in range(args.rounds):
            for (case, version, mode), kept in best.items():
                cmd = [sys.executable, __file__, "--child", str(runs[case, version])]
                cmd += ["--batch-rows", str(args.batch_rows)] if args.batch_rows else []
                cmd += ["--decode-only"] if mode == "decode only" else []
                cmd += ["--read-ahead", "0"] if mode.endswith("no read-ahead") else []
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                result = json.loads(out.strip().splitlines()[-1])
                if "wall" not in kept or result["wall"] < kept["wall"]:
                    kept.update(result)
        for result in best.values():
            result["decisions_per_s"] = result["routers"] / result["wall"]
            result["cpu_decisions_per_s"] = result["routers"] / result["cpu"]
            result["decoded_routes_mib"] = 2 * decisions * args.top_k * 2 / 2**20  # two int16 [tokens, layers, k]
        return best


def _other_columns(args: argparse.Namespace) -> dict:
    """Every column of a step table but the route columns, synthetic values, at the bench shape."""
    import pyarrow as pa

    from moestab.run_folder import schema

    n, layers = args.tokens, args.layers
    rng = np.random.default_rng(2)
    keys = _keys(n)

    def per_layer() -> pa.FixedSizeListArray:  # [n] lists of `layers` float32
        return pa.FixedSizeListArray.from_arrays(pa.array(rng.random(n * layers, np.float32)), layers)

    def logp() -> pa.Array:
        return pa.array(-rng.exponential(1.0, n).astype(np.float32))

    seq = (np.arange(n) // 4000).astype(np.int32)  # 4,000-token responses, as `position` below
    return {
        schema.COL_STEP: pa.array(keys["step"]), schema.COL_SEQ: pa.array(seq),
        schema.COL_PROMPT: pa.array(seq // 16), schema.COL_MINIBATCH: pa.array(keys["minibatch"]),
        schema.COL_POSITION: pa.array(np.arange(n, dtype=np.int32) % 4000),
        schema.COL_RESPONSE_LEN: pa.array(np.full(n, 4000, np.int32)),
        schema.COL_REWARD: pa.array(rng.integers(0, 2, n).astype(np.float32)),
        schema.COL_ADVANTAGE: pa.array(rng.normal(size=n).astype(np.float32)),
        **{c: logp() for c in (schema.COL_LOGP_ROLLOUT, schema.COL_LOGP_OLD, schema.COL_LOGP_OLD_FREE,
                               schema.COL_LOGP_UPDATE, schema.COL_LOGP_NEW)},
        schema.COL_LOG_W: pa.array(rng.normal(0, 0.05, n).astype(np.float32)),
        schema.COL_CLIPPED: pa.array(rng.random(n) < 0.01),
        schema.COL_MARGIN_OLD: per_layer(), schema.COL_CONFIDENCE_OLD: per_layer(),
    }


def sizes_child(root: str, args: argparse.Namespace, version: int, case: str, relations: str) -> None:
    """Write one whole step table of ``version`` (route columns as ``SIZE_RELATIONS[relations]`` at the change rate of
    ``case``) with ``RunWriter``; print the time to encode its route columns and to write it, and its sizes per column,
    as JSON."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from moestab.analysis.synthetic import route_chain
    from moestab.run_folder import RunFolder, schema
    from moestab.run_folder.reader import iter_token_batches, route_array
    from moestab.run_folder.route_columns import (
        encode_route_columns,
        route_layout,
        route_layout_for,
        token_parquet_options,
        with_route_layout,
    )
    from moestab.run_folder.writer import RunWriter

    _, flip, reorder, reorder_flipped = next(c for c in CASES if c[0] == case)
    holds = SIZE_RELATIONS[relations]
    chain = route_chain(args.tokens, args.layers, args.top_k, args.experts, length=max(holds.values()) + 1, flip=flip,
                        reorder=reorder, reorder_flipped=reorder_flipped)  # [tokens, layers, k] each
    others = _other_columns(args)
    run = Path(root) / f"sizes_v{version}"
    RunFolder(run).tokens_dir.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    layout = route_layout_for(args.experts, args.layers, args.top_k, schema_version=version)
    routes, layout = encode_route_columns({c: chain[i] for c, i in holds.items()}, layout)
    names = list(others)
    order = [*names[:15], *routes, *names[15:]]  # the run format's column order: route columns before the floats
    table = with_route_layout(pa.table({c: {**others, **routes}[c] for c in order}), layout)
    encoded = time.perf_counter() - t
    del chain, routes
    path = run / schema.tokens_file(1)
    if args.full_codec is None:
        RunWriter(run).write_tokens(1, table, row_group_size=args.row_group)
    else:  # what RunWriter writes, the columns stored in full compressed otherwise
        options = token_parquet_options(table.schema, full=(args.full_codec, None if args.full_codec == "none" else 1))
        pq.write_table(table, path, row_group_size=args.row_group, **options)
    written = time.perf_counter() - t
    arrow = {c: table.column(c).nbytes for c in table.column_names}
    del table
    t = time.perf_counter()
    for batch in iter_token_batches(path, schema.ROUTE_COLUMNS):  # every route column decoded to int16
        for c in schema.ROUTE_COLUMNS:
            route_array(batch.column(c), args.top_k, route_layout(batch.schema))
    read = time.perf_counter() - t
    references = dict(layout.references) if layout is not None else {}
    print(json.dumps({"encode_s": encoded, "write_s": written, "read_s": read, "file": path.stat().st_size,
                      "disk": _column_disk_bytes(path), "arrow": arrow, "references": references}))
    path.unlink()


def bench_sizes(args: argparse.Namespace) -> None:
    """Print, per change rate (R3-level, GSPO-level), column relations and layout, the bytes of a whole step table on
    disk and in Arrow memory, by column group, and the time to encode its route columns and write it."""
    from moestab.run_folder import schema

    tokens, decisions = args.tokens, args.tokens * args.layers
    groups = {"route columns (5)": list(schema.ROUTE_COLUMNS),
              "per-layer floats (2)": [schema.COL_MARGIN_OLD, schema.COL_CONFIDENCE_OLD]}
    print(f"  step tables of {tokens:,} tokens, {args.layers} layers, top-{args.top_k} of {args.experts}; route "
          f"columns: {SIZE_RELATIONS}")
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        for case in ("R3-level", "GSPO-level"):
            for relations in SIZE_RELATIONS:
                for version in args.versions:
                    cmd = [sys.executable, __file__, "--sizes-child", tmp, "--version", str(version),
                           "--case", case, "--relations", relations, *_shape_args(args)]
                    cmd += ["--full-codec", args.full_codec] if args.full_codec else []
                    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                    r = json.loads(out.splitlines()[-1])
                    routes = sum(r["disk"][c] for c in schema.ROUTE_COLUMNS) / decisions
                    timing = (f"encoded and written in {r['write_s']:.2f} s (route columns encoded in "
                              f"{r['encode_s']:.2f} s); the 5 route columns read back to int16 at "
                              f"{5 * decisions / r['read_s'] / 1e6:.0f} M decisions/s")
                    if relations == next(iter(SIZE_RELATIONS)):
                        codec = f" (columns stored in full: {args.full_codec})" if args.full_codec else ""
                        print(f"  [{case}] v{version} {LAYOUTS[version]}{codec}: all route columns: {routes:.2f} B "
                              f"per token x layer; {timing}")
                    else:
                        print(f"  [{case}, {relations}] v{version}: the 5 route columns take {routes:.2f} B per token "
                              f"x layer; {timing}")
                    if args.verbose:
                        _print_sizes(r, args, version, groups, decisions)


def _print_sizes(r: dict, args: argparse.Namespace, version: int, groups: dict, decisions: int) -> None:
    from moestab.run_folder import schema

    scalars = [c for c in r["arrow"] if not any(c in cols for cols in groups.values())]
    print(f"    step table v{version}: {r['file'] / 1e9:.3f} GB on disk ({r['file'] / 2**30:.2f} GiB), "
          f"{sum(r['arrow'].values()) / 1e9:.3f} GB in Arrow memory")
    for name, cols in {**groups, f"one-value columns ({len(scalars)})": scalars}.items():
        disk, arrow = sum(r["disk"][c] for c in cols), sum(r["arrow"][c] for c in cols)
        print(f"    {name:<24} disk {disk / 1e9:6.3f} GB  memory {arrow / 1e9:6.3f} GB  "
              f"per decision: disk {disk / decisions:6.2f} B  memory {arrow / decisions:6.2f} B")
    for c in schema.ROUTE_COLUMNS:
        reference = r["references"].get(c, "n/a")
        print(f"    {c:<24} disk {r['disk'][c] / decisions:6.2f} B/decision  "
              f"memory {r['arrow'][c] / decisions:6.2f} B/decision  reference: {reference}")


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
    parser.add_argument("--skip-memory", action="store_true", help="only the streamed run folders")
    parser.add_argument("--versions", type=int, nargs="+", default=None,
                        help="run-format versions whose route-column layout to stream (default: 2 3 4) or size "
                             "(default: 3 4)")
    parser.add_argument("--sizes", action="store_true", help="only the step-table sizes, per change rate and layout")
    parser.add_argument("--verbose", action="store_true", help="with --sizes: the sizes column by column")
    parser.add_argument("--full-codec", choices=["zstd", "none", "lz4", "snappy"], default=None,
                        help="compress version 4's route columns stored in full with this codec instead "
                             "of the writer's, in --sizes and the streamed run folders (to compare)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--write-run", help=argparse.SUPPRESS)
    parser.add_argument("--sizes-child", help=argparse.SUPPRESS)
    parser.add_argument("--decode-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--read-ahead", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--version", type=int, default=3, help=argparse.SUPPRESS)
    parser.add_argument("--case", default="R3-level", help=argparse.SUPPRESS)
    parser.add_argument("--relations", default=next(iter(SIZE_RELATIONS)), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.versions is None:
        args.versions = [3, 4] if args.sizes else [2, 3, 4]
    if args.child:
        stream_child(args.child, args.batch_rows, None, args.decode_only, args.read_ahead)
        return
    if args.write_run:
        write_run_folder(Path(args.write_run), args, args.version)
        return
    if args.sizes_child:
        sizes_child(args.sizes_child, args, args.version, args.case, args.relations)
        return

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"numpy {np.__version__}, load average at start {os.getloadavg()[0]:.2f}"
    )
    print(f"table: {args.tokens:,} tokens x {args.layers} layers x top-{args.top_k} of {args.experts} experts")
    if args.sizes:
        bench_sizes(args)
        return
    # Streaming first, while this process is small (children inherit its ru_maxrss).
    if not args.skip_stream:
        batch = args.batch_rows or "auto"
        codec = f" (columns stored in full: {args.full_codec})" if args.full_codec else ""
        for (case, version, mode), s in bench_stream(args).items():
            disk, arrow = s["route_bytes_on_disk"], s["route_bytes_in_arrow"]
            rate, cpu_rate = s["decisions_per_s"] / 1e6, s["cpu_decisions_per_s"] / 1e6
            print(
                f"  streaming  [{case}] v{version} {LAYOUTS.get(version, '?')}{codec if version == 4 else ''}, "
                f"{mode}: Parquet {s['file_mib']:.0f} MiB, "
                f"batch rows {batch}, row groups {args.row_group}: {s['wall']:.2f} s  {rate:.1f} M decisions/s "
                f"(per CPU-second {cpu_rate:.1f} M); peak RSS {s['peak_rss'] / 2**20:.0f} MiB (VmHWM "
                f"{s['vm_hwm'] / 2**20:.0f} MiB, {s['imported_rss'] / 2**20:.0f} MiB of it the imports'; the two "
                f"route columns decoded: {s['decoded_routes_mib']:.0f} MiB); "
                f"a route column per decision: {disk[0]:.2f} / {disk[1]:.2f} B on disk, {arrow[0]:.2f} B in Arrow"
            )
    for r in [] if args.skip_memory else bench_memory(args):
        print(
            f"  in memory  {r['case']:<11} {r['what']:<18} threads={r['threads']}: "
            f"{r['wall']:.3f} s  {r['decisions_per_s'] / 1e6:6.1f} M decisions/s "
            f"(per CPU-second {r['cpu_decisions_per_s'] / 1e6:.1f} M)"
        )
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
