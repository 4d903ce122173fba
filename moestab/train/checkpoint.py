"""Checkpoints: a Hugging Face folder per step plus the optimizer state needed by --resume.

Where they go, their temporaries and atomic renames, and when one is complete are the run folder's
(:class:`moestab.records.RunFolder`); this module serialises what only the trainer has: the weights and the
training state.
"""

from __future__ import annotations

import io
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from moestab.models import write_policy
from moestab.records import RunFolder


def save_checkpoint(
    folder: RunFolder, step: int, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
    optimizer_state: dict, loop_state: dict | None = None, weights: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write the step's Hugging Face folder and its training state (``optimizer_state``:
    ``moestab.train.distributed.optimizer_state``; ``loop_state``: what the loop carries across steps, e.g. SRPO's
    solved prompts), both atomically. ``weights``: the full state dict of a sharded ``model`` (default: its own)."""
    # Serialised in memory and written with plain file I/O: torch.save on a full disk raises a bare
    # RuntimeError ("unexpected pos ..."), plain I/O an OSError(ENOSPC) that names the file.
    buffer = io.BytesIO()
    torch.save({"step": step, "optimizer": optimizer_state, "loop": loop_state or {}}, buffer)
    weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return folder.save_checkpoint(step, buffer.getbuffer(),
                                  lambda path: write_policy(model, tokenizer, path, state_dict=weights),
                                  weights_bytes=weights_bytes)


def read_training_state(folder: RunFolder, step: int) -> tuple[dict, dict]:
    """The optimizer state of step ``step`` and the loop state saved with it (``{}`` if none)."""
    state = torch.load(folder.state_file(step), map_location="cpu", weights_only=True)
    return state["optimizer"], state.get("loop", {})
