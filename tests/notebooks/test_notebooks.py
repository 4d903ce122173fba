"""Every notebook runs top to bottom at smoke size (what CI checks); the executor's parameter handling; committed
notebooks executed from their sources as they are now, their outputs read as documents (no machine paths, progress
bars or warnings)."""

from pathlib import Path

import nbformat
import pytest

from moestab.experiments.notebooks import execute_notebook, output_noise

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("source", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_at_smoke_size(source, tmp_path, monkeypatch):
    monkeypatch.setenv("MOESTAB_CACHE", str(tmp_path / "cache"))  # the kernel inherits it: nothing shared
    # raises on any cell error; the per-cell limit only catches a hang (notebook 06's grid cell took over 600 s on two
    # cores shared with two training runs and a second test process)
    notebook = execute_notebook(source, "smoke", cwd=tmp_path, timeout=1800)
    injected = [c for c in notebook.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert [c.source for c in injected] == ["SIZE = 'smoke'"]
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code)  # every cell ran, top to bottom
    assert output_noise(notebook) == []  # what run_notebooks.py would refuse to write


def test_every_notebook_is_paired_and_committed_executed():
    assert NOTEBOOKS, "no notebooks"
    for source in NOTEBOOKS:
        executed = source.with_suffix(".ipynb")
        assert executed.is_file(), f"{executed.name} missing: run scripts/run_notebooks.py"
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


@pytest.mark.parametrize("source", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_committed_notebook_was_executed_from_its_source(source):
    """The committed .ipynb holds the .py's cells as they are now (bar the injected size): a source edited after its
    notebook last ran fails here until scripts/run_notebooks.py executes it again."""
    import jupytext

    cells = [c.source for c in jupytext.read(source).cells]
    executed = nbformat.read(source.with_suffix(".ipynb"), as_version=4).cells
    committed = [c.source for c in executed if "injected-parameters" not in c.metadata.get("tags", [])]
    assert committed == cells, f"{source.name} changed since its notebook ran: scripts/run_notebooks.py {source.stem}"


@pytest.mark.parametrize("source", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_outputs_show_no_machine_paths_progress_bars_or_warnings(source):
    notebook = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    assert output_noise(notebook) == []


def test_output_noise_names_paths_progress_bars_and_warnings_and_passes_ordinary_text():
    here = str(Path(__file__).resolve().parent)  # a folder of this machine's checkout, wherever that is
    output = nbformat.v4.new_output
    noisy = nbformat.v4.new_code_cell("x", outputs=[
        output("stream", name="stderr", text="/opt/venv/lib/python3.11/site-packages/tqdm/auto.py:21: TqdmWarning: "
                                             "IProgress not found.\n  from .autonotebook import tqdm\n"),
        output("stream", name="stderr", text="Writing model shards: 100%|##########| 2/2 [00:00<00:00, 5.1it/s]\n"),
        output("stream", name="stdout", text="step 3\rLoading:  40%|####      | 2/5\n"),  # a bar redrawn with \r
        output("execute_result", data={"text/plain": f"PosixPath('{here}/runs/x')"}, execution_count=1),
        output("display_data", data={"text/html": "<td>/home/someone/runs/x</td>", "image/png": "iVBOR/tmp/x"}),
        output("stream", name="stderr", text="a.py:3: UserWarning: careful\n"),
    ])
    clean = nbformat.v4.new_code_cell("y", outputs=[output("stream", name="stdout", text=(
        "routing/old_new/changed 0.5; Var(log s) / |y| = 1.0; runs/notebooks/05/full; 40% of tokens\n"
        "see https://ipywidgets.readthedocs.io/en/stable/user_install.html and docs/findings.md\n"))])
    markdown = nbformat.v4.new_markdown_cell("/home/is/not/an/output")
    notebook = nbformat.v4.new_notebook(cells=[clean, noisy, markdown])
    found = output_noise(notebook)
    assert [line.split(": ", 1)[0] for line in found] == ["cell 1"] * 6
    assert [line.split(": ", 1)[1][:12] for line in found] == [
        "/opt/venv/li", "Writing mode", "Loading:  40", "PosixPath('/", "<td>/home/so", "a.py:3: User"]


def _run_notebooks_script(root: Path):
    """scripts/run_notebooks.py as a module, reading notebooks from ``root``/notebooks."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_notebooks", ROOT / "scripts" / "run_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.ROOT, module.NOTEBOOKS, module.REFUSED = root, root / "notebooks", root / "runs" / "notebooks"
    return module


def test_run_notebooks_writes_a_clean_notebook_and_refuses_a_noisy_one(tmp_path, capsys):
    (tmp_path / "notebooks").mkdir()
    header = '# %% tags=["parameters"]\nSIZE = "full"\n\n# %%\n'
    (tmp_path / "notebooks" / "01_clean.py").write_text(header + 'print("runs/notebooks/01 has 3 runs")\n')
    (tmp_path / "notebooks" / "02_noisy.py").write_text(header + "from pathlib import Path\nprint(Path.cwd())\n")
    assert _run_notebooks_script(tmp_path).main([]) == 1
    assert (tmp_path / "notebooks" / "01_clean.ipynb").is_file()
    assert not (tmp_path / "notebooks" / "02_noisy.ipynb").exists()  # kept aside instead, to look at
    assert (tmp_path / "runs" / "notebooks" / "02_noisy.ipynb").is_file()
    err = capsys.readouterr().err
    assert "02_noisy.py: not written, 1 output line(s)" in err and f"cell 2: {tmp_path}" in err
    assert "refused: 02_noisy.py" in err
