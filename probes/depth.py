"""Probe `depth`: the same as `moestab probe depth ...` (see `moestab probe --help`; logic in moestab.probes)."""

import sys

from moestab.cli import main

if __name__ == "__main__":
    sys.exit(main(["probe", "depth", *sys.argv[1:]]))
