"""Probe suites: fixed lists of texts a probe runs every checkpoint on, with a manifest that identifies them.

A suite is named by a spec:

- ``general``: general English-like text every machine has, built deterministically from the docstrings of
  Python's standard library (no downloads), cut into chunks of at most ``chunk`` characters and kept to the
  characters of moestab's embedded tokenizer, so any tokenizer reads it;
- ``task:SPEC``: the held-out set of a task (``task:arithmetic``, ``task:sort:length=32``), prompt + answer;
- a path to a JSON-lines file of ``{"text": ...}`` objects (a user's own texts).

The manifest (``name``, ``source``, ``count``, ``sha256`` of the texts) is saved with every probe result, so two
results computed on different texts are told apart.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import dataclass
from pathlib import Path

from moestab.charset import CHARSET
from moestab.probes.errors import ProbeError
from moestab.text import UserFileError, clip, read_user_text, shown

GENERAL = "general"
TASK_PREFIX = "task:"
SUITE_FORMS = (f"'{GENERAL}', '{TASK_PREFIX}SPEC' (e.g. 'task:arithmetic'), or a .jsonl file of "
               '{"text": ...} lines')
# Standard-library objects whose docstrings make the general suite: present in every CPython 3.10+.
_GENERAL_SOURCES = ("str", "dict", "list", "set", "tuple", "int", "float", "bytes", "range", "zip", "map",
                    "filter", "sorted", "open", "print", "isinstance", "json", "re", "random", "textwrap",
                    "functools", "itertools", "collections", "statistics", "fractions", "decimal", "pathlib",
                    "argparse", "string", "heapq", "bisect", "difflib", "shlex", "csv", "calendar")


@dataclass(frozen=True)
class ProbeSuite:
    """Texts a probe runs on, and where they came from."""

    name: str
    source: str
    texts: tuple[str, ...]

    @property
    def sha256(self) -> str:
        blob = json.dumps(list(self.texts), ensure_ascii=False).encode()
        return hashlib.sha256(blob).hexdigest()

    def manifest(self) -> dict[str, object]:
        return {"name": self.name, "source": self.source, "count": len(self.texts), "sha256": self.sha256}

    def head(self, count: int | None) -> ProbeSuite:
        """The first ``count`` texts (all when ``None``)."""
        if count is None or count >= len(self.texts):
            return self
        if count < 1:
            raise ProbeError(f"count must be >= 1, got {count}")
        return ProbeSuite(self.name, f"{self.source} (first {count})", self.texts[:count])


def general_suite(count: int = 256, chunk: int = 160) -> ProbeSuite:
    """``count`` chunks of standard-library docstrings (see the module docstring); deterministic per Python."""
    import builtins
    import importlib

    allowed = set(CHARSET) - {"\n"}
    texts: list[str] = []
    for name in _GENERAL_SOURCES:  # a module contributes its own docstring and its public members', by name
        obj = getattr(builtins, name, None) or importlib.import_module(name)
        members = [obj] + [getattr(obj, m) for m in sorted(dir(obj)) if not m.startswith("_")] \
            if inspect.ismodule(obj) else [obj]
        for member in members:
            doc = " ".join((inspect.getdoc(member) or "").split())  # one line, single spaces
            doc = "".join(c for c in doc if c in allowed)
            for start in range(0, len(doc) - chunk // 2, chunk):
                piece = doc[start : start + chunk].strip()
                if len(piece) >= chunk // 2:
                    texts.append(piece)
    if len(texts) < count:
        raise ProbeError(f"the general suite has {len(texts)} texts on this Python, fewer than {count} asked for")
    return ProbeSuite(GENERAL, "Python standard-library docstrings", tuple(texts[:count]))


def task_suite(spec: str, count: int = 256) -> ProbeSuite:
    """The held-out set (seed 0) of task ``spec``, each text ``prompt + answer``."""
    from moestab.tasks import task_from_spec

    task = task_from_spec(spec)
    texts = tuple(ex.prompt + ex.answer for ex in task.eval_set(count, seed=0))
    if not texts:
        raise ProbeError(f"task {spec!r} has no held-out examples")
    return ProbeSuite(f"{TASK_PREFIX}{task.spec}", f"held-out set of task {task.spec} (seed 0)", texts)


def jsonl_suite(path: str | Path) -> ProbeSuite:
    """Texts of a JSON-lines file, one ``{"text": "..."}`` object per line (blank lines skipped)."""
    path = Path(path)
    try:
        text = read_user_text(path, what="suite file", expected=f"valid suites: {SUITE_FORMS}")
    except UserFileError as exc:
        raise ProbeError(str(exc)) from exc
    texts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ProbeError(f"{path}:{number}: not valid JSON ({clip(exc.msg)}); each line must be "
                             '{"text": "..."}') from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str) or not row["text"]:
            raise ProbeError(f"{path}:{number}: each line must be an object with a non-empty string 'text', "
                             f"got {shown(line)}")
        texts.append(row["text"])
    if not texts:
        raise ProbeError(f"{path}: the suite is empty; it needs at least one {{\"text\": ...}} line")
    return ProbeSuite(path.stem, str(path), tuple(texts))


def write_suites(suites: list[ProbeSuite], folder: str | Path) -> Path:
    """Write each suite as ``folder/<file>.jsonl`` (``{"text": ...}`` lines) and their manifests, with the file
    name of each, to ``folder/manifest.json``; returns the manifest's path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for suite in suites:
        file = suite.name.replace(TASK_PREFIX, "task-").replace(":", "-").replace("=", "-").replace(",", "-") + ".jsonl"
        lines = [json.dumps({"text": text}, ensure_ascii=False) for text in suite.texts]
        (folder / file).write_text("\n".join(lines) + "\n", encoding="utf-8")
        entries.append({**suite.manifest(), "file": file})
    manifest = folder / "manifest.json"
    manifest.write_text(json.dumps(entries, indent=2) + "\n")
    return manifest


def load_suite(spec: str, count: int | None = None) -> ProbeSuite:
    """The suite ``spec`` names (see the module docstring), cut to its first ``count`` texts."""
    if not spec.strip():
        raise ProbeError(f"--suite is empty; valid suites: {SUITE_FORMS}")
    if spec == GENERAL:
        return general_suite(count or 256)
    if spec.startswith(TASK_PREFIX):
        try:
            return task_suite(spec[len(TASK_PREFIX):], count or 256)
        except ValueError as exc:
            raise ProbeError(f"suite {shown(spec)}: {exc}") from None
    if spec.endswith(".jsonl") or Path(spec).exists():
        return jsonl_suite(spec).head(count)
    raise ProbeError(f"unknown suite {shown(spec)}; valid suites: {SUITE_FORMS}")
