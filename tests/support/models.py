"""Model folders for the bad-input tests."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedModel


def damaged_model(tmp: Path, how: str) -> str:
    """The embedded policy saved, then damaged: a router of NaN, a weight cut by one column (transformers logs its
    report, so tests/train/test_faults.py runs that one in a process of its own), or a tokenizer with 20 tokens more
    than the embedding has rows."""
    from safetensors.torch import load_file, save_file

    from moestab.models import build_embedded_policy, save_policy

    folder = Path(save_policy(*build_embedded_policy(), tmp / "model"))
    if how == "tokenizer":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder)
        tokenizer.add_tokens([f"extra{i}" for i in range(20)])
        tokenizer.save_pretrained(folder)
        return str(folder)
    weights = load_file(folder / "model.safetensors")
    router = weights["model.layers.0.mlp.gate.weight"]  # [experts, hidden]
    weights["model.layers.0.mlp.gate.weight"] = (torch.full_like(router, float("nan")) if how == "nan-router"
                                                 else router[:, :-1].contiguous())
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return str(folder)


def randomise_selection_biases(model: PreTrainedModel, seed: int = 0) -> None:
    """Fill every expert-selection correction bias (zero at initialisation) with small random values, so that tests
    exercise how each family adds it."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in [*model.named_buffers(), *model.named_parameters()]:
            if name.endswith(("e_score_correction_bias", "expert_bias")):
                tensor.copy_(torch.rand(tensor.shape, generator=generator) * 0.1)
