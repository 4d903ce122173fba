"""Checkpoints: a Hugging Face folder per step plus the optimizer state needed by --resume.

Where they go, their temporaries and atomic renames, and when one is complete are the run folder's
(:class:`moestab.run_folder.RunFolder`); this module serialises what only the trainer has: the weights and the
training state.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from moestab.models import write_policy
from moestab.run_folder import RunFolder
from moestab.run_folder.errors import RunFileError
from moestab.text import clip
from moestab.train.distributed import load_optimizer
from moestab.train.route_bases import refresh_source

KEEP_STATES = 2
"""Training states a run keeps: its two newest checkpoints' (``--resume`` reads the newest, and the one before when
the newest is damaged). Older checkpoints keep their weights, which the analyses read; a state, the optimizer's
moments, is twice the weights' size."""


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
    path = folder.state_file(step)
    try:  # weights_only: tensors and plain containers only, so a planted pickle runs no code
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:  # torch's own advice (weights_only=False) would run the file's code
        raise RunFileError(path, "holds Python objects other than tensors and plain containers, which a training "
                           "state never does; it was not loaded, and is not the file moestab wrote") from exc
    except (RuntimeError, ValueError, EOFError) as exc:
        raise RunFileError(path, f"cannot be read as a training state ({clip(str(exc).splitlines()[0], 200)}); it "
                           "is not the file moestab wrote") from exc
    if not (isinstance(state, dict) and isinstance(state.get("optimizer"), dict)
            and isinstance(state.get("loop", {}), dict)):
        raise RunFileError(path, "is not a training state (a dict with an 'optimizer' dict); it is not the file "
                           "moestab wrote")
    return state["optimizer"], state.get("loop", {})


def restore_training_state(folder: RunFolder, step: int, model: torch.nn.Module,
                           optimizer: torch.optim.Optimizer) -> dict:
    """Load step ``step``'s optimizer state into ``optimizer`` and return its loop state; a state that does not fit
    this model's optimizer is a :class:`RunFileError` naming the file."""
    optimizer_saved, loop_state = read_training_state(folder, step)
    try:
        load_optimizer(model, optimizer, optimizer_saved)
    except (KeyError, ValueError, RuntimeError, TypeError, IndexError) as exc:
        raise RunFileError(folder.state_file(step), f"does not fit this run's optimizer ({type(exc).__name__}: "
                           f"{clip(str(exc), 200)}); it is not the file moestab wrote") from exc
    return loop_state


def superseded_checkpoints(saved: Sequence[int], complete: Sequence[int], *, save_every: int, steps: int,
                           refresh_every: int = 0, since: int = 0,
                           keep_states: int = KEEP_STATES) -> tuple[list[int], list[int]]:
    """What a run no longer needs once its newest checkpoint is written: ``(whole, states)``, the steps whose
    checkpoint goes whole and those whose training state alone goes.

    ``saved``: the steps with a checkpoint's weights; ``complete``: those with its training state too. All but the
    newest ``keep_states`` complete ones lose their state. A checkpoint written only because ``--base-refresh-every``
    refreshed the route copy (a multiple of ``refresh_every`` that is neither a ``save_every`` step nor the last,
    ``steps``) goes whole once no kept state resumes its copy from it: with K = 1 a run would otherwise keep a
    checkpoint for every step. Only steps after ``since`` are so classified: ``save_every`` and ``steps`` may change
    on ``--resume``, and a checkpoint saved before by the other settings is kept whole rather than judged by these."""
    kept = sorted(complete)[len(complete) - keep_states:] if keep_states > 0 else []
    needed = {refresh_source(step, refresh_every) for step in kept} if refresh_every else set()

    def refresh_only(step: int) -> bool:
        return (bool(refresh_every) and step > since and step % refresh_every == 0 and step % save_every != 0
                and step != steps)

    whole = [step for step in sorted(saved) if refresh_only(step) and step not in needed and step not in kept]
    states = [step for step in sorted(complete) if step not in kept and step not in whole]
    return whole, states


def prune_checkpoints(folder: RunFolder, *, save_every: int, steps: int, refresh_every: int = 0,
                      since: int = 0) -> tuple[list[int], list[int]]:
    """Delete what :func:`superseded_checkpoints` names in ``folder``; returns it, ``(whole, states)``."""
    whole, states = superseded_checkpoints(folder.saved_checkpoints(), folder.complete_checkpoints(),
                                           save_every=save_every, steps=steps, refresh_every=refresh_every,
                                           since=since)
    for step in whole:
        folder.drop_checkpoint(step)
    for step in states:
        folder.drop_state(step)
    return whole, states
