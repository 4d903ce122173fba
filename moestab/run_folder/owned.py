"""Whose file a path is: a run's (its run.json, metrics.jsonl, tables, checkpoints) or a model folder's (a checkpoint's
config.json, weights, tokenizer). Output files (``--json FILE``, ``--csv FILE``) never replace one of them: a typo or
a shell completion must not turn ``moestab analyze RUN --json RUN/metrics.jsonl`` into the loss of a run."""

from __future__ import annotations

from pathlib import Path

from moestab.run_folder import schema

MODEL_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
"""A folder holding ``config.json`` and one of the others is a model folder (a checkpoint, a Hugging Face folder)."""


def owner(path: str | Path) -> str | None:
    """What ``path`` belongs to, in words ("run runs/a's metrics.jsonl", "checkpoint X's config.json"), or None when
    writing it would replace nothing of a run's or a model folder's. A link is judged by its target too (a write
    follows it)."""
    path = Path(path)
    target = path.resolve()
    return _owner(path.absolute()) or (_owner(target) if target != path.absolute() else None)


def _owner(path: Path) -> str | None:
    for folder in path.parents:
        if (folder / schema.RUN_JSON).is_file():
            first = path.relative_to(folder).parts[0]
            if first in (*schema.RUN_CONTENTS, schema.LOCK_FILE):
                return f"run {folder}'s {path.relative_to(folder)}"
            return None  # a name of the user's beside the run's own files
    if path.exists() and _is_model_folder(path.parent):
        return f"model folder {path.parent}'s {path.name}"
    return None


def _is_model_folder(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any((folder / name).exists() for name in MODEL_FILES[1:])
