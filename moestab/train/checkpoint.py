"""Checkpoints: a Hugging Face folder per step plus the optimizer state needed by --resume.

A checkpoint of step ``s`` is complete when both ``checkpoints/step_s/`` and ``state/step_s.pt``
exist; both are written to temporary names and renamed, so a kill never leaves a partial one.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from moestab.models import save_policy
from moestab.records import schema


def state_file(run_dir: Path, step: int) -> Path:
    return run_dir / schema.state_file(step)


def save_checkpoint(
    run_dir: Path, step: int, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
    optimizer_state: dict, loop_state: dict | None = None, weights: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write the step's Hugging Face folder and its training state (``optimizer_state``:
    ``moestab.train.distributed.optimizer_state``; ``loop_state``: what the loop carries across steps, e.g. SRPO's
    solved prompts), both atomically. ``weights``: the full state dict of a sharded ``model`` (default: its own)."""
    state = state_file(run_dir, step)
    tmp = state.with_name(f".{state.name}.tmp")
    # Serialised in memory and written with plain file I/O: torch.save on a full disk raises a bare
    # RuntimeError ("unexpected pos ..."), plain I/O an OSError(ENOSPC) that names the file.
    buffer = io.BytesIO()
    torch.save({"step": step, "optimizer": optimizer_state, "loop": loop_state or {}}, buffer)
    try:
        with open(tmp, "wb") as f:
            f.write(buffer.getbuffer())
        os.replace(tmp, state)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(tmp)) from exc
    folder = run_dir / schema.checkpoint_dir(step)
    try:
        return save_policy(model, tokenizer, folder, state_dict=weights)
    except OSError:
        raise
    except Exception as exc:  # safetensors' writer reports a full disk in its own exception types
        needed = sum(p.numel() * p.element_size() for p in model.parameters())
        if shutil.disk_usage(run_dir).free < needed:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder)) from exc
        raise


def complete_checkpoints(run_dir: Path) -> list[int]:
    """Steps with a complete checkpoint, ascending."""
    folder = run_dir / schema.CHECKPOINTS_DIR
    if not folder.is_dir():
        return []
    steps = []
    for entry in folder.iterdir():
        step = schema.parse_step_name(entry.name)
        if step is not None and entry.is_dir() and state_file(run_dir, step).is_file():
            steps.append(step)
    return sorted(steps)


def read_training_state(run_dir: Path, step: int) -> tuple[dict, dict]:
    """The optimizer state of step ``step`` and the loop state saved with it (``{}`` if none)."""
    state = torch.load(state_file(run_dir, step), map_location="cpu", weights_only=True)
    return state["optimizer"], state.get("loop", {})
