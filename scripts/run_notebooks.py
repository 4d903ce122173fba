"""Execute every notebook (notebooks/*.py, jupytext percent format) and write it as notebooks/NAME.ipynb with
its outputs, at full size by default; prints each notebook's wall time.

    .venv/bin/python scripts/run_notebooks.py [--size full|smoke] [NAME ...]

Runs land under runs/notebooks/ (finished runs are reused; delete that folder to recompute everything).

A notebook whose outputs show an absolute path of this machine, a progress bar or a warning is not written to
notebooks/ (moestab.experiments.notebooks.output_noise): the offending lines are printed, the executed notebook is
kept as runs/notebooks/NAME.ipynb to look at, and the script exits 1 after the other notebooks. Fix the notebook's
source (print paths relative to the repository, progress=False, silence the warning in its setup cell) and rerun.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat

from moestab.experiments.notebooks import SIZES, execute_notebook, output_noise

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
REFUSED = ROOT / "runs" / "notebooks"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=SIZES, default="full")
    parser.add_argument("names", nargs="*", help="notebook names (default: all)")
    args = parser.parse_args(argv)
    sources = sorted(NOTEBOOKS.glob("*.py"))
    if args.names:
        sources = [s for s in sources if s.stem in args.names]
    total, refused = 0.0, []
    for source in sources:
        start = time.perf_counter()
        notebook = execute_notebook(source, args.size, cwd=ROOT)
        elapsed = time.perf_counter() - start
        total += elapsed
        print(f"{source.name}: {elapsed:.0f} s at {args.size} size", flush=True)
        noise = output_noise(notebook)
        if noise:
            refused.append(source.name)
            kept = REFUSED / source.with_suffix(".ipynb").name
            kept.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(notebook, kept)
            print(f"{source.name}: not written, {len(noise)} output line(s) a reader should not see (kept as "
                  f"{kept.relative_to(ROOT)}):", *(f"  {line}" for line in noise), sep="\n", file=sys.stderr)
        elif args.size == "full":
            nbformat.write(notebook, source.with_suffix(".ipynb"))
    print(f"all: {total:.0f} s")
    if refused:
        print(f"refused: {', '.join(refused)}", file=sys.stderr)
    return 1 if refused else 0


if __name__ == "__main__":
    raise SystemExit(main())
