"""Probe `saturation`: the same as `moestab probe saturation ...` (see `moestab probe --help`)."""

import sys

from moestab.cli import main

if __name__ == "__main__":
    sys.exit(main(["probe", "saturation", *sys.argv[1:]]))
