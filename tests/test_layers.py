"""The layers of docs/engineering.md ("The layers"), checked on the import graph of every module in moestab/.

A package may import packages of a lower layer only (and itself). The table below is the picture in
docs/engineering.md; a test keeps the two in step, so a new package must be placed in both.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "moestab"

LAYERS: dict[str, int] = {
    # 0: foundations (``moestab/__init__.py`` holds only the version)
    "__init__": 0, "text": 0, "charset": 0, "extras": 0,
    # 1: typed configs and their shared rules; the run folder's layout, writers and readers
    "configs": 1, "records": 1,
    # 2: the metric definitions (numpy) and the table of metrics.jsonl keys
    "metrics": 2,
    # 3: hooks, tasks, loss math (torch)
    "routing": 3, "tasks": 3, "rl": 3,
    # 4: models built on the hooks
    "models": 4,
    # 5: what every trainer records, and what every reader computes
    "recording": 5, "analysis": 5,
    # 6: trainers
    "train": 6, "integrations": 6,
    # 7: built on the trainer
    "probes": 7, "experiments": 7,
    # 8: launchers
    "commands": 8, "dashboard": 8, "cli": 8, "__main__": 9,
}
"""Package (or top-level module) of moestab -> its layer."""


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


def _violations(layers: dict[str, int]) -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = _package(path)
        for imported in sorted(_imported_packages(path) - {own}):
            if imported not in layers:
                out.append(f"{path.relative_to(ROOT)} imports moestab.{imported}, which has no layer")
            elif layers[imported] >= layers[own]:
                out.append(f"{path.relative_to(ROOT)} (layer {layers[own]}) imports moestab.{imported} "
                           f"(layer {layers[imported]})")
    return out


def test_every_package_has_a_layer():
    packages = {_package(p) for p in PACKAGE.rglob("*.py")}
    assert packages - LAYERS.keys() == set(), "place the new package in LAYERS and in docs/engineering.md"


def test_layers_import_downwards_only():
    assert _violations(LAYERS) == []


def test_the_check_can_fail():
    # train imports recording; with recording put above train the same graph is refused.
    assert any("imports moestab.recording" in v for v in _violations({**LAYERS, "recording": 7}))


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
