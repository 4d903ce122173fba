"""Tiny models and batches shared by the routing tests."""

import torch
from transformers import AutoModelForCausalLM

from moestab.models.families import tiny_config


def make_model(family: str, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    torch.manual_seed(seed)
    # float64 needs the eager experts loop (grouped_mm kernels take float32 / bf16 only).
    config = tiny_config(family, num_moe_layers=2, num_experts=8, top_k=2)
    eager = {"experts_implementation": "eager"} if dtype == torch.float64 else {}
    model = AutoModelForCausalLM.from_config(config, **eager)
    model.config.use_cache = False
    return model.eval().to(dtype)  # float64: replay-vs-free comparisons are exact to ~1e-12



def batch(seed: int = 0, padding: str = "left", batch_size: int = 3, seq: int = 10):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 100, (batch_size, seq), generator=g)
    mask = torch.ones_like(ids)
    if padding == "left":
        mask[0, :4] = 0
        mask[1, :1] = 0
    elif padding == "right":
        mask[0, -4:] = 0
        mask[1, -1:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    return ids, mask
