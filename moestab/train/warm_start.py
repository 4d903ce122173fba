"""Supervised warm start of the embedded policy, stopped at partial accuracy (cached and reused).

RL needs a policy that is sometimes right: a random tiny model never earns a reward. The warm
start trains on (prompt, answer) pairs with teacher forcing and stops as soon as the greedy eval
accuracy reaches ``target``, so RL has room to improve. The result is deterministic given its
inputs and cached under a key made of all of them. It is built under a fixed torch thread count:
CPU float results depend on it, so the caller's (machine-dependent) count would otherwise change
the base behind an unchanged key.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from moestab.models import EmbeddedModelSpec, build_embedded_policy, save_policy
from moestab.tasks import Task
from moestab.train.evaluate import greedy_accuracy
from moestab.train.router_losses import load_balancing_loss, router_z_loss
from moestab.train.threads import torch_threads

logger = logging.getLogger(__name__)
"""The warm start's notes when :func:`warm_start` is given no ``log``."""

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
    aux_loss_coef: float = 0.0
    """Weight of the load-balancing loss (:func:`moestab.train.router_losses.load_balancing_loss`); 0: none."""
    z_loss_coef: float = 0.0
    """Weight of the router z-loss (:func:`moestab.train.router_losses.router_z_loss`); 0: none."""

    def key(self) -> str:
        fields = asdict(self)
        if fields["model"]["expert_width"] is None:  # the family's default width: keys made before the field, unchanged
            del fields["model"]["expert_width"]
        for name in ("aux_loss_coef", "z_loss_coef"):  # off: the keys of bases built before the router losses
            if not fields[name]:
                del fields[name]
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


def warm_start(
    spec: WarmStartSpec, task: Task, cache_dir: Path, *, log: Callable[[str], None] = logger.info
) -> tuple[Path, dict]:
    """Path of the warm-started base (built now or found in the cache) and its record.

    Several runs may start together on one empty cache (a sweep, one HOME): the first to take the entry's lock builds
    it while the others wait, then find it. An entry is built in a folder of its own process's
    (``.NAME.<random>.tmp``) and published whole by one rename, so a reader never sees a partial entry, even where
    the lock cannot be taken (a file system without flock: each process then builds, and the first rename wins).
    """
    path = cache_dir / "bases" / f"{spec.model.family}-{spec.key()}"
    found = _published(path)
    if found is not None:
        return path, found
    path.parent.mkdir(parents=True, exist_ok=True)
    with _entry_lock(path, log):
        found = _published(path)  # built by the process that held the lock before
        if found is not None:
            return path, found
        log(f"warm start: building the base policy of seed {spec.seed} ({task.spec}, target accuracy "
            f"{spec.target:.0%}, at most {spec.max_steps} steps); built once and cached in {path} for every run of "
            "this model, seed and task")
        started = time.monotonic()
        with torch_threads(WARM_START_THREADS):
            model, tokenizer, step, accuracy = _train_base(spec, task, log)
        log(f"warm start: done in {step} steps, {time.monotonic() - started:.0f} s; eval accuracy {accuracy:.1%}")
        record = {"steps": step, "accuracy": accuracy, "threads": WARM_START_THREADS, "key": spec.key(),
                  "spec": asdict(spec)}
        if accuracy < spec.target:
            log(f"warm start: stopped at the step cap {spec.max_steps} with accuracy {accuracy:.1%}")
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        try:
            save_policy(model, tokenizer, staging / "base")
            (staging / "base" / MARKER).write_text(json.dumps(record, indent=2))  # last: marks a complete entry
            _publish(staging / "base", path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # what a lost race or a failure left
    found = _published(path)
    if found is None:
        raise RuntimeError(f"the warm-start cache entry {path} was not published")
    return path, found


def _published(path: Path) -> dict | None:
    """The record of the complete cache entry at ``path``, or None (absent, or an entry left without its marker)."""
    marker = path / MARKER
    return json.loads(marker.read_text()) if marker.is_file() else None


def _publish(built: Path, path: Path) -> None:
    """Rename the complete entry ``built`` to ``path``. An incomplete entry there (from a version that built in place)
    is moved aside first; a complete one published meanwhile by another process wins (same key, same base)."""
    if (path.exists() or path.is_symlink()) and _published(path) is None:
        aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
        with contextlib.suppress(FileNotFoundError):  # another process moved it first
            path.rename(aside / "entry")
        shutil.rmtree(aside, ignore_errors=True)
    try:
        built.rename(path)
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY) or _published(path) is None:
            raise


@contextlib.contextmanager
def _entry_lock(path: Path, log: Callable[[str], None]) -> Iterator[None]:
    """Hold ``NAME.lock`` beside the entry while inside (blocking). Where the file system refuses flock the entry
    is built without it: the publish by rename keeps the cache whole either way."""
    fd = os.open(path.with_name(f"{path.name}.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"warm start: another process is building {path.name}; waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass  # no flock here (some network file systems)
        yield
    finally:
        os.close(fd)  # releases the lock


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
    started = time.monotonic()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model.train()
        while accuracy < spec.target and step < spec.max_steps:
            ids, mask, loss_mask = sft_batch(tokenizer, task.sample(spec.batch_size, rng), "cpu")
            loss, parts = _sft_loss(model, spec, ids, mask, loss_mask)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step += 1
            if step % spec.eval_every == 0:
                accuracy = greedy_accuracy(model, tokenizer, task, eval_set, max_new_tokens=max_new)
                shown = "".join(f", {name} {value.item():.3f}" for name, value in parts.items())
                log(f"warm start: step {step} of at most {spec.max_steps} ({time.monotonic() - started:.0f} s), "
                    f"loss {loss.item():.3f}{shown}, eval accuracy {accuracy:.1%}")
    return model, tokenizer, step, accuracy


def _sft_loss(model: PreTrainedModel, spec: WarmStartSpec, ids: torch.Tensor, mask: torch.Tensor,
              loss_mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Cross-entropy on the answer tokens, plus the router losses ``spec`` weighs in (over every real token, prompt
    included, as pre-training balances every token); the router losses, detached, for the log (read only when it
    is written: no device sync a step)."""
    balance = spec.aux_loss_coef > 0 or spec.z_loss_coef > 0
    out = model(input_ids=ids, attention_mask=mask, **({"output_router_logits": True} if balance else {}))
    logits = out.logits[:, :-1]  # [B, L-1, V]
    target_mask = loss_mask[:, 1:]  # [B, L-1]
    loss = torch.nn.functional.cross_entropy(logits[target_mask], ids[:, 1:][target_mask])
    if not balance:
        return loss, {}
    if not getattr(out, "router_logits", None):
        raise ValueError(f"{model.config.model_type} returns no router logits (output_router_logits), so its warm "
                         "start cannot balance its routers; set warm_start_aux_loss_coef and warm_start_z_loss_coef 0")
    router_logits = torch.stack([r.reshape(-1, r.shape[-1]) for r in out.router_logits])  # [layers, B*L, E]
    real = mask.reshape(-1).bool()  # [B*L]
    aux = load_balancing_loss(router_logits, spec.model.top_k, real)
    z = router_z_loss(router_logits, real)
    return loss + spec.aux_loss_coef * aux + spec.z_loss_coef * z, {"balance": aux.detach(), "z": z.detach()}
