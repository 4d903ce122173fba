"""Router statistics of warm-started bases (``moestab probe routers``), as mean +- sd over bases: docs/routers.md.

    .venv/bin/python scripts/router_stats_table.py --bases "no balancing loss=runs/issue39/cache/bases" \\
        "balancing 0.01=runs/issue41/cache/bases" [--count 256]

Each ``LABEL=FOLDER`` names a folder of warm-start cache entries (one per seed); every complete entry in it is
probed on the same held-out suite (``task:arithmetic``, ``--count`` problems) and its layers averaged, then the
bases are summarised as mean +- sd. Entries are listed with their seed and warm-start steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from moestab.analysis.router_stats import COLUMNS
from moestab.probes.checkpoints import Checkpoint
from moestab.probes.routers import routers
from moestab.probes.suites import load_suite
from moestab.train.warm_start import MARKER

SHOWN = [c for c in COLUMNS if c not in ("layer", "tokens")]


def _entries(folder: Path) -> list[tuple[Path, dict]]:
    """The complete cache entries in ``folder`` (those with their marker), by seed."""
    found = [(p, json.loads((p / MARKER).read_text())) for p in sorted(folder.iterdir())
             if p.is_dir() and (p / MARKER).is_file()]
    return sorted(found, key=lambda item: item[1]["spec"]["seed"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bases", nargs="+", required=True, metavar="LABEL=FOLDER")
    parser.add_argument("--count", type=int, default=256, help="held-out problems probed")
    args = parser.parse_args(argv)
    suite = load_suite("task:arithmetic", args.count)
    rows = []
    for item in args.bases:
        label, _, folder = item.partition("=")
        per_base = []
        for path, record in _entries(Path(folder)):
            table = routers([Checkpoint(path.name, path)], suite.texts)
            means = {c: float(table[c].mean()) for c in SHOWN}
            per_base.append(means)
            spec = record["spec"]
            print(f"{label}: seed {spec['seed']} ({path.name}, {record['steps']} warm-start steps, accuracy "
                  f"{record['accuracy']:.1%}, aux {spec.get('aux_loss_coef', 0.0)}): "
                  + ", ".join(f"{c} {v:.3g}" for c, v in means.items()), flush=True)
        rows.append((label, len(per_base), per_base))
    print(f"\nsuite task:arithmetic, {args.count} problems; per base the mean over its layers, then mean +- sd over "
          "bases\n")
    print("| quantity | " + " | ".join(f"{label} (n = {n})" for label, n, _ in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for column in SHOWN:
        cells = []
        for _, _, per_base in rows:
            xs = [b[column] for b in per_base]
            sd = statistics.stdev(xs) if len(xs) > 1 else float("nan")
            cells.append(f"{statistics.mean(xs):.3g} +- {sd:.2g}")
        print(f"| {column} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
