"""Probe `routers`: the same as `moestab probe routers ...` (see `moestab probe --help`)."""

import sys

from moestab.cli import main

if __name__ == "__main__":
    sys.exit(main(["probe", "routers", *sys.argv[1:]]))
