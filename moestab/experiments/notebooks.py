"""Execute a notebook kept as a jupytext percent-format ``.py`` file, at a named size, papermill-style.

The notebook's cell tagged ``parameters`` sets ``SIZE = "full"`` (and may set more); the executor inserts a cell
right after it that sets ``SIZE`` to the size asked for, runs the notebook top to bottom with nbclient in
``cwd``, and returns it (outputs included). Any cell error raises ``nbclient``'s ``CellExecutionError``.
"""

from __future__ import annotations

from pathlib import Path

SIZES = ("smoke", "full")


def execute_notebook(source: str | Path, size: str, *, cwd: str | Path, timeout: int | None = None):
    """The executed notebook (an ``nbformat`` node) of ``source`` at ``size``.

    ``timeout``: seconds one cell may run (None: no limit; a full-size grid cell trains dozens of runs).
    """
    import jupytext
    import nbformat
    from nbclient import NotebookClient

    if size not in SIZES:
        raise ValueError(f"size {size!r} is not valid; valid: {', '.join(SIZES)}")
    notebook = jupytext.read(source)
    tagged = [i for i, cell in enumerate(notebook.cells) if "parameters" in cell.metadata.get("tags", [])]
    if len(tagged) != 1:
        raise ValueError(f"{source}: needs exactly one cell tagged 'parameters', found {len(tagged)}")
    injected = nbformat.v4.new_code_cell(f"SIZE = {size!r}", metadata={"tags": ["injected-parameters"]})
    notebook.cells.insert(tagged[0] + 1, injected)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    resources = {"metadata": {"path": str(cwd)}}  # the kernel's working directory
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3", resources=resources)
    client.execute()
    return notebook
