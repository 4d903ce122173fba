"""Save one figure of an executed notebook as a PNG (README's and docs/'s notebook images come from here).

    .venv/bin/python scripts/notebook_figure.py notebooks/01_controlled_experiment.ipynb 0 docs/images/nb01.png

The figure index counts the notebook's PNG outputs from 0, top to bottom; the script lists them when it is out of
range.
"""

from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path


def figures(notebook: Path) -> list[tuple[int, bytes]]:
    """(code cell index, PNG bytes) of every PNG output, in order."""
    cells = json.loads(notebook.read_text())["cells"]
    return [(i, base64.b64decode(out["data"]["image/png"])) for i, cell in enumerate(cells)
            for out in cell.get("outputs", []) if "image/png" in out.get("data", {})]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebook", type=Path)
    parser.add_argument("index", type=int, help="which PNG output, from 0")
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    found = figures(args.notebook)
    if not 0 <= args.index < len(found):
        cells = ", ".join(f"{n}: cell {cell}" for n, (cell, _) in enumerate(found)) or "none"
        raise SystemExit(f"{args.notebook} has {len(found)} figure(s) ({cells}); index {args.index} is not one")
    args.out.write_bytes(found[args.index][1])
    print(f"wrote {args.out} (figure {args.index}, cell {found[args.index][0]} of {args.notebook})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
