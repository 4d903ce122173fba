"""Supervised warm start of the embedded policy, stopped at partial accuracy (cached and reused).

RL needs a policy that is sometimes right: a random tiny model never earns a reward. The warm
start trains on (prompt, answer) pairs with teacher forcing and stops as soon as the greedy eval
accuracy reaches ``target``, so RL has room to improve. The result is deterministic given its
inputs and cached under a key made of all of them. It is built under a fixed torch thread count:
CPU float results depend on it, so the caller's (machine-dependent) count would otherwise change
the base behind an unchanged key.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from moestab.models import EmbeddedModelSpec, build_embedded_policy, save_policy
from moestab.tasks import Task
from moestab.train.evaluate import greedy_accuracy
from moestab.train.threads import torch_threads

WARM_START_VERSION = 2  # bump when the procedure changes, so old cache entries are not reused
# 1: the only count every machine can run, so the base cannot depend on the core count.
WARM_START_THREADS = 1
MARKER = "warm_start.json"


@dataclass(frozen=True)
class WarmStartSpec:
    """Everything the warm-started base depends on (its cache key)."""

    model: EmbeddedModelSpec
    task_spec: str
    target: float
    max_steps: int
    seed: int
    eval_size: int
    batch_size: int = 64
    lr: float = 2e-3
    eval_every: int = 50

    def key(self) -> str:
        fields = asdict(self)
        if fields["model"]["expert_width"] is None:  # the family's default width: keys made before the field, unchanged
            del fields["model"]["expert_width"]
        blob = json.dumps({"v": WARM_START_VERSION, "threads": WARM_START_THREADS, **fields}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def sft_batch(tokenizer, examples, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``prompt + answer + eos`` ids ``[B, L]``, mask ``[B, L]``, loss mask on answer+eos ``[B, L]``."""
    rows, loss_rows = [], []
    for ex in examples:
        prompt = tokenizer.encode(ex.prompt, add_special_tokens=False)
        answer = [*tokenizer.encode(ex.answer, add_special_tokens=False), tokenizer.eos_token_id]
        rows.append(prompt + answer)
        loss_rows.append([0] * len(prompt) + [1] * len(answer))
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    loss_mask = torch.zeros_like(ids, dtype=torch.bool)
    for i, (row, lrow) in enumerate(zip(rows, loss_rows, strict=True)):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
        loss_mask[i, : len(row)] = torch.tensor(lrow, dtype=torch.bool)
    return ids.to(device), mask.to(device), loss_mask.to(device)


def warm_start(spec: WarmStartSpec, task: Task, cache_dir: Path, *, log=print) -> tuple[Path, dict]:
    """Path of the warm-started base (built now or found in the cache) and its record."""
    path = cache_dir / "bases" / f"{spec.model.family}-{spec.key()}"
    marker = path / MARKER
    if marker.is_file():
        return path, json.loads(marker.read_text())
    log(f"warm start: building the base policy ({task.spec}, target accuracy {spec.target:.0%})")
    with torch_threads(WARM_START_THREADS):
        model, tokenizer, step, accuracy = _train_base(spec, task, log)
    record = {"steps": step, "accuracy": accuracy, "threads": WARM_START_THREADS, "key": spec.key(),
              "spec": asdict(spec)}
    if accuracy < spec.target:
        log(f"warm start: stopped at the step cap {spec.max_steps} with accuracy {accuracy:.1%}")
    save_policy(model, tokenizer, path)
    (path / MARKER).write_text(json.dumps(record, indent=2))  # written last: marks a complete entry
    return path, record


def _train_base(
    spec: WarmStartSpec, task: Task, log: Callable[[str], None]
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast, int, float]:
    """Model, tokenizer, steps taken and last eval accuracy of a freshly trained base."""
    model, tokenizer = build_embedded_policy(spec.model)
    rng = random.Random(spec.seed)
    eval_set = task.eval_set(spec.eval_size, seed=spec.seed)
    max_new = task.max_answer_chars + 1
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)
    accuracy, step = greedy_accuracy(model, tokenizer, task, eval_set, max_new_tokens=max_new), 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model.train()
        while accuracy < spec.target and step < spec.max_steps:
            ids, mask, loss_mask = sft_batch(tokenizer, task.sample(spec.batch_size, rng), "cpu")
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]  # [B, L-1, V]
            target_mask = loss_mask[:, 1:]  # [B, L-1]
            loss = torch.nn.functional.cross_entropy(logits[target_mask], ids[:, 1:][target_mask])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step += 1
            if step % spec.eval_every == 0:
                accuracy = greedy_accuracy(model, tokenizer, task, eval_set, max_new_tokens=max_new)
                log(f"warm start: step {step}, loss {loss.item():.3f}, eval accuracy {accuracy:.1%}")
    return model, tokenizer, step, accuracy
