"""The layers of docs/engineering.md ("The layers"), checked on the import graph of every module in moestab/; and the
tests' own layering: a test imports shared helpers from tests/support only, never another test module.

A package may import packages of a lower layer only (and itself), and never a lower package it is kept apart from
(``APART``). The table below is the picture in docs/engineering.md; a test keeps the two in step, so a new package
must be placed in both.
"""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "moestab"

LAYERS: dict[str, int] = {
    # 0: foundations (``moestab/__init__.py`` holds only the version)
    "__init__": 0, "text": 0, "charset": 0, "extras": 0,
    # 1: typed configs and their shared rules; the run folder's layout, writers and readers
    "configs": 1, "run_folder": 1,
    # 2: the metric definitions (numpy) and the table of metrics.jsonl keys
    "metrics": 2,
    # 3: hooks, tasks, loss math (torch)
    "routing": 3, "tasks": 3, "rl": 3,
    # 4: models built on the hooks
    "models": 4,
    # 5: what every trainer records, the routes engines and frameworks hand in, and what every reader computes
    "recording": 5, "routes_in": 5, "analysis": 5,
    # 6: trainers
    "train": 6, "integrations": 6,
    # 7: built on the trainer
    "probes": 7, "experiments": 7,
    # 8: launchers
    "commands": 8, "dashboard": 8, "cli": 8, "__main__": 9,
}
"""Package (or top-level module) of moestab -> its layer."""

APART = {("train", "analysis")}
"""(importer, imported) pairs refused although the imported package lies lower: the trainer computes its metrics with
moestab.metrics, as the analyzers do, never through the analyzers."""

NO_TORCH = ("moestab.analysis.summary, moestab.analysis.attribution, moestab.analysis.plots",
            "moestab.metrics.routes, moestab.metrics.mismatch, moestab.metrics.ratios")
"""Modules of the layers the picture draws without torch (metrics/, analysis/): the dashboard stays light."""


def _package(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def _imported_packages(path: Path) -> set[str]:
    """The moestab packages ``path`` imports (``from moestab import rl`` counts as ``rl``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] != "moestab":
                continue
            if len(parts) > 1:
                out.add(parts[1])
            else:  # a subpackage, or a name of moestab/__init__.py
                out.update(a.name if (PACKAGE / a.name).exists() or (PACKAGE / f"{a.name}.py").exists()
                           else "__init__" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("moestab."))
    return out


def _violations(layers: dict[str, int], apart: set[tuple[str, str]] = APART) -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = _package(path)
        for imported in sorted(_imported_packages(path) - {own}):
            if imported not in layers:
                out.append(f"{path.relative_to(ROOT)} imports moestab.{imported}, which has no layer")
            elif layers[imported] >= layers[own]:
                out.append(f"{path.relative_to(ROOT)} (layer {layers[own]}) imports moestab.{imported} "
                           f"(layer {layers[imported]})")
            elif (own, imported) in apart:
                out.append(f"{path.relative_to(ROOT)} imports moestab.{imported}, which {own} is kept apart from")
    return out


def _loads(imports: str, module: str) -> bool:
    """Whether a fresh interpreter holds ``module`` after ``import imports``."""
    code = f"import sys\nimport {imports}\nprint({module!r} in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return out.stdout.split() == ["True"]


def _test_imports_outside_support(source: str) -> list[str]:
    """The imports of ``source`` (a module under tests/) that reach another test module: a relative import, or
    ``tests.X`` with X other than ``support``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            out.append("." * node.level + (node.module or ""))
        names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                 else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        out += [n for n in names if n.split(".")[0] == "tests" and n.split(".")[:2] != ["tests", "support"]]
    return out


def test_every_package_has_a_layer():
    packages = {_package(p) for p in PACKAGE.rglob("*.py")}
    assert packages - LAYERS.keys() == set(), "place the new package in LAYERS and in docs/engineering.md"


def test_layers_import_downwards_only():
    assert _violations(LAYERS) == []
    for imports in NO_TORCH:  # what the modules import when run, not only their own import lines
        assert not _loads(imports, "torch"), imports


def test_the_check_can_fail():
    # train imports recording; with recording put above train the same graph is refused, and so it is with train
    # kept apart from recording; importing the trainer loads torch.
    assert any("imports moestab.recording" in v for v in _violations({**LAYERS, "recording": 7}))
    assert any("kept apart" in v for v in _violations(LAYERS, {("train", "recording")}))
    assert _loads("moestab.train.loop", "torch")


def test_tests_share_helpers_through_tests_support_only():
    # Helpers shared between tests live in tests/support; a test module never imports another one (its fixtures reach
    # it through conftest.py, which pytest loads, never an import).
    found = {str(p.relative_to(ROOT)): bad for p in sorted((ROOT / "tests").rglob("*.py"))
             if (bad := _test_imports_outside_support(p.read_text()))}
    assert found == {}
    imports = "from .helpers import a\nimport tests.train.test_records\nfrom tests.support.train import TASK\n"
    assert _test_imports_outside_support(imports) == [".helpers", "tests.train.test_records"]  # the check can fail


def test_the_picture_in_the_docs_matches_the_table():
    text = (ROOT / "docs" / "engineering.md").read_text()
    picture = text.split("## The layers", 1)[1].split("```", 2)[1]
    drawn: dict[str, int] = {}
    for line in picture.splitlines():
        words = line.split()
        if not words or not words[0].isdigit():
            continue
        for word in words[1:]:  # the folders column: the words ending in "/" or ".py" after the layer
            if not word.endswith(("/", ".py")):
                break
            if word.endswith("/"):
                drawn[word.removesuffix("/")] = int(words[0])
    packages = {name: layer for name, layer in LAYERS.items() if (PACKAGE / name).is_dir()}
    assert drawn == packages


def _module_imports(path: Path) -> set[str]:
    """The moestab modules ``path`` imports by name (``from moestab.a.b import c``: ``moestab.a.b``, and
    ``moestab.a.b.c`` when that is a module), at any place in the file (``TYPE_CHECKING`` blocks and functions too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("moestab"):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("moestab"))
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph`` (module -> modules it imports), each once, from its smallest module."""
    found: set[tuple[str, ...]] = set()

    def walk(path: list[str]) -> None:
        for nxt in sorted(graph.get(path[-1], ())):
            if nxt == path[0]:
                at = path.index(min(path))
                found.add(tuple(path[at:] + path[:at]))
            elif nxt not in path and nxt > path[0]:
                walk([*path, nxt])

    for start in sorted(graph):
        walk([start])
    return [list(c) for c in sorted(found)]


def test_no_module_imports_itself_round_a_circle():
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
               for p in PACKAGE.rglob("*.py")}
    graph = {name: {m for m in _module_imports(path) if m in modules and m != name} for name, path in modules.items()}
    package_inits = {name for name, path in modules.items() if path.name == "__init__.py"}
    # A package's __init__ re-exporting its modules is not a circle of the code's own dependencies.
    graph = {name: deps - package_inits for name, deps in graph.items() if name not in package_inits}
    assert _cycles(graph) == []
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check can fail


def test_a_package_docstring_listing_its_modules_names_them_all():
    """A package whose docstring lists its modules (``Modules:``) names every one of them."""
    out = {}
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        if "Modules:" not in doc:
            continue
        listed = doc.split("Modules:", 1)[1]
        missing = [p.stem for p in sorted(init.parent.glob("*.py"))
                   if p.stem != "__init__" and f"``{p.stem}``" not in listed]
        if missing:
            out[init.parent.name] = missing
    assert out == {}
