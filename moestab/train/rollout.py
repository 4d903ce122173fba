"""The rollout engine: Hugging Face ``generate()`` under a ``RoutingRecorder`` (routes kept for R3, gate
weights too for TRR).

Production RL samples in an inference engine at lower precision (bf16) and trains in fp32 or bf16:
the two route some tokens differently, which is the gap R3 removes. ``dtype`` reproduces that on any
machine: the engine samples with its own copy of the policy in ``dtype``, synchronised from the
trainer's weights by ``sync_weights()`` (the step calls it before every rollout). A policy sharded over several
processes (``--nproc``) always gets a copy: generation is then local to each process, with no collective per
decoding step.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from moestab.recording.batch import RolloutBatch, response_mask_from_tokens
from moestab.routing import RoutingRecorder, find_routers
from moestab.routing.base_routing import BaseRouting
from moestab.routing.compat import expect_coverage
from moestab.train.distributed import full_state_dict, is_sharded, unsharded_copy


class HFRolloutEngine:
    """Samples completions with ``model.generate`` and records the experts every token used."""

    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, dtype: torch.dtype | None = None,
        gates: bool = False,
    ) -> None:
        """``model`` is the trainer's policy; ``dtype`` (default: the policy's) the precision the engine samples in;
        ``gates`` also records the gate weights its routers used (``Routes.gates``, for replay with force_gates)."""
        if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer needs eos and pad tokens for batched generation")
        self.policy = model
        own = is_sharded(model) or dtype not in (None, model.dtype)
        self.model = unsharded_copy(model, dtype or model.dtype) if own else model
        self.tokenizer = tokenizer
        self.record_gates = gates
        find_routers(self.model)  # checks every router of the engine's copy once; generate() skips the check

    def sync_weights(self) -> None:
        """Copy the trainer's current weights into the engine's copy (cast to its dtype); no-op without one. With a
        sharded policy this gathers the weights: every process calls it."""
        if self.model is not self.policy:
            self.model.load_state_dict(full_state_dict(self.policy))

    @torch.no_grad()
    def generate(self, prompts: list[str], *, max_new_tokens: int, temperature: float) -> RolloutBatch:
        tok = self.tokenizer
        enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        device = next(self.model.parameters()).device
        input_ids = enc.input_ids.to(device)  # [B, P]
        prompt_mask = enc.attention_mask.to(device)  # [B, P]
        was_training = self.model.training
        self.model.eval()
        try:
            with RoutingRecorder(self.model, margin=False, entropy=False, gates=self.record_gates,
                                 verify=False) as recorder:
                out = self.model.generate(
                    input_ids=input_ids,
                    attention_mask=prompt_mask,
                    do_sample=True,
                    temperature=temperature,
                    top_k=0,  # sample from the full distribution: the trainer's logp must match it
                    top_p=1.0,
                    max_new_tokens=max_new_tokens,
                    eos_token_id=tok.eos_token_id,
                    pad_token_id=tok.pad_token_id,
                    output_logits=True,
                    return_dict_in_generate=True,
                )
        finally:
            self.model.train(was_training)
        sequences = out.sequences  # [B, P + T]
        prompt_len = input_ids.shape[1]
        generated = sequences[:, prompt_len:]  # [B, T]
        response_mask = response_mask_from_tokens(generated, tok.eos_token_id)  # [B, T]
        raw = torch.stack(out.logits, dim=1).float()  # [B, T, V] logits before temperature
        logp = torch.log_softmax(raw / temperature, dim=-1).gather(-1, generated.unsqueeze(-1)).squeeze(-1)
        attention_mask = torch.cat([prompt_mask, response_mask[:, :-1].long()], dim=1)  # [B, L]
        # generate() feeds a finished sequence's padding on until the batch ends: those positions are not its sample.
        expect_coverage(recorder.routes, attention_mask, family=self.model.config.model_type,
                        where="HF rollout engine", exact=False)
        routes = recorder.routes.masked(attention_mask.bool())
        completions = tok.batch_decode(generated.masked_fill(~response_mask, tok.pad_token_id),
                                       skip_special_tokens=True)
        return RolloutBatch(
            input_ids=sequences[:, :-1],
            attention_mask=attention_mask,
            targets=generated,
            response_mask=response_mask,
            logp_rollout=logp.masked_fill(~response_mask, 0.0),
            routes=routes,
            prompt_len=prompt_len,
            completions=completions,
        )


class BaseRoutedEngine:
    """An engine whose policy routes every token as the frozen ``base`` does (``--routing-replay base``): its
    ``generate`` runs inside :class:`~moestab.routing.base_routing.BaseRouting`, so the routes it returns are the
    base's, and the trainer replays them as R3 replays a rollout's."""

    def __init__(self, engine: HFRolloutEngine, base: PreTrainedModel) -> None:
        if not isinstance(getattr(engine, "model", None), torch.nn.Module):
            raise TypeError(f"{type(engine).__name__} exposes no .model to route as the base; routing-constant runs "
                            "need an engine that generates with a torch model in this process (the HF engine)")
        self.engine = engine
        self.base = base
        self.tokenizer = engine.tokenizer
        BaseRouting(engine.model, base)  # both models' routers checked once, here; each generate skips the check

    def sync_weights(self) -> None:
        self.engine.sync_weights()

    def generate(self, prompts: list[str], *, max_new_tokens: int, temperature: float) -> RolloutBatch:
        with BaseRouting(self.engine.model, self.base, verify=False):
            return self.engine.generate(prompts, max_new_tokens=max_new_tokens, temperature=temperature)
