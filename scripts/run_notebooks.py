"""Execute every notebook (notebooks/*.py, jupytext percent format) and write it as notebooks/NAME.ipynb with
its outputs, at full size by default; prints each notebook's wall time.

    .venv/bin/python scripts/run_notebooks.py [--size full|smoke] [NAME ...]

Runs land under runs/notebooks/ (finished runs are reused; delete that folder to recompute everything).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import nbformat

from moestab.experiments.notebooks import SIZES, execute_notebook

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=SIZES, default="full")
    parser.add_argument("names", nargs="*", help="notebook names (default: all)")
    args = parser.parse_args(argv)
    sources = sorted(NOTEBOOKS.glob("*.py"))
    if args.names:
        sources = [s for s in sources if s.stem in args.names]
    total = 0.0
    for source in sources:
        start = time.perf_counter()
        notebook = execute_notebook(source, args.size, cwd=NOTEBOOKS.parent)
        elapsed = time.perf_counter() - start
        total += elapsed
        if args.size == "full":
            nbformat.write(notebook, source.with_suffix(".ipynb"))
        print(f"{source.name}: {elapsed:.0f} s at {args.size} size", flush=True)
    print(f"all: {total:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
