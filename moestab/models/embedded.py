"""The embedded default policy: a tiny Qwen3-MoE causal LM with moestab's character tokenizer.

Built in code from a seed (no download, ever). ``save_pretrained`` output loads with
``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` without moestab.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from moestab.models.families import tiny_config
from moestab.models.spec import EmbeddedModelSpec
from moestab.models.tokenizer import build_char_tokenizer
from moestab.run_folder.folder import replace_folder


def build_embedded_policy(spec: EmbeddedModelSpec | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A freshly initialised tiny MoE policy and its tokenizer (deterministic given ``spec.seed``)."""
    spec = spec or EmbeddedModelSpec()
    tokenizer = build_char_tokenizer()
    config = tiny_config(
        spec.family,
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        num_moe_layers=spec.num_layers,
        num_experts=spec.num_experts,
        top_k=spec.top_k,
        expert_width=spec.expert_width,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model, tokenizer


def save_policy(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, path: str | Path,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write a Hugging Face folder (safetensors + tokenizer) atomically: a folder that exists is complete.
    ``state_dict``: the weights to write (default: the model's own; a sharded model passes its gathered weights)."""
    path = Path(path)
    replace_folder(path, lambda folder: write_policy(model, tokenizer, folder, state_dict=state_dict))
    return path


def write_policy(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folder: Path,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> None:
    """Write the Hugging Face folder of ``model`` and ``tokenizer`` into ``folder``, as it goes (not atomically: the
    callers write into a temporary folder, :func:`moestab.run_folder.folder.replace_folder`)."""
    model.save_pretrained(folder, state_dict=state_dict)
    tokenizer.save_pretrained(folder)

