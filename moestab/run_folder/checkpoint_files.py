"""Whether a checkpoint's files are whole, judged from their structure alone (nothing unpickled, no tensor read).

A checkpoint is renamed into place when whole, so damage means a copy that stopped early (a bucket sync, an
``rsync`` killed mid-file) or a file someone replaced. These checks are cheap enough to run on every resume: a
safetensors file's 8-byte header length, its JSON header and the byte range it declares against the file's size; a
training state's zip central directory (``torch.save`` writes a zip archive, whose directory sits at its very end,
so a truncated copy has none); a model config that is a JSON object.
"""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

SAFETENSORS_HEADER_LIMIT = 100 * 2**20  # safetensors itself refuses headers over 100 MB


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with the safetensors file ``path``, or None when its header and size agree."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{path.name} is {size} bytes, shorter than a safetensors header"
        (length,) = struct.unpack("<Q", head)
        if length > min(SAFETENSORS_HEADER_LIMIT, size - 8):
            return f"{path.name} declares a {length:,}-byte header in a {size:,}-byte file (cut short?)"
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return f"{path.name}: its header is not JSON"
    if not isinstance(header, dict):
        return f"{path.name}: its header is not a JSON object"
    ends = [entry["data_offsets"][1] for name, entry in header.items()
            if name != "__metadata__" and isinstance(entry, dict) and isinstance(entry.get("data_offsets"), list)
            and len(entry["data_offsets"]) == 2 and isinstance(entry["data_offsets"][1], int)]
    if len(ends) != len(header) - ("__metadata__" in header):
        return f"{path.name}: its header has a tensor entry without data_offsets"
    data = size - 8 - length
    if max(ends, default=0) != data:
        return f"{path.name} holds {data:,} bytes of tensor data where its header declares {max(ends, default=0):,}"
    return None


def state_problem(path: Path) -> str | None:
    """What is wrong with the training state ``path`` (a ``torch.save`` zip archive), or None when it is one."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as exc:
        return f"{path.name} is not a whole torch.save archive ({exc})"
    if not any(name.endswith("/data.pkl") for name in names):
        return f"{path.name} is a zip archive without torch.save's data.pkl"
    return None


def model_folder_problem(folder: Path) -> str | None:
    """What is wrong with the Hugging Face model folder of a checkpoint, or None when its config and weights are
    whole."""
    config = folder / "config.json"
    try:
        parsed = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"{config.name} cannot be read as JSON ({exc})"
    if not isinstance(parsed, dict):
        return f"{config.name} is not a JSON object"
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        return "it has no .safetensors weights"
    for path in weights:
        problem = safetensors_problem(path)
        if problem:
            return problem
    return None


def checkpoint_problem(model_folder: Path, state_file: Path) -> str | None:
    """What is wrong with a checkpoint (its model folder and training state), or None when both are whole."""
    return model_folder_problem(model_folder) or state_problem(state_file)
