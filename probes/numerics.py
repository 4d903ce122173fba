"""Probe `numerics`: the same as `moestab probe numerics ...` (see `moestab probe --help`; logic in moestab.probes)."""

import sys

from moestab.cli import main

if __name__ == "__main__":
    sys.exit(main(["probe", "numerics", *sys.argv[1:]]))
