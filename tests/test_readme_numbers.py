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


# Figures README's prose quotes that are not measured here: the papers' (R3's k3 figures) and identifiers.
NOT_MEASURED = {"7.5e-4": "R3 paper, MoE with R3", "2606.00395": "arXiv id of PR²", "1e-10": "a test's tolerance"}


def test_every_figure_in_readmes_prose_is_in_a_committed_output(numbers):
    """Beyond the marked tables: each decimal, percent or exponent figure README's prose quotes appears in a committed
    output (docs/, docs/readme_numbers/: benchmarks, versions, findings, the tables' outputs) or is named in
    :data:`NOT_MEASURED`, so that a number typed into README by hand, measured nowhere, fails here."""
    import re

    prose, in_code = [], False
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.strip().startswith("```"):
            in_code = not in_code
        elif not in_code and not line.strip().startswith("|"):
            prose.append(line)
    figures = set(re.findall(r"(?<![\w.])(\d+(?:\.\d+)?(?:e-?\d+)?%?)(?!\w)", "\n".join(prose)))
    figures = {f for f in figures if "." in f or "%" in f or "e" in f}
    outputs = "\n".join(p.read_text() for p in (ROOT / "docs").rglob("*") if p.suffix in (".md", ".csv"))
    unsourced = sorted(f for f in figures if f not in outputs and f not in NOT_MEASURED)
    assert unsourced == [], "README quotes figures no committed output holds"
    assert len(figures) > 50  # the check reads README's prose, not nothing
