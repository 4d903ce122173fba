"""The light core and its extras: pyproject's extras are what moestab.extras says, the core never imports an extra's
module, and a command whose extra is missing says what to install before it does anything."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from moestab import extras
from moestab.cli import main

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(requirements: list[str]) -> set[str]:
    return {Requirement(r).name for r in requirements}


def test_extras_install_the_modules_moestab_extras_names():
    declared = PROJECT["optional-dependencies"]
    for extra, modules in extras.EXTRAS.items():
        assert _names(declared[extra]) == set(modules), extra
    # [all] is every user-facing extra (vllm needs Linux with a CUDA GPU); [dev] holds [all].
    assert declared["all"] == [f"moestab[{','.join(e for e in extras.EXTRAS if e != 'vllm')}]"]
    assert "moestab[all]" in declared["dev"]


def test_the_core_declares_no_screen_package():
    core = _names(PROJECT["dependencies"])
    assert core == {"torch", "transformers", "pandas", "pyarrow", "pyyaml", "tqdm"}
    assert not core & {m for modules in extras.EXTRAS.values() for m in modules}


def test_the_core_imports_no_extra():
    # What a trainer's environment imports: recording, replay, records, analysis, importers, diagnostics, the verl
    # recipe, the trainer and the CLI. (moestab.integrations.trl imports TRL, which imports wandb and trackio itself.)
    code = ("import sys\n"
            "import moestab.routing, moestab.run_folder, moestab.analysis, moestab.recording.diagnostics\n"
            "import moestab.routes_in, moestab.integrations.verl, moestab.train.loop, moestab.cli\n"
            "print(sorted(m for m in ('matplotlib', 'streamlit', 'jupytext', 'nbclient', 'wandb', 'tensorboard', "
            "'trackio', 'trl') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_require_names_the_missing_module_and_the_install_line(monkeypatch):
    monkeypatch.setitem(extras.EXTRAS, "plots", ("json",))
    extras.require("plots", "x")  # every module importable: no error
    monkeypatch.setitem(extras.EXTRAS, "plots", ("json", "no_such_module_moestab"))
    assert extras.missing_modules("plots") == ["no_such_module_moestab"]
    with pytest.raises(extras.MissingExtraError) as caught:
        extras.require("plots", "moestab analyze --plots")
    assert str(caught.value).startswith("moestab analyze --plots needs no_such_module_moestab, which `pip install "
                                        "moestab` leaves out: pip install 'moestab[plots]'")
    with pytest.raises(ValueError, match="unknown extra 'plot'; valid: plots, dashboard"):
        extras.missing_modules("plot")


@pytest.fixture
def without(monkeypatch):
    """``without(extra)``: that extra's modules count as not installed."""
    return lambda extra: monkeypatch.setitem(extras.EXTRAS, extra, ("no_such_module_moestab",))


def test_dashboard_without_its_extra_says_what_to_install(without, capsys, tmp_path):
    without("dashboard")
    assert main(["dashboard", str(tmp_path), "--port", "1"]) == 2  # refused before the port is even looked at
    err = capsys.readouterr().err
    assert err.startswith("moestab dashboard: error: moestab dashboard needs no_such_module_moestab")
    assert "pip install 'moestab[dashboard]'" in err and "serving" not in err


def test_analyze_plots_without_its_extra_reads_and_writes_nothing(without, capsys, tmp_path):
    without("plots")
    figures = tmp_path / "figs"
    assert main(["analyze", str(tmp_path / "no-run"), "--plots", str(figures)]) == 2
    err = capsys.readouterr().err
    assert "moestab analyze: error: moestab analyze --plots needs no_such_module_moestab" in err
    assert "pip install 'moestab[plots]'" in err and "no readable run" not in err
    assert not figures.exists()


def test_probe_plots_without_its_extra_runs_nothing(without, capsys, tmp_path):
    without("plots")
    figures = tmp_path / "figs"
    assert main(["probe", "depth", "--layers", "2", "--plots", str(figures), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "moestab probe: error: moestab probe --plots needs no_such_module_moestab" in err
    assert "pip install 'moestab[plots]'" in err
    assert not figures.exists()
