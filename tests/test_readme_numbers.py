"""README's measured tables against the committed outputs of the scripts that print them
(scripts/readme_numbers.py, docs/readme_numbers/)."""

from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def numbers():
    spec = importlib.util.spec_from_file_location("readme_numbers", ROOT / "scripts" / "readme_numbers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_every_marked_table_is_its_output_exactly(numbers):
    readme = (ROOT / "README.md").read_text()
    synced, problems = numbers.synced(readme)
    assert problems == []
    assert synced == readme, "README differs from docs/readme_numbers/: run scripts/readme_numbers.py sync"


def test_every_source_is_quoted_and_its_output_came_from_its_command(numbers):
    quoted = {name for _, _, name, _ in numbers.marks((ROOT / "README.md").read_text())}
    assert quoted == set(numbers.BY_NAME)
    for source in numbers.SOURCES:
        text = numbers.output_path(source.name).read_text()
        assert f"Command: `{shlex.join(source.command())}`" in text, source.name
        assert numbers.tables(text), source.name


def test_a_changed_cell_or_a_wrong_mark_is_caught(numbers, tmp_path, monkeypatch):
    monkeypatch.setattr(numbers, "OUTPUTS", tmp_path)
    tmp_path.joinpath("default_run.md").write_text("intro\n\n| a | b |\n|---|---|\n| x | 1.0% |\n\ntext\n")
    right = "before\n   <!-- numbers: default_run, table 1 -->\n   | a | b |\n   |---|---|\n   | x | 1.0% |\nafter\n"
    assert numbers.synced(right) == (right, [])
    wrong = right.replace("1.0%", "1.1%")
    assert numbers.synced(wrong) == (right, [])  # sync restores the output's table; check sees the difference
    longer = right.replace("| x | 1.0% |\n", "| x | 1.0% |\n   | y | 2 |\n")
    assert numbers.synced(longer)[0] == right  # a row the output lacks is removed
    _, problems = numbers.synced(right.replace("table 1", "table 2"))
    assert problems and "has 1 tables, not a table 2" in problems[0]
    _, problems = numbers.synced(right.replace("default_run", "nonesuch"))
    assert problems and "no source 'nonesuch'" in problems[0]
