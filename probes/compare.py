"""Probe `compare`: the same as `moestab probe compare ...` (see `moestab probe --help`; logic in moestab.probes)."""

import sys

from moestab.cli import main

if __name__ == "__main__":
    sys.exit(main(["probe", "compare", *sys.argv[1:]]))
