"""Execute a notebook kept as a jupytext percent-format ``.py`` file, at a named size, papermill-style.

The notebook's cell tagged ``parameters`` sets ``SIZE = "full"`` (and may set more); the executor inserts a cell
right after it that sets ``SIZE`` to the size asked for, runs the notebook top to bottom with nbclient in
``cwd``, and returns it (outputs included). Any cell error raises ``nbclient``'s ``CellExecutionError``.

A committed notebook is a document: :func:`output_noise` names every output line that shows an absolute path of the
machine it ran on, a progress bar or a warning (scripts/run_notebooks.py refuses such a notebook, and a test checks
the committed ones).
"""

from __future__ import annotations

import re
import sys
import tempfile
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


_NOT_A_PATH = r"(?<![\w.~/-])"  # an absolute path starts the line or follows a space, quote or bracket
_ABSOLUTE = re.compile(_NOT_A_PATH + r"/(?:home|root|Users|tmp|private|var/folders|opt|usr|mnt|srv|work)(?:/|\b)")
_PROGRESS = re.compile(r"\d+%\|"  # tqdm's bar: " 40%|####      | 2/5 [00:01<00:02, 1.9it/s]"
                       r"|\[\d\d:\d\d<|\d ?(?:it/s|s/it|B/s)\]")
_WARNING = re.compile(r"\b[A-Z]\w*Warning\b:")  # "UserWarning: ...", "TqdmWarning: ..."


def _machine_paths() -> list[str]:
    """This machine's absolute folders an output could show: the repository, the home folder, the interpreter's
    prefix, the temporary folder."""
    folders = {Path(__file__).resolve().parents[2], Path.home(), Path(sys.prefix), Path(tempfile.gettempdir())}
    return sorted({str(f) for f in folders if str(f) != "/"}, key=len, reverse=True)


def _output_texts(output) -> list[str]:
    """The text an output shows: a stream's, an error's traceback, every non-image MIME type of a display."""
    if output.get("output_type") == "stream":
        return [output.get("text", "")]
    if output.get("output_type") == "error":
        return list(output.get("traceback", []))
    data = output.get("data", {})
    return [value if isinstance(value, str) else str(value) for mime, value in data.items()
            if not mime.startswith("image/")]


def output_noise(notebook) -> list[str]:
    """``"cell N: LINE"`` for every output line of ``notebook`` (an ``nbformat`` node) that a reader should not see:
    an absolute path (this machine's folders, or a usual root such as /home or /tmp), a progress bar, a warning."""
    machine = re.compile("|".join(_NOT_A_PATH + re.escape(folder) + r"(?![\w.-])" for folder in _machine_paths()))
    patterns = (machine, _ABSOLUTE, _PROGRESS, _WARNING)
    found = []
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            for text in _output_texts(output):
                for line in re.split(r"[\r\n]", text):  # a progress bar redraws itself after \r
                    if any(pattern.search(line) for pattern in patterns):
                        found.append(f"cell {index}: {line.strip()[:160]}")
    return found
