"""Project wiring: README's commands, CI script, console script."""

import re
from pathlib import Path

from moestab.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_ci_runs_the_readme_test_command():
    test_command = next(c for c in readme_commands() if "pytest" in c)
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci_lines


def test_readme_main_command_is_the_default_training_job():
    assert "bash scripts/setup.sh && .venv/bin/moestab train --routing-replay off" in readme_commands()


def test_cli_lists_its_subcommands():
    help_text = build_parser().format_help()
    for name in ("train", "analyze"):
        assert name in help_text
