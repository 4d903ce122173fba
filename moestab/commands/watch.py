"""``moestab watch RUN``: follow a run being written (by ``moestab train``, the TRL integration or ``DiagnosticsRun``)
and print each collapse warning as it fires (docs/collapse.md: the rule, and what it can and cannot promise).

Only parses arguments and calls :func:`moestab.recording.collapse_watch.watch_run`. Exit status: 0 when no warning
fired, 3 when one did (``moestab train --on-collapse-warning stop``'s status), 1 when RUN is not a readable run
folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "Follow a run as it is written and print each collapse warning as it fires."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", type=Path, help="run folder being written (or a finished one)")
    parser.add_argument("--no-follow", dest="follow", action="store_false",
                        help="read what the run holds now and stop (default: keep reading until the run ends)")
    parser.add_argument("--interval", type=_seconds, default=2.0, metavar="SECONDS",
                        help="seconds between reads while following (default 2)")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"give seconds between 0.1 and 3600, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    from moestab.recording.collapse_watch import watch_run
    from moestab.run_folder.errors import RunError
    from moestab.train.interrupt import EXIT_COLLAPSE_STOP

    try:
        seen = watch_run(args.run, follow=args.follow, interval=args.interval, say=lambda s: print(s, flush=True))
    except RunError as exc:
        print(f"moestab watch: error: {exc}", file=sys.stderr)
        return 1
    return EXIT_COLLAPSE_STOP if seen.warnings else 0
