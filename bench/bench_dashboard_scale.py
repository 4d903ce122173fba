"""Benchmark: the dashboard on large runs folders and large metrics.jsonl files, in a real browser (issue 55.10).

Runs folders of 100 / 1,000 / 10,000 runs (hard-linked copies of ``--source``: run.json, config.yaml, metrics.jsonl
and its per-token tables, 1,000 runs a sub-folder) and one run whose metrics.jsonl is 10 MB / 100 MB / 1 GB (the
source's lines repeated, steps renumbered: ``bench_metrics_scale.make_run``). For each, a fresh Streamlit server of
the code under test (``--code DIR``: another checkout, for before / after side by side in one run) with an empty
``$MOESTAB_CACHE``; the system Chromium (Playwright) opens a page and the script polls it every 0.25 s:

- Runs page: *first answer*, the seconds until its table shows rows; *complete*, until every run is in it (no "Still
  reading" bar, no rerun under way); then a second server on the same cache (*warm*: the run index kept on disk).
- Compare page (the large metrics file): until its charts are drawn.

and the server's peak RSS (``VmHWM``). A page that is not complete within ``--timeout`` seconds is reported as such.

    .venv/bin/python bench/bench_dashboard_scale.py --source runs/readme/default/gspo-off-seed0 \
        [--runs 100 1000 10000] [--metrics-mb 10 100 1000] [--code /tmp/before] [--timeout 900]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_metrics_scale import make_run

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = next((p for name in ("chromium", "chromium-browser", "google-chrome") if (p := shutil.which(name))), None)

# What the Runs page shows: 'rows' once its table has rows, 'complete' once nothing is read or rerun any more.
RUNS_STATE = """() => {
  const h1 = document.querySelector('h1');
  if (!h1 || h1.innerText.trim() !== 'Runs') return 'none';
  const table = document.querySelector('[data-testid="stDataFrame"] table');
  const rows = table ? table.querySelectorAll('tbody tr').length : 0;
  if (!rows) return 'none';
  const reading = document.body.innerText.includes('Still reading the runs');
  const busy = document.querySelector('[data-testid="stStatusWidget"]')
    || document.querySelector('[data-stale="true"]');
  return reading || busy ? 'rows' : 'complete';
}"""
# The Compare page once its first chart has drawn marks and no rerun is under way.
COMPARE_DRAWN = """() => {
  const h1 = document.querySelector('h1');
  if (!h1 || h1.innerText.trim() !== 'Compare') return false;
  if (document.querySelector('[data-testid="stStatusWidget"]') || document.querySelector('[data-stale="true"]'))
    return false;
  return !!document.querySelector('[data-testid="stVegaLiteChart"] svg g.role-mark path');
}"""


def make_runs(source: Path, root: Path, count: int) -> Path:
    """``count`` hard-linked copies of ``source``'s analysed files under ``root``."""
    files = ["run.json", "config.yaml", "metrics.jsonl", *(f"tokens/{p.name}" for p in (source / "tokens").glob("*"))]
    for i in range(count):
        run = root / f"sweep{i // 1000:02d}" / f"run{i:05d}"
        (run / "tokens").mkdir(parents=True)
        for name in files:
            os.link(source / name, run / name)
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@contextlib.contextmanager
def server(root: Path, code: Path, cache: Path, log: Path) -> Iterator[tuple[str, int]]:
    """A Streamlit server of ``code``'s dashboard on ``root``; yields (URL, PID)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(code), "MOESTAB_CACHE": str(cache)}
    command = [sys.executable, "-m", "streamlit", "run", str(code / "moestab" / "dashboard" / "app.py"),
               "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
               "--", str(root)]
    with log.open("w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cache,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if process.poll() is not None:
                raise SystemExit(f"the server exited ({process.returncode}); see {log}")
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.3)
        yield url, process.pid
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def watch_runs_page(browser, url: str, timeout: float) -> tuple[float | None, float | None]:
    """Seconds until the Runs page shows rows and until it is complete (``None``: not within ``timeout``)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    start = time.monotonic()
    page.goto(f"{url}/runs", wait_until="domcontentloaded", timeout=timeout * 1000)
    first = None
    try:
        while time.monotonic() - start < timeout:
            state = page.evaluate(RUNS_STATE)
            if state != "none" and first is None:
                first = time.monotonic() - start
            if state == "complete":
                time.sleep(1.0)  # a rerun may be starting: complete only if it stays so
                if page.evaluate(RUNS_STATE) == "complete":
                    return first, time.monotonic() - start - 1.0
            time.sleep(0.25)
        return first, None
    finally:
        page.close()


def watch_compare_page(browser, url: str, timeout: float) -> float | None:
    page = browser.new_page(viewport={"width": 1400, "height": 3000})
    start = time.monotonic()
    page.goto(url, wait_until="domcontentloaded", timeout=timeout * 1000)
    try:
        while time.monotonic() - start < timeout:
            if page.evaluate(COMPARE_DRAWN):
                return time.monotonic() - start
            time.sleep(0.25)
        return None
    finally:
        page.close()


def shown(seconds: float | None, timeout: float) -> str:
    return f"> {timeout:.0f}" if seconds is None else f"{seconds:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, required=True, help="a finished run folder to copy")
    parser.add_argument("--runs", type=int, nargs="*", default=[100, 1000, 10000])
    parser.add_argument("--metrics-mb", type=float, nargs="*", default=[10, 100, 1000])
    parser.add_argument("--code", type=Path, help="another checkout to measure beside this one (before)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a page may take (default 900)")
    parser.add_argument("--work", type=Path, help="folder for the generated runs (default: a temporary one)")
    args = parser.parse_args()
    if CHROMIUM is None:
        raise SystemExit("no Chromium on PATH")
    from playwright.sync_api import sync_playwright

    codes = {"now": REPO, **({"before": args.code.resolve()} if args.code else {})}
    work = Path(tempfile.mkdtemp(prefix="dash-scale-", dir=args.work))
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()};"
          f" {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; timeout {args.timeout:.0f} s")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=["--disable-dev-shm-usage", "--disable-gpu"])
        if args.runs:
            print("| runs | code | first answer (s) | complete (s) | peak RSS (MB) | warm: complete (s) | "
                  "warm: peak RSS (MB) |")
            print("|---|---|---|---|---|---|---|")
        for count in args.runs:
            root = make_runs(args.source, work / f"runs{count}", count)
            for name, code in codes.items():
                cache = Path(tempfile.mkdtemp(prefix="cache-", dir=work))
                with server(root, code, cache, work / f"server-{name}-{count}.log") as (url, pid):
                    first, complete = watch_runs_page(browser, url, args.timeout)
                    rss = peak_rss_mb(pid)
                warm = "-"
                if name == "now":
                    with server(root, code, cache, work / f"server-{name}-{count}-warm.log") as (url, pid):
                        _, again = watch_runs_page(browser, url, args.timeout)
                        warm = f"{shown(again, args.timeout)} | {peak_rss_mb(pid):,.0f}"
                else:
                    warm = "- | -"
                print(f"| {count:,} | {name} | {shown(first, args.timeout)} | {shown(complete, args.timeout)} | "
                      f"{rss:,.0f} | {warm} |", flush=True)
            shutil.rmtree(root)
        if args.metrics_mb:
            print("\n| metrics.jsonl | code | Compare page drawn (s) | peak RSS (MB) |")
            print("|---|---|---|---|")
        for size in args.metrics_mb:
            root = work / f"metrics{size:g}"
            make_run(args.source, root / "run", size)
            for name, code in codes.items():
                cache = Path(tempfile.mkdtemp(prefix="cache-", dir=work))
                with server(root, code, cache, work / f"server-{name}-{size:g}mb.log") as (url, pid):
                    drawn = watch_compare_page(browser, url, args.timeout)
                    rss = peak_rss_mb(pid)
                print(f"| {size:g} MB | {name} | {shown(drawn, args.timeout)} | {rss:,.0f} |", flush=True)
            shutil.rmtree(root)
        browser.close()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
