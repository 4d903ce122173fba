"""The ``moestab`` console script: a thin dispatcher over ``moestab.commands``.

Each subcommand lives in ``moestab/commands/<name>.py`` and exposes ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``; this module only wires them together.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from moestab import __version__

# Subcommand name -> module under moestab.commands (imported lazily: `moestab --help` stays fast).
SUBCOMMANDS = {
    "train": "train",
    "analyze": "analyze",
    "dashboard": "dashboard",
    "probe": "probe",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moestab",
        description="Diagnose Mixture-of-Experts routing stability during RL fine-tuning.",
    )
    parser.add_argument("--version", action="version", version=f"moestab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(f"moestab.commands.{module_name}")
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
