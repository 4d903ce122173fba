"""Write docs/metrics.md's key reference from the key table (moestab/metrics/keys.py), or check it.

    .venv/bin/python scripts/metric_docs.py           # rewrite the part between the markers
    .venv/bin/python scripts/metric_docs.py --check   # exit 1 when docs/metrics.md and the table differ

Only the part between ``keys.BEGIN_MARKER`` and ``keys.END_MARKER`` is generated; the rest of the file is written by
hand. tests/test_docs.py runs the check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from moestab.metrics import keys
from moestab.train.key_owners import key_owners

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check; exit 1 when the file is out of date")
    args = parser.parse_args(argv)
    text = DOC.read_text()
    generated = keys.with_reference(text, key_owners())
    if generated == text:
        print(f"{DOC}: up to date")
        return 0
    if args.check:
        print(f"{DOC}: the key reference differs from moestab/metrics/keys.py; run python scripts/metric_docs.py",
              file=sys.stderr)
        return 1
    DOC.write_text(generated)
    print(f"{DOC}: key reference rewritten")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
