"""``--json [FILE]`` and ``--csv [FILE]``: one convention for every command that has them (analyze, probe).

FILE given: the output is written there, replacing a file already there, unless that file is a run's or a model
folder's own (``moestab.run_folder.owned``: refused before any work); missing folders are created, saying so. No FILE,
or ``-``: it goes to stdout, which then carries that output only (the text tables are not printed), so
``moestab analyze runs/* --json | jq`` parses. Both options may be given as long as at most one goes to stdout.
Without FILE the option goes after the positional arguments (``analyze RUN --json``): ``analyze --json RUN`` would
read RUN as the FILE, which is why a FILE that is a folder is refused, saying so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from moestab.run_folder.files import read_only_above
from moestab.run_folder.owned import owner

STDOUT = "-"
"""The target of ``--json`` / ``--csv`` given without FILE (or with ``-``)."""


def _target(value: str) -> str:
    """argparse type of FILE: an empty value is refused (``Path("")`` would be the current folder)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("the value is empty; give a file, or nothing (or '-') for stdout")
    return value


def add_output_options(parser: argparse.ArgumentParser, *, json_what: str, csv_what: str) -> None:
    """``--json [FILE]`` and ``--csv [FILE]``, writing what ``json_what`` / ``csv_what`` say (e.g. "the summary as
    a JSON list of objects, one per run")."""
    for option, what in (("--json", json_what), ("--csv", csv_what)):
        parser.add_argument(option, nargs="?", const=STDOUT, default=None, metavar="FILE", type=_target,
                            help=f"{what}, written to FILE; without FILE (or with '-'), printed to stdout instead "
                                 "of the text tables (then put the option after the positional arguments)")


def output_problem(json_target: str | None, csv_target: str | None) -> str | None:
    """Why ``--json`` / ``--csv`` could not be written, checked before any work; ``None`` when they can: both on
    stdout, a FILE that is a folder, a FILE under a path that is a file, or a FILE that is a run's or a model
    folder's own (:func:`moestab.run_folder.owned.owner`)."""
    if json_target == STDOUT and csv_target == STDOUT:
        return "--json and --csv both go to stdout; give one of them a FILE"
    for option, target in (("--json", json_target), ("--csv", csv_target)):
        if target in (None, STDOUT):
            continue
        path = Path(target)
        if path.is_dir():
            return (f"{option} {target} is a folder; give a file, or no FILE for stdout (then put {option} after the "
                    "positional arguments)")
        above = next((p for p in path.parents if p.exists()), None)
        if above is not None and not above.is_dir():
            return f"{option} {target}: {above} is a file, not a folder"
        taken = owner(path)
        if taken is not None:
            return f"{option} {target} would replace {taken}; give another FILE"
        stuck = read_only_above(path)
        if stuck is not None:
            return f"{option} {target}: {stuck} is not writable (read-only or not yours); give another FILE"
    return None


def uses_stdout(json_target: str | None, csv_target: str | None) -> bool:
    """Whether ``--json`` or ``--csv`` writes to stdout (then nothing else may)."""
    return STDOUT in (json_target, csv_target)


class OutputError(Exception):
    """A ``--json`` / ``--csv`` FILE could not be written after all (the disk filled, the folder changed meanwhile);
    the commands exit 2 with its message."""


def emit(text: str, target: str) -> None:
    """``text`` to stdout (:data:`STDOUT`) or to the file ``target`` (missing folders created, saying so); a write
    that fails is an :class:`OutputError` naming the file."""
    if not text.endswith("\n"):
        text += "\n"
    if target == STDOUT:
        sys.stdout.write(text)
        return
    path = Path(target)
    missing = [p for p in path.parents if not p.exists()]
    try:
        if missing:
            path.parent.mkdir(parents=True, exist_ok=True)
            print(f"moestab: created the folder {missing[-1]} for {target}", file=sys.stderr)  # never silently
        path.write_text(text)
    except OSError as exc:
        raise OutputError(f"cannot write {target}: {exc.strerror or exc}") from exc
