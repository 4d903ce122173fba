"""A synthetic run folder written with pyarrow exactly as docs/run-format.md describes.

The fixture keeps the raw arrays it wrote, so that tests can recompute every analysis result
independently (plain Python sets and loops) and compare.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.support.runs import FakeRun, write_run


@pytest.fixture
def fake_run(tmp_path: Path) -> FakeRun:
    return write_run(tmp_path)


@pytest.fixture
def cli_main(monkeypatch: pytest.MonkeyPatch):
    """``moestab.cli.main`` with only the subcommands whose modules exist (others are being written)."""
    from moestab import cli

    available = {
        name: module
        for name, module in cli.SUBCOMMANDS.items()
        if importlib.util.find_spec(f"moestab.commands.{module}") is not None
    }
    monkeypatch.setattr(cli, "SUBCOMMANDS", available)
    return cli.main
