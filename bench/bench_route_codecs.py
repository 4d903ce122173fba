"""Benchmark (issue 43.1-2): what one route column costs on disk and to read, per Parquet codec, at Qwen3-30B-A3B shape.

The trade-off behind schema 4 (``moestab.run_folder.route_columns``): a route column stored in full, and one stored as
its XOR with another at the R3-level and GSPO-level change rates (``bench/bench_analysis.py``'s ``CASES``, drawn by
``moestab.analysis.synthetic.route_chain``), each as a ``FixedSizeBinary(layers x top_k)`` column written by pyarrow
with each codec. Printed per column and codec: bytes a decision (token x layer) on disk and the CPU time to read the
column back into a NumPy byte array on one thread (best of ``--rounds``), and to write it, in ns a decision.

A codec is written ``NAME[:LEVEL][+bss]``: ``zstd`` is zstd at level 1 (what schema 4 writes), ``zstd:9`` at level 9,
``+bss`` adds Parquet's BYTE_STREAM_SPLIT encoding (each byte position of the rows stored as its own stream, so the
mostly-zero slots of an XOR column sit together).

    .venv/bin/python bench/bench_route_codecs.py [--tokens 200000] [--codecs zstd lz4 none zstd:9 brotli+bss]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CASES = {"R3-level": (0.1, 0.05), "GSPO-level": (0.8, 0.05)}
"""Change rate name -> (share of decisions with the k-th expert swapped out, share reordered): bench_analysis.py's."""


def column(ids: np.ndarray) -> pa.Table:
    """``ids`` ``[tokens, layers, top_k]`` uint8 as one FixedSizeBinary column, a token a row."""
    tokens, width = ids.shape[0], ids.shape[1] * ids.shape[2]
    data = pa.py_buffer(np.ascontiguousarray(ids).tobytes())
    return pa.table({"routes": pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), tokens, [None, data])})


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_options(spec: str) -> dict:
    """``pyarrow.parquet.write_table`` settings of a codec spec ``NAME[:LEVEL][+bss]`` (module docstring)."""
    name, bss = (spec[:-4], True) if spec.endswith("+bss") else (spec, False)
    codec, _, level = name.partition(":")
    options: dict = {"compression": codec, "use_dictionary": False}
    if level or codec == "zstd":
        options["compression_level"] = int(level or 1)
    if bss:
        options["column_encoding"] = {"routes": "BYTE_STREAM_SPLIT"}
    return options


def measure(table: pa.Table, codec: str, folder: Path, rounds: int, decisions: int) -> tuple[float, float, float]:
    """(bytes a decision on disk, best CPU ns a decision to read it back to a NumPy byte array, one thread, and to
    write it, best of the same rounds)."""
    path = folder / "column.parquet"
    written = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        pq.write_table(table, path, **write_options(codec))
        written = min(written, time.process_time() - start)
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        got = pq.read_table(path, use_threads=False).column(0).combine_chunks()
        values = np.frombuffer(got.buffers()[1], np.uint8)  # [tokens * width]
        best = min(best, time.process_time() - start)
    if not np.array_equal(values, np.frombuffer(table.column(0).chunk(0).buffers()[1], np.uint8)):
        raise SystemExit(f"{codec}: the column did not read back as written")
    return path.stat().st_size / decisions, best / decisions * 1e9, written / decisions * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--codecs", nargs="+", default=["zstd", "lz4", "snappy", "none", "zstd:3", "zstd:9",
                                                         "zstd:19", "zstd+bss", "zstd:9+bss", "zstd:19+bss",
                                                         "brotli", "brotli+bss", "brotli:11+bss", "gzip:9+bss"])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from moestab.analysis.synthetic import route_chain

    decisions = args.tokens * args.layers
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start; "
          f"{args.tokens:,} tokens x {args.layers} layers x top-{args.top_k} of {args.experts}; read on one thread, "
          f"best of {args.rounds}")
    print("| column | codec | disk, B a decision | read, CPU ns a decision | write, CPU ns a decision |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        columns: dict[str, np.ndarray] = {}
        for case, (flip, reorder) in CASES.items():
            a, b = route_chain(args.tokens, args.layers, args.top_k, args.experts, length=2, flip=flip,
                               reorder=reorder)  # [tokens, layers, top_k] int16 each
            columns.setdefault("full", a.astype(np.uint8))
            columns[f"XOR, {case}"] = (a ^ b).astype(np.uint8)
        for name, ids in columns.items():
            table = column(ids)
            for codec in args.codecs:
                size, read, write = measure(table, codec, Path(tmp), args.rounds, decisions)
                print(f"| {name} | {codec} | {size:.2f} | {read:.2f} | {write:.1f} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
