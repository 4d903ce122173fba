"""Start-up: ``moestab --help``, ``--version`` and ``moestab COMMAND --help`` load no torch, transformers or pandas;
and the library's ``logging`` messages shown by the CLI.

A structural check (which modules a fresh interpreter holds afterwards), not a timing: the times are
bench/bench_startup.py's, in docs/benchmarks.md.
"""

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from moestab.cli import SUBCOMMANDS, build_parser, chosen_command, notes_on_stderr

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "pandas")


def _heavy_after(statement: str, *argv: str) -> tuple[object, list[str], str]:
    """Run ``statement`` in a fresh interpreter (``sys.argv[1:]`` = ``argv``): its exit status (``SystemExit``'s code,
    or what ``status`` was set to), the HEAVY modules it left loaded, and what it printed."""
    code = (f"import json, sys\nstatus = None\ntry:\n    {statement}\n"
            "except SystemExit as exc:\n    status = exc.code\n"
            f"print(json.dumps([status, [m for m in {HEAVY!r} if m in sys.modules]]))")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    *printed, last = out.stdout.splitlines()
    status, loaded = json.loads(last)
    return status, loaded, "\n".join(printed)


@pytest.mark.parametrize("argv", [["--help"], ["--version"], *[[name, "--help"] for name in SUBCOMMANDS]],
                         ids=" ".join)
def test_help_and_version_load_no_heavy_module(argv):
    status, loaded, printed = _heavy_after("from moestab.cli import main; status = main(sys.argv[1:])", *argv)
    assert status == 0
    assert loaded == []
    assert ("moestab 0." in printed) if argv == ["--version"] else ("usage: moestab" in printed)


def test_the_check_sees_a_heavy_import():
    # The same probe after the trainer's loop is imported reports torch and transformers: the check above can fail.
    _, loaded, _ = _heavy_after("import moestab.train.loop")
    assert {"torch", "transformers"} <= set(loaded)


def test_building_the_full_parser_loads_no_heavy_module():
    # tests/test_readme.py and the docs read every subcommand's flags from build_parser(): that stays light too.
    _, loaded, _ = _heavy_after("from moestab.cli import build_parser; build_parser()")
    assert loaded == []


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_a_subcommand_alone_has_the_flags_of_the_full_parser(name):
    # main() adds only the chosen subcommand's arguments; its help and flags are those of the parser with all of them.
    def subparser(parser):
        return next(a for a in parser._actions if a.choices and name in a.choices).choices[name]

    alone, full = subparser(build_parser(commands=(name,))), subparser(build_parser())
    assert alone.format_help() == full.format_help()
    assert len(alone._actions) > 1  # more than --help: the arguments were added


def test_chosen_command_is_the_first_word_that_is_not_an_option():
    assert chosen_command(["train", "--steps", "3"]) == "train"
    assert chosen_command(["--version"]) is None
    assert chosen_command([]) is None
    assert chosen_command(["-h", "probe", "compare"]) == "probe"


def test_the_cli_shows_library_messages_on_stderr_while_a_command_runs(capsys):
    library = logging.getLogger("moestab.train.loop")  # a library module's logger, as it logs its notes
    with notes_on_stderr():
        library.info("start: eval accuracy 12.5% on 8 held-out examples")
        library.debug("not shown: below INFO")
    library.info("after the command: not the CLI's to show")
    assert capsys.readouterr().err == "moestab: start: eval accuracy 12.5% on 8 held-out examples\n"
    assert logging.getLogger("moestab").handlers == []  # nothing left behind for an in-process caller
