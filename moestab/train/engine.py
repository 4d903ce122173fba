"""The rollout-engine contract, and the engines ``moestab train --rollout-engine`` can build.

An engine samples completions for the trainer and says exactly what it computed: ``generate(prompts, *,
max_new_tokens, temperature) -> RolloutBatch`` with, per response token, its log-prob under the sampling
distribution and, per input position, the experts its routers chose (prompt included; and their gate weights when
built with ``gates=True``, for TRR); ``sync_weights()`` makes it sample from the trainer's current weights (the
step calls it once before each rollout, on every process: with a sharded policy it is a collective, so ``generate``
itself never synchronises).
``check_rollout_batch`` is the structural half of the contract (shapes, masks, routes at exactly the real
positions); tests/train/test_engine_contract.py holds every engine to the numerical half against the trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from moestab.recording.batch import RolloutBatch
from moestab.train.config import ENGINE_NAMES


class RolloutEngine(Protocol):
    """What the training step needs from a rollout engine."""

    tokenizer: object

    def sync_weights(self) -> None: ...

    def generate(self, prompts: list[str], *, max_new_tokens: int, temperature: float) -> RolloutBatch: ...


class ContractError(AssertionError):
    """A rollout batch breaks the engine contract (raised by ``check_rollout_batch``)."""


def check_rollout_batch(batch: RolloutBatch, *, num_layers: int, top_k: int, num_experts: int,
                        eos_token_id: int, gates: bool = False) -> None:
    """Raise ``ContractError`` naming the first broken rule of the engine contract."""
    batch = batch.to("cpu")  # the rules hold wherever the engine put its tensors
    b, length = batch.input_ids.shape  # [B, L]
    t = batch.targets.shape[1]  # [B, T]
    p = batch.prompt_len
    rules: list[tuple[bool, str]] = [
        (batch.attention_mask.shape == (b, length), f"attention_mask is {tuple(batch.attention_mask.shape)}, "
                                                    f"expected [B, L] = {(b, length)}"),
        (length == p + t - 1, f"input length {length} != prompt {p} + response {t} - 1 (the last sampled token is "
                              "never an input)"),
        (batch.response_mask.shape == (b, t) and batch.response_mask.dtype == torch.bool,
         "response_mask must be bool [B, T]"),
        (batch.logp_rollout.shape == (b, t) and batch.logp_rollout.dtype == torch.float32,
         "logp_rollout must be float32 [B, T]"),
        (len(batch.completions) == b, f"{len(batch.completions)} completions for {b} sequences"),
    ]
    for ok, message in rules:
        if not ok:
            raise ContractError(message)
    mask = batch.response_mask
    # The response mask is each response's prefix up to and including its first EOS (all of it without one).
    is_eos = batch.targets == eos_token_id  # [B, T]
    first_eos = torch.where(is_eos.any(-1), is_eos.float().argmax(-1) + 1, torch.full((b,), t))  # [B]
    expected = torch.arange(t).unsqueeze(0) < first_eos.unsqueeze(1)  # [B, T]
    if not torch.equal(mask.cpu(), expected):
        raise ContractError("response_mask must cover each response up to and including its first EOS, no further")
    if bool(((batch.logp_rollout > 0) & mask).any()) or not bool(torch.isfinite(batch.logp_rollout[mask]).all()):
        raise ContractError("logp_rollout must be a finite log-probability (<= 0) at every response token")
    # Each response's tokens but its last are inputs; an engine that generates a batch together also feeds a
    # finished sequence's EOS while the others go on (the Hugging Face engine: response_mask[:, :-1]), one that
    # generates each request on its own never does (vLLM: response_mask[:, 1:]). Both are exact; nothing else is.
    prompt_real = batch.attention_mask[:, :p].bool()  # [B, P]
    real = batch.attention_mask.bool()  # [B, L]
    if not any(torch.equal(real, torch.cat([prompt_real, inputs], dim=1)) for inputs in (mask[:, :-1], mask[:, 1:])):
        raise ContractError("attention_mask must be the prompt's mask followed by response_mask[:, :-1] (a batch "
                            "that feeds a finished sequence's EOS) or response_mask[:, 1:] (one that never does)")
    _check_routes(batch, num_layers=num_layers, top_k=top_k, num_experts=num_experts, gates=gates)


def _check_routes(batch: RolloutBatch, *, num_layers: int, top_k: int, num_experts: int, gates: bool) -> None:
    """The engine contract's rules on the batch's routes (:func:`check_rollout_batch`)."""
    b, length = batch.input_ids.shape  # [B, L]
    routes = batch.routes
    if tuple(routes.indices.shape) != (b, length, num_layers, top_k):
        raise ContractError(f"routes are {tuple(routes.indices.shape)}, expected [B, L, layers, top_k] = "
                            f"{(b, length, num_layers, top_k)}")
    routed = (routes.indices >= 0).all(-1).all(-1)  # [B, L]
    real = batch.attention_mask.bool()
    if not torch.equal(routed, real):
        raise ContractError("routes must cover every real input position (prompt included) and only those")
    if bool((routes.indices >= num_experts).any()):
        raise ContractError(f"routes name experts >= num_experts={num_experts}")
    if gates and (routes.gates is None or not bool(torch.isfinite(routes.gates[real]).all())):
        raise ContractError("an engine built with gates=True must return finite gate weights at every real position")


def close_engine(engine: RolloutEngine) -> None:
    """Release what ``engine`` holds beyond this process's memory (the vLLM engine's worker processes and snapshot
    folder); a no-op for engines without ``close()``."""
    close = getattr(engine, "close", None)
    if close is not None:
        close()


def engine_factory(name: str, *, device: torch.device) -> Callable[..., RolloutEngine]:
    """The constructor of engine ``name`` (``(model, tokenizer, *, dtype, gates) -> engine``), after checking it can
    run here; raises ``ValueError`` saying what is missing and what to do."""
    if name == "hf":
        from moestab.train.rollout import HFRolloutEngine

        return HFRolloutEngine
    if name == "vllm":
        from moestab.train.vllm_engine import VLLMRolloutEngine, require_vllm

        require_vllm(device)
        return VLLMRolloutEngine
    raise ValueError(f"unknown rollout engine {name!r}; valid: {', '.join(ENGINE_NAMES)}")
