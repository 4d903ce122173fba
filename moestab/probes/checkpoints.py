"""What a probe runs on: moestab run folders (expanded to their checkpoints) or any Hugging Face MoE folders."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from moestab.models.tokenizer import tokenizer_overflow
from moestab.probes.errors import ProbeError
from moestab.routing import find_routers
from moestab.routing.compat import check_generate_recording
from moestab.routing.errors import IncompatibleTransformersError, RoutingError
from moestab.run_folder import RunFolder, schema
from moestab.run_folder.errors import RunError, SchemaVersionError
from moestab.run_folder.reader import list_checkpoints, read_run_info
from moestab.text import ECHO_LIMIT, clip

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Checkpoint:
    """One model folder and the label it is reported under (``run@step`` for a run's checkpoint)."""

    label: str
    path: Path
    run: Path | None = None
    """The moestab run folder it is a checkpoint of (``None`` for a plain model folder)."""


def resolve_checkpoints(paths: Sequence[str | Path]) -> list[Checkpoint]:
    """Each path as checkpoints: a run folder gives all its checkpoints in step order, a model folder itself."""
    if not paths:
        raise ProbeError("no checkpoint given; pass run folders or Hugging Face model folders")
    out: list[Checkpoint] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise ProbeError(f"{path} does not exist; give a moestab run folder or a Hugging Face model folder")
        run_json = RunFolder(path).holds_run
        foreign = _foreign_run_json(path) if run_json else None
        if run_json and foreign is None:
            steps = list_checkpoints(path)
            if steps.empty:
                raise ProbeError(f"{path} is a run folder without checkpoints "
                                 f"(nothing under {schema.CHECKPOINTS_DIR}/)")
            out += [Checkpoint(f"{path.name}@{step}", Path(p), run=path)
                    for step, p in zip(steps["step"], steps["path"], strict=True)]
        elif (path / "config.json").is_file():  # a model folder, beside another tool's run.json too
            out.append(Checkpoint(path.name, path))
        elif foreign is not None:
            raise ProbeError(f"{path} is not a moestab run folder: its {schema.RUN_JSON} is not moestab's ({foreign}); "
                             "give a moestab run folder or a Hugging Face model folder")
        else:
            raise ProbeError(f"{path} is neither a moestab run folder (no {schema.RUN_JSON}) nor a Hugging Face "
                             "model folder (no config.json)")
    return out


def _foreign_run_json(path: Path) -> str | None:
    """Why ``path``'s run.json is not a moestab run's, e.g. another tool's; ``None`` when it is one (an older or newer
    schema too: the probes read its checkpoints all the same)."""
    try:
        read_run_info(path)
    except SchemaVersionError:
        return None
    except RunError as exc:
        return clip(str(exc), 2 * ECHO_LIMIT)
    return None


def check_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ProbeError(f"dtype {name!r} is not valid; valid: {', '.join(DTYPES)}")
    return DTYPES[name]


def load_checkpoint(
    checkpoint: Checkpoint, *, dtype: str = "float32", device: str = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model (eval mode, on ``device`` in ``dtype``) and tokenizer of a checkpoint; a dense model is refused."""
    torch_dtype = check_dtype(dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(checkpoint.path, dtype=torch_dtype).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(checkpoint.path)
    except Exception as exc:  # transformers / safetensors raise many types for a damaged folder (as train's loader)
        weights = sorted(p.name for p in checkpoint.path.glob("*.safetensors")) if checkpoint.path.is_dir() else []
        files = f" (weights: {', '.join(weights)})" if weights else ""
        raise ProbeError(f"{checkpoint.path}: cannot load the model and tokenizer{files}: {type(exc).__name__}: "
                         f"{clip(str(exc), 2 * ECHO_LIMIT)}") from exc
    problem = tokenizer_overflow(model, tokenizer)
    if problem:
        raise ProbeError(f"{checkpoint.path}: {problem}")
    try:
        find_routers(model)
    except RoutingError as exc:  # not an MoE, damaged router weights, a family whose math changed
        raise ProbeError(f"{checkpoint.path}: {exc}") from None
    try:
        check_generate_recording(model)
    except IncompatibleTransformersError as exc:
        raise ProbeError(f"{checkpoint.path}: {exc}") from None
    return model, tokenizer


def architecture(model: PreTrainedModel) -> dict[str, object]:
    """What two models must share for their routes to be compared token for token."""
    sites = find_routers(model)
    return {"family": model.config.model_type, "moe_layers": [s.layer for s in sites],
            "num_experts": sites[0].num_experts, "top_k": sites[0].top_k, "vocab_size": model.config.vocab_size}


def check_same_architecture(a: tuple[str, PreTrainedModel], b: tuple[str, PreTrainedModel]) -> None:
    """Refuse to compare two models whose routes cannot be matched (different layers, experts, top-k or vocab)."""
    arch_a, arch_b = architecture(a[1]), architecture(b[1])
    differ = {k: (arch_a[k], arch_b[k]) for k in arch_a if arch_a[k] != arch_b[k]}
    if differ:
        details = "; ".join(f"{k}: {va} vs {vb}" for k, (va, vb) in differ.items())
        raise ProbeError(f"{a[0]} and {b[0]} have different architectures ({details}); compare needs two "
                         "checkpoints of one model")
