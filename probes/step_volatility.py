"""Probe `step-volatility`: the same as `moestab probe step-volatility ...` (see `moestab probe --help`; logic in
moestab.probes)."""

import sys

from moestab.cli import main

if __name__ == "__main__":
    sys.exit(main(["probe", "step-volatility", *sys.argv[1:]]))
