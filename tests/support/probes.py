"""Plain Hugging Face folders of tiny MoE families and a probe run on them (tests/probes, tests/analysis, the
dashboard's Probes page)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from moestab.models.families import tiny_config
from moestab.models.tokenizer import build_char_tokenizer
from moestab.probes import ProbeSettings, load_suite, run_probe
from moestab.probes.checkpoints import resolve_checkpoints

FAMILIES = ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "gpt_oss", "deepseek_v3"]


def save_family(path, family: str, seed: int = 0, **config) -> str:
    """A plain ``save_pretrained`` folder (no moestab run) of a tiny model of ``family``."""
    torch.manual_seed(seed)
    tokenizer = build_char_tokenizer()
    model = AutoModelForCausalLM.from_config(tiny_config(family, vocab_size=len(tokenizer), **config))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def probe(name: str, paths: list[str], suite: str = "general", count: int = 12, **settings):
    """``moestab probe NAME`` on the checkpoints of ``paths`` with ``count`` prompts of ``suite``."""
    checkpoints = [c for p in paths for c in resolve_checkpoints([p])]
    return run_probe(name, checkpoints, load_suite(suite, count), ProbeSettings(**settings))

