"""Write the built-in probe suites as files: probes/suites/*.jsonl and probes/suites/manifest.json.

    .venv/bin/python probes/build_suites.py [--out probes/suites]

The files are what `--suite general` / `--suite task:SPEC` generate in code (the manifest's sha256 matches the
probe results' suite hash), written out for reading, for other tools, and for `--suite probes/suites/FILE.jsonl`.
"""

import argparse
from pathlib import Path

from moestab.probes.suites import general_suite, task_suite, write_suites

SHIPPED_TASKS = ("arithmetic", "sort:length=32")

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("suites"))
    args = parser.parse_args()
    suites = [general_suite(), *(task_suite(spec) for spec in SHIPPED_TASKS)]
    print(f"wrote {write_suites(suites, args.out)}")
