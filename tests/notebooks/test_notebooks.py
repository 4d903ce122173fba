"""Every notebook runs top to bottom at smoke size (what CI checks); the executor's parameter handling."""

from pathlib import Path

import pytest

from moestab.experiments.notebooks import execute_notebook

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("source", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_at_smoke_size(source, tmp_path, monkeypatch):
    monkeypatch.setenv("MOESTAB_CACHE", str(tmp_path / "cache"))  # the kernel inherits it: nothing shared
    notebook = execute_notebook(source, "smoke", cwd=tmp_path, timeout=600)  # raises on any cell error
    injected = [c for c in notebook.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert [c.source for c in injected] == ["SIZE = 'smoke'"]
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code)  # every cell ran, top to bottom


def test_every_notebook_is_paired_and_committed_executed():
    assert NOTEBOOKS, "no notebooks"
    for source in NOTEBOOKS:
        executed = source.with_suffix(".ipynb")
        assert executed.is_file(), f"{executed.name} missing: run scripts/run_notebooks.py"
        import nbformat

        cells = nbformat.read(executed, as_version=4).cells
        assert any(c.get("outputs") for c in cells if c.cell_type == "code")  # committed with its outputs
        assert any("injected-parameters" in c.metadata.get("tags", []) for c in cells)


def test_a_notebook_without_a_parameters_cell_is_refused(tmp_path):
    source = tmp_path / "nb.py"
    source.write_text("# %%\nx = 1\n")
    with pytest.raises(ValueError, match="needs exactly one cell tagged 'parameters', found 0"):
        execute_notebook(source, "smoke", cwd=tmp_path)
    with pytest.raises(ValueError, match="size 'huge' is not valid; valid: smoke, full"):
        execute_notebook(source, "huge", cwd=tmp_path)
