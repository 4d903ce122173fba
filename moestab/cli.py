"""The ``moestab`` console script: a thin dispatcher over ``moestab.commands``.

Each subcommand lives in ``moestab/commands/<name>.py`` and exposes ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``; this module only wires them together, and shows the library's
``logging`` messages on stderr while a command runs (:func:`notes_on_stderr`).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

from moestab import __version__

# Subcommand name -> module under moestab.commands. Each module imports only argparse-level things at its top (its
# heavy imports are in ``run``), so listing them all for ``moestab --help`` stays fast; ``add_arguments`` may import
# more (``train``'s reads TrainConfig), so only the chosen subcommand's runs.
SUBCOMMANDS = {
    "train": "train",
    "analyze": "analyze",
    "compare": "compare",
    "dashboard": "dashboard",
    "probe": "probe",
    "watch": "watch",
}


def build_parser(commands: Iterable[str] = tuple(SUBCOMMANDS)) -> argparse.ArgumentParser:
    """The ``moestab`` parser: every subcommand listed with its help, and the arguments of those in ``commands``
    (all by default; :func:`main` passes only the one on the command line)."""
    parser = argparse.ArgumentParser(
        prog="moestab",
        description="Diagnose Mixture-of-Experts routing stability during RL fine-tuning.",
    )
    parser.add_argument("--version", action="version", version=f"moestab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(f"moestab.commands.{module_name}")
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        if name in commands:
            module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def chosen_command(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names: its first word that is not an option (``moestab`` itself takes no option with
    a value); ``None`` for ``moestab``, ``moestab --help`` or ``moestab --version``."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(commands=(chosen_command(argv),))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        with notes_on_stderr():
            return int(args._run(args) or 0)
    except KeyboardInterrupt:  # a Ctrl-C the command did not defer (start-up, a second one): no traceback
        print(f"\nmoestab {args.command}: interrupted", file=sys.stderr)
        return 130  # what a shell reports for SIGINT


@contextmanager
def notes_on_stderr() -> Iterator[None]:
    """While a command runs, the library's messages (``logging`` under ``moestab``, INFO and up) are printed to stderr
    as ``moestab: message``; the handler is removed afterwards, leaving an in-process caller's logging as it was."""
    handler = logging.StreamHandler()  # the sys.stderr of now
    handler.setFormatter(logging.Formatter("moestab: %(message)s"))
    logger = logging.getLogger("moestab")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


if __name__ == "__main__":
    sys.exit(main())
