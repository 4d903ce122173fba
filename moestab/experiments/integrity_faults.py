"""Route-integrity checks measured on planted faults (issue 53; launcher scripts/integrity_faults.py).

A **capture** is real: a warm-started embedded policy's rollout, sampled by moestab's HF engine in bf16 (vLLM's CPU
engine too, where it is installed), with the trainer's own free routes of the same tokens in fp32 as the
reference. Each **fault** of the field's public failures (docs/integrations.md, "Route integrity") is planted in the
capture's per-sequence rows; each **entry point** then carries the rows to the checks as a trainer would:
moestab's own layout (``moestab train`` and the TRL integration judge the rollout batch itself), or a framework's
documented payload (vLLM, SGLang, verl, Megatron-Core) imported by ``moestab.routes_in`` and handed to
``route_diagnostics`` (the ``DiagnosticsRun`` path). A cell is detected when a check fails
(``moestab.metrics.integrity.failures``) or the entry point refuses the payload; the clean rows are the false
alarms.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from moestab.metrics import keys
from moestab.metrics.integrity import THRESHOLDS, failures, route_integrity
from moestab.recording.batch import RolloutBatch
from moestab.recording.diagnostics import route_diagnostics
from moestab.routes_in import import_routes, to_megatron
from moestab.routes_in.common import ImportedRoutes

Rows = list[np.ndarray]
"""One capture: per sequence, its routes at its own input positions ``[p + r - 1, layers, top_k]`` (prompt first)."""


@dataclass(frozen=True)
class Capture:
    """A real capture and what the checks compare it with."""

    name: str
    rows: Rows
    prompts: tuple[int, ...]
    """``p`` per sequence."""
    responses: tuple[int, ...]
    """``r`` per sequence."""
    reference: np.ndarray
    """``[tokens, layers, top_k]`` the trainer's free routes of the response tokens (row-major over sequences)."""
    num_experts: int
    other: Rows | None = None
    """Another seed's model's routes of the same tokens (the other-model fault), when available."""


def batch_rows(batch: RolloutBatch, indices: torch.Tensor) -> tuple[Rows, tuple[int, ...], tuple[int, ...]]:
    """Per-sequence rows of ``indices`` ``[B, P + R - 1, layers, k]`` on ``batch``'s layout, and ``p``, ``r``."""
    P = batch.prompt_len
    prompts = tuple(int(v) for v in batch.attention_mask[:, :P].sum(1))
    responses = tuple(int(v) for v in batch.response_mask.sum(1))
    rows = [indices[i, P - p : P - 1 + r].numpy().astype(np.int16) for i, (p, r) in
            enumerate(zip(prompts, responses, strict=True))]
    return rows, prompts, responses


# ---- the faults ------------------------------------------------------------------------------------------------------
def _each(rows: Rows, fn: Callable[[np.ndarray, int], np.ndarray]) -> Rows:
    return [fn(seq.copy(), i) for i, seq in enumerate(rows)]


def _shifted(seq: np.ndarray, start: int, by: int) -> np.ndarray:
    """``seq`` with rows from ``start`` on taken ``by`` positions earlier (the first ones repeated)."""
    out = seq.copy()
    src = np.clip(np.arange(start, len(seq)) - by, 0, None)
    out[start:] = seq[src]
    return out


def plant(fault: str, capture: Capture) -> Rows:
    """``capture``'s rows with ``fault`` planted (:data:`FAULTS`)."""
    rows, prompts = capture.rows, capture.prompts
    if fault == "clean":
        return [seq.copy() for seq in rows]
    if fault == "all_zero":  # vLLM #49184: (4, 48, 8) all zero, no error
        return _each(rows, lambda s, i: np.zeros_like(s))
    if fault == "layer_zeroed":  # one fused kernel's layer returns zeros
        return _each(rows, lambda s, i: np.concatenate([s[:, :1], np.zeros_like(s[:, 1:2]), s[:, 2:]], axis=1))
    if fault == "rows_dropped":  # AReno #524: async merging dropped routed_experts (1 sequence in 8)
        return _each(rows, lambda s, i: np.full_like(s, -1) if i % 8 == 0 else s)
    if fault == "token_shift":  # off by one token
        return _each(rows, lambda s, i: _shifted(s, 0, 1))
    if fault == "turn_misaligned":  # AReno #524: multi-turn slicing, the second half of each response off by 2
        return _each(rows, lambda s, i: _shifted(s, prompts[i] + (len(s) - prompts[i]) // 2, 2))
    if fault == "layers_permuted":
        return _each(rows, lambda s, i: s[:, ::-1].copy())
    if fault == "other_model":
        if capture.other is None:
            raise ValueError("the other-model fault needs the capture's other rows")
        return [seq.copy() for seq in capture.other]
    if fault == "uint8_wraparound":
        return _each(rows, lambda s, i: np.where(s >= 0, s % 256, s).astype(np.int16))
    raise ValueError(f"unknown fault {fault!r}; valid: {', '.join(FAULTS)}")


FAULTS = ("clean", "all_zero", "layer_zeroed", "rows_dropped", "token_shift", "turn_misaligned", "layers_permuted",
          "other_model", "uint8_wraparound")


# ---- the entry points -----------------------------------------------------------------------------------------
def layout(rows: Rows, prompts: tuple[int, ...], responses: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """moestab's layout of ``rows``: ``[B, P + R - 1, layers, k]`` (-1 where nothing was routed) and the response
    tokens' routes ``[tokens, layers, k]`` row-major over sequences."""
    P, R = max(prompts), max(responses)
    layers, k = rows[0].shape[1:]
    out = -np.ones((len(rows), P + R - 1, layers, k), np.int16)
    for i, (seq, p) in enumerate(zip(rows, prompts, strict=True)):
        out[i, P - p : P - p + len(seq)] = seq
    tokens = np.concatenate([out[i, P - 1 : P - 1 + r] for i, r in enumerate(responses)])
    return out, tokens


class _Completion:  # the fields of vllm.CompletionOutput the importer reads
    def __init__(self, token_ids: list[int], routed_experts: np.ndarray) -> None:
        self.token_ids, self.routed_experts = token_ids, routed_experts


class _Request:  # vllm.RequestOutput's
    def __init__(self, prompt_token_ids: list[int], outputs: list[_Completion], prompt_routed_experts: Any) -> None:
        self.prompt_token_ids, self.outputs = prompt_token_ids, outputs
        self.prompt_routed_experts = prompt_routed_experts


def _zero_filled(seq: np.ndarray) -> np.ndarray:
    """A payload holds no -1: an engine fills a row it did not route with zeros."""
    return np.where(seq < 0, 0, seq)


def vllm_payload(rows: Rows, prompts, responses) -> list[_Request]:
    """vLLM's split layout (``prompt_routed_experts`` on the request, ``routed_experts`` on the completion)."""
    return [_Request(list(range(p)), [_Completion(list(range(r)), _zero_filled(s[p:]).astype(np.int32))],
                     _zero_filled(s[:p]).astype(np.int32)) for s, p, r in zip(rows, prompts, responses, strict=True)]


def sglang_payload(rows: Rows, prompts, responses) -> list[dict]:
    """SGLang's ``meta_info``: base64 int32 ``[positions, layers * top_k]``."""
    out = []
    for s, p, r in zip(rows, prompts, responses, strict=True):
        flat = _zero_filled(s).reshape(len(s), -1).astype("<i4")
        out.append({"text": "", "meta_info": {"routed_experts": base64.b64encode(flat.tobytes()).decode(),
                                              "prompt_tokens": p, "completion_tokens": r}})
    return out


def verl_payload(rows: Rows, prompts, responses) -> dict[str, torch.Tensor]:
    """verl's batch: ``routed_experts`` int16 ``[batch, P + R, layers, top_k]``, prompts left-padded, zero-filled."""
    P, R = max(prompts), max(responses)
    layers, k = rows[0].shape[1:]
    routed = torch.zeros(len(rows), P + R, layers, k, dtype=torch.int16)
    attention = torch.zeros(len(rows), P + R, dtype=torch.long)
    response_mask = torch.zeros(len(rows), R, dtype=torch.long)
    for i, (s, p, r) in enumerate(zip(rows, prompts, responses, strict=True)):
        routed[i, P - p : P - p + len(s)] = torch.from_numpy(_zero_filled(s).astype(np.int16))
        attention[i, P - p : P + r] = 1
        response_mask[i, :r] = 1
    return {"routed_experts": routed, "responses": torch.zeros(len(rows), R, dtype=torch.long),
            "attention_mask": attention, "response_mask": response_mask}


def _imported(framework: str, rows: Rows, prompts, responses, num_experts: int) -> ImportedRoutes:
    layers, k = rows[0].shape[1:]
    if framework == "vllm":
        return import_routes("vllm", vllm_payload(rows, prompts, responses), num_experts=num_experts)
    if framework == "sglang":
        return import_routes("sglang", sglang_payload(rows, prompts, responses), num_experts=num_experts,
                             num_layers=layers, top_k=k)
    if framework == "verl":
        return import_routes("verl", verl_payload(rows, prompts, responses), num_experts=num_experts)
    if framework == "megatron":
        from moestab.routing.routes import Routes

        placed, _ = layout([_zero_filled(s) for s in rows], prompts, responses)
        P = max(prompts)
        scoring = np.zeros(placed.shape[:2], bool)
        attention = np.zeros(placed.shape[:2], bool)
        for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
            scoring[i, P - 1 : P - 1 + r] = True
            attention[i, P - p : P - 1 + r] = True
        per_layer = to_megatron(Routes(indices=torch.from_numpy(placed), layers=tuple(range(layers)),
                                       num_experts=num_experts))
        return import_routes("megatron", per_layer, num_experts=num_experts, batch_size=len(rows),
                             attention_mask=torch.from_numpy(attention), scoring=torch.from_numpy(scoring))
    raise ValueError(f"unknown framework {framework!r}")


ENTRY_POINTS = ("moestab layout", "vllm", "sglang", "verl", "megatron")
"""moestab's own layout (``moestab train``, the TRL integration), and the payloads imported for ``DiagnosticsRun``."""


@dataclass(frozen=True)
class Cell:
    """One fault at one entry point: whether it was caught, and by what."""

    capture: str
    fault: str
    entry: str
    detected: bool
    by: str
    """The failing checks (``failures``' wording, first two), or the refusal's error, or ``-``."""
    lift: float | None
    coverage: float | None


def judge(capture: Capture, fault: str, entry: str) -> Cell:
    """Plant ``fault`` in ``capture``, carry it through ``entry``, and check it against the capture's reference."""
    rows = plant(fault, capture)
    try:
        if entry == "moestab layout":
            _, tokens = layout(rows, capture.prompts, capture.responses)
            metrics = route_integrity(tokens, capture.reference, num_experts=capture.num_experts)
        else:
            imported = _imported(entry, rows, capture.prompts, capture.responses, capture.num_experts)
            metrics = route_diagnostics(imported.response_routes(), capture.reference,
                                        num_experts=capture.num_experts)
    except (ValueError, TypeError) as error:  # the entry point refused the payload: a detection with its reason
        return Cell(capture.name, fault, entry, True, f"refused: {str(error)[:90]}", None, None)
    problems = failures(metrics)
    return Cell(capture.name, fault, entry, bool(problems), "; ".join(problems[:2]) or "-",
                metrics.get(keys.INTEGRITY_LIFT), metrics.get(keys.INTEGRITY_COVERAGE))


def thresholds_text() -> str:
    t = THRESHOLDS
    return (f"coverage < {t.coverage}, invalid > {t.invalid}, a constant layer, lift < {t.lift} (a layer's) or more "
            f"than {t.disagreeing:.0%} of tokens below it, ids that never reach 256 in a model of more")


# ---- the captures ---------------------------------------------------------------------------------------------
def capture_of(model: str, seed: int, *, prompts: int = 16, group: int = 4, other_seed: int | None = None,
               engine: str = "hf", cache_dir: str | None = None, warm: bool = True) -> Capture:
    """A real capture: ``model``'s warm-started base of ``seed`` (``warm=False``: its untrained initial weights)
    samples ``prompts`` x ``group`` responses of step 1's arithmetic prompts in bf16 with ``engine``; the reference
    is the fp32 policy's free routes of the same tokens; with ``other_seed``, that seed's base routes them too."""
    from transformers import AutoTokenizer

    from moestab.configs import build_config
    from moestab.tasks import task_from_spec
    from moestab.train.config import TrainConfig
    from moestab.train.engine import engine_factory
    from moestab.train.forward import policy_forward
    from moestab.train.recipe import base_policy_path, load_policy
    from moestab.train.step_settings import step_examples

    def base(s: int):
        config = build_config(TrainConfig, {"model": model, "seed": s, "cache_dir": cache_dir, "threads": 1,
                                            **({} if warm else {"warm_start_max_steps": 0})})
        path, _ = base_policy_path(config, task, log=lambda line: None)
        return load_policy(path, torch.float32, torch.device("cpu")).eval(), path

    task = task_from_spec("arithmetic")
    policy, path = base(seed)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    rollout = engine_factory(engine, device=torch.device("cpu"))(policy, tokenizer, dtype=torch.bfloat16, gates=False)
    try:
        rollout.sync_weights()
        torch.manual_seed(seed)
        examples = step_examples(task, prompts, seed, 1)
        batch = rollout.generate([ex.prompt for ex in examples for _ in range(group)],
                                 max_new_tokens=task.max_answer_chars + 1, temperature=1.0)
    finally:
        close = getattr(rollout, "close", None)
        if close is not None:
            close()
    with torch.no_grad():
        free = policy_forward(policy, batch, temperature=1.0).routes
        other = None
        if other_seed is not None:
            other_policy, _ = base(other_seed)
            other = policy_forward(other_policy, batch, temperature=1.0).routes
    rows, p, r = batch_rows(batch, batch.routes.indices)
    reference = batch.response(free.indices).numpy().astype(np.int16)
    name = f"{model} seed {seed} ({engine}{'' if warm else ', untrained'})"
    return Capture(name, rows, p, r, reference, free.num_experts,
                   None if other is None else batch_rows(batch, other.indices)[0])
