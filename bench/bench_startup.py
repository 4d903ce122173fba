"""Benchmark: how long ``moestab --help``, ``moestab --version`` and ``moestab train --help`` take, start to exit.

Each command is a fresh process (the console script next to this interpreter, else ``python -m moestab``), timed
from outside with a monotonic clock; CPU seconds are the children's ``getrusage``. With ``--before COMMIT`` the same
commands also run from COMMIT's tree (a temporary git worktree put first on PYTHONPATH, before this checkout's
editable install, as bench/ab_commit.sh does), alternating before / after round by round so that both see the same
machine; the ratio is before / after of the means. Then ``python -X importtime`` of each command: its total import
time and the imports that take longest (cumulative, microseconds), for each tree.

Run (docs/benchmarks.md, "Start-up"):
    .venv/bin/python bench/bench_startup.py --before COMMIT [--after COMMIT] --rounds 20
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = (("--help",), ("--version",), ("train", "--help"))
HEAVY = ("torch", "transformers", "pandas", "pyarrow", "numpy", "yaml")
"""Third-party packages whose import time is listed for each command (those it imports)."""
IMPORTTIME = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)$")


def moestab_command() -> list[str]:
    """The ``moestab`` console script of this interpreter's environment, else ``python -m moestab``."""
    script = Path(sys.executable).with_name("moestab")
    return [str(script)] if script.exists() else [sys.executable, "-m", "moestab"]


@contextmanager
def worktree(commit: str) -> Iterator[Path]:
    """COMMIT checked out in a temporary git worktree, removed afterwards."""
    tree = Path(tempfile.mkdtemp(prefix="moestab-before-"))
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tree), commit], cwd=ROOT, check=True)
    try:
        yield tree
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
        shutil.rmtree(tree, ignore_errors=True)


def environment(tree: Path) -> dict[str, str]:
    """This process's environment with ``tree`` first on PYTHONPATH: its ``moestab`` is the one imported."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}


def timed(argv: list[str], tree: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of ``argv`` with ``tree``'s moestab; it must exit 0."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=tree, env=environment(tree), capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode} in {tree}:\n{done.stderr}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def import_times(args: tuple[str, ...], tree: Path, top: int) -> tuple[int, dict[str, int]]:
    """``python -X importtime -m moestab ARGS`` with ``tree``'s moestab: the total of the top-level imports, and the
    cumulative time of the ``top`` slowest imports and of the HEAVY packages it imports, in microseconds."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "moestab", *args], cwd=tree,
                          env=environment(tree), capture_output=True, text=True)
    rows = [m for m in map(IMPORTTIME.match, done.stderr.splitlines()) if m]
    total = sum(int(m[2]) for m in rows if not m[3])
    cumulative: dict[str, int] = {}
    for m in rows:  # a module is listed once per import statement that reached it first: keep its largest
        cumulative[m[4]] = max(cumulative.get(m[4], 0), int(m[2]))
    slowest = sorted(cumulative, key=cumulative.get, reverse=True)[:top]
    return total, {name: cumulative[name] for name in [*slowest, *(h for h in HEAVY if h in cumulative)]}


def cpu_model() -> str:
    """The processor's model name (Linux), else the empty string."""
    cpuinfo = Path("/proc/cpuinfo")
    text = cpuinfo.read_text() if cpuinfo.exists() else ""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")


def mean_sd(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} +- {statistics.stdev(values):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", metavar="COMMIT", help="also time COMMIT's moestab (e.g. HEAD~1), alternating")
    parser.add_argument("--after", metavar="COMMIT", help="time COMMIT's moestab as 'after' (default: this checkout, "
                        "uncommitted changes included)")
    parser.add_argument("--rounds", type=int, default=20, help="timed runs of each command in each tree")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs of each command first (file cache)")
    parser.add_argument("--top", type=int, default=8, help="imports listed per command by -X importtime")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be >= 2 (a standard deviation needs two)")

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    print(f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, {platform.machine()} {cpu_model()}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}, this checkout {head.strip()}, "
          f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    base = moestab_command()
    print(f"# command: {' '.join(base)} ARGS, {args.rounds} rounds after {args.warmup} warm-up")
    with (worktree(args.before) if args.before else _no_tree() as before_tree,
          worktree(args.after) if args.after else _no_tree() as after_tree):
        after = f"after ({args.after})" if args.after else "after"
        trees = {after: after_tree or ROOT} | ({f"before ({args.before})": before_tree} if before_tree else {})
        walls: dict[tuple[str, tuple[str, ...]], list[float]] = {}
        cpus: dict[tuple[str, tuple[str, ...]], list[float]] = {}
        for round_ in range(args.warmup + args.rounds):
            for command in COMMANDS:
                for label, tree in reversed(trees.items()):  # before first, then after, in every round
                    wall, cpu = timed([*base, *command], tree)
                    if round_ >= args.warmup:
                        walls.setdefault((label, command), []).append(wall)
                        cpus.setdefault((label, command), []).append(cpu)
        print("\n| command | tree | wall s (mean +- sd) | CPU s (mean +- sd) | before / after (wall) |")
        print("|---|---|---|---|---|")
        for command in COMMANDS:
            for label in reversed(trees):
                ratio = statistics.mean(walls[(label, command)]) / statistics.mean(walls[(after, command)])
                print(f"| `moestab {' '.join(command)}` | {label} | {mean_sd(walls[(label, command)])} | "
                      f"{mean_sd(cpus[(label, command)])} | {ratio:.1f}x |")
        for command in COMMANDS:
            for label, tree in reversed(trees.items()):
                total, ranked = import_times(command, tree, args.top)
                print(f"\n-X importtime, `moestab {' '.join(command)}`, {label}: {total / 1e3:.0f} ms of imports")
                for name, micros in ranked.items():
                    print(f"  {micros / 1e3:9.1f} ms  {name}")
    print(f"# load average after {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")


@contextmanager
def _no_tree() -> Iterator[None]:
    yield None


if __name__ == "__main__":
    main()
