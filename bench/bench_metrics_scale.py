"""Benchmark: ``moestab analyze RUN`` on a run whose metrics.jsonl is large (10 MB, 100 MB, 1 GB), wall time and peak
memory (the child's max RSS), each in a fresh process.

The run folder is a copy of a real run's run.json and config.yaml with metrics.jsonl made of the real run's lines
repeated, steps renumbered, to each size (no token table: the summary reads metrics.jsonl only). ``--code DIR`` runs
another checkout's moestab (its folder on PYTHONPATH), for before / after side by side in one run:

    .venv/bin/python bench/bench_metrics_scale.py --source runs/readme/default/gspo-off-seed0 \
        [--sizes-mb 10 100 1000] [--code /tmp/before]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make_run(source: Path, folder: Path, size_mb: float) -> Path:
    """A run folder at ``folder`` whose metrics.jsonl is ``source``'s lines repeated to ``size_mb`` megabytes."""
    folder.mkdir(parents=True)
    for name in ("run.json", "config.yaml"):
        shutil.copy(source / name, folder / name)
    lines = [json.loads(x) for x in (source / "metrics.jsonl").read_text().splitlines() if x.strip()]
    target, written, step = size_mb * 1e6, 0, 0
    with (folder / "metrics.jsonl").open("w") as f:
        while written < target:
            for line in lines:
                step += 1
                text = json.dumps({**line, "step": step}) + "\n"
                f.write(text)
                written += len(text)
                if written >= target:
                    break
    info = json.loads((folder / "run.json").read_text())
    info["last_step"] = step
    (folder / "run.json").write_text(json.dumps(info))
    return folder


CHILD = """
import os, resource, runpy, sys
sys.argv = ["moestab", "analyze", sys.argv[1], "--json", os.devnull]
try:
    runpy.run_module("moestab.cli", run_name="__main__")
except SystemExit as exc:
    code = exc.code
else:
    code = 0
print("peak-rss-kb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


def analyze(run: Path, code: Path | None) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB, the process's own ``ru_maxrss``) of ``moestab analyze RUN --json`` in a fresh
    process."""
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = str(code)
    start = time.perf_counter()
    # Run from the run's parent: ``python -c`` puts the working directory first on sys.path, ahead of PYTHONPATH.
    done = subprocess.run([sys.executable, "-c", CHILD, str(run)], env=env, capture_output=True, text=True,
                          cwd=run.parent)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"moestab analyze {run} failed ({done.returncode}): {done.stderr[-2000:]}")
    peak = next(int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("peak-rss-kb"))
    return wall, peak / 1024  # KB -> MB (Linux)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, required=True, help="a finished run whose metrics.jsonl lines repeat")
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--code", type=Path, action="append", default=[],
                        help="another checkout to time beside this one (its folder goes on PYTHONPATH)")
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}")
    print("\n| metrics.jsonl | code | wall (s) | peak RSS (MB) |\n|---|---|---|---|")
    codes = [None, *args.code]
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes_mb:
            run = make_run(args.source, Path(tmp) / f"run-{size:g}mb", size)
            real = (run / "metrics.jsonl").stat().st_size / 1e6
            for code in codes:  # one fresh process each
                wall, peak = analyze(run, code)
                print(f"| {real:.0f} MB | {'this checkout' if code is None else code} | {wall:.1f} | {peak:.0f} |",
                      flush=True)
            shutil.rmtree(run)


if __name__ == "__main__":
    main()
