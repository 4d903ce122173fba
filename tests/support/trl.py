"""TRL's GRPOTrainer on a tiny model, as the TRL integration's tests set it up (TRL is imported only by
:func:`grpo_args`: a test module that uses it skips first where TRL is not installed)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch
    from trl import GRPOConfig

PROMPTS = ["12+34=", "5+7=", "40+2=", "9+9=", "31+11=", "3+4=", "8+1=", "20+20="]


TOP_K, LAYERS = 2, 2


def reward(completions: list[str], **_: object) -> list[float]:
    """Toy reward with spread inside a group: the share of digits in the completion."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def grpo_args(out: Path, **overrides: object) -> GRPOConfig:
    """16 sequences per generation (4 prompts x 4), 2 micro-batches of 8, 3 generation batches by default."""
    from trl import GRPOConfig

    settings = {"output_dir": str(out), "use_cpu": True, "bf16": False, "report_to": "none", "disable_tqdm": True,
                "save_strategy": "no", "logging_steps": 1, "seed": 0, "per_device_train_batch_size": 8,
                "num_generations": 4, "gradient_accumulation_steps": 1, "steps_per_generation": 2,
                "max_completion_length": 6, "learning_rate": 1e-2, "loss_type": "grpo", "epsilon": 0.05,
                "max_steps": 6}
    return GRPOConfig(**{**settings, **overrides})


def moestab_hooks(model) -> int:
    """Forward hooks of moestab's still on ``model`` (transformers and TRL install their own during training)."""
    hooks = [h for m in model.modules() for h in (*m._forward_hooks.values(), *m._forward_pre_hooks.values())]
    return sum(getattr(h, "__module__", "").startswith("moestab.") for h in hooks)


README = Path(__file__).resolve().parents[2] / "README.md"


def readme_blocks() -> list[str]:
    """The code blocks of README.md's "Inside TRL's GRPOTrainer" section."""
    text = README.read_text()
    section = text[text.index("## Inside TRL's GRPOTrainer") :]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```python\n(.+?)\n```", section, re.S)


def readme_snippet() -> str:
    """The section's first code block, the trainer, run here as written."""
    return readme_blocks()[0]


def run_snippet(root: Path, model, tokenizer, reward_funcs=reward, dataset=None, **overrides: object):
    """README's snippet on ``model`` with the run folder ``root / "run"`` (``dataset``: the tests' prompts by
    default); returns its trainer."""
    from datasets import Dataset  # TRL's own dependency

    env = {"model": model, "tokenizer": tokenizer, "reward": reward_funcs, "run_dir": root / "run",
           "dataset": dataset if dataset is not None else Dataset.from_dict({"prompt": PROMPTS}),
           "args": grpo_args(root / "trl", **overrides)}
    exec(readme_snippet(), env)
    return env["trainer"]


def match_rows(pool: torch.Tensor, parts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """For each row of each part ``[b, L]``, the row of ``pool`` ``[N, L]`` holding the same tokens
    (moestab's ``RowMatcher``, in the parts' order)."""
    from moestab.integrations.trl.cycle import RowMatcher  # TRL's integration: imported where used

    matcher = RowMatcher(pool)
    return [matcher.match(part) for part in parts]
