"""Rollout engines for the multi-process tests (tests/train/test_distributed.py, run by dist_worker.py).

``PerPromptEngine`` samples each sequence from a generator seeded by its prompt, its copy number within the call
and the step (counted by ``sync_weights``): the rollout of a step is then the same whether one process samples all
of it or two processes sample half each, so a one-process and a two-process run see the same data.
It samples with its own unsharded copy of the policy, like the HF engine under ``--nproc``.
"""

from __future__ import annotations

import os
import signal
import zlib
from collections import Counter

import torch

from moestab.recording.batch import RolloutBatch, response_mask_from_tokens
from moestab.routing import RoutingRecorder
from moestab.train.distributed import full_state_dict, unsharded_copy, world_from_env


class PerPromptEngine:
    def __init__(self, model, tokenizer, *, dtype=None, gates=False) -> None:
        self.policy, self.tokenizer, self.gates = model, tokenizer, gates
        self.model = unsharded_copy(model, dtype or model.dtype)
        self.rounds = 0

    def sync_weights(self) -> None:
        self.model.load_state_dict(full_state_dict(self.policy))
        self.rounds += 1

    @torch.no_grad()
    def generate(self, prompts, *, max_new_tokens, temperature) -> RolloutBatch:
        tok = self.tokenizer
        copies: Counter[str] = Counter()
        generators = []
        for prompt in prompts:
            seed = zlib.crc32(prompt.encode()) + 1009 * copies[prompt] + 7919 * self.rounds
            generators.append(torch.Generator().manual_seed(seed))
            copies[prompt] += 1
        enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        prompt_len = enc.input_ids.shape[1]
        generated = torch.full((len(prompts), max_new_tokens), tok.pad_token_id)  # [B, T]
        for i in range(len(prompts)):  # one row at a time: a row's tokens never depend on the other rows
            seq = enc.input_ids[i][enc.attention_mask[i].bool()][None]  # [1, p]
            for t in range(max_new_tokens):
                logits = self.model(input_ids=seq, use_cache=False).logits[0, -1]  # [V]
                token = torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1, generator=generators[i])
                generated[i, t] = token
                seq = torch.cat([seq, token[None]], dim=1)
                if int(token) == tok.eos_token_id:
                    break
        response_mask = response_mask_from_tokens(generated, tok.eos_token_id)  # [B, T]
        keep = int(response_mask.sum(-1).max())
        generated, response_mask = generated[:, :keep], response_mask[:, :keep]
        attention_mask = torch.cat([enc.attention_mask, response_mask[:, :-1].long()], dim=1)  # [B, L]
        inputs = torch.cat([enc.input_ids, generated[:, :-1]], dim=1)  # [B, L]
        with RoutingRecorder(self.model, margin=False, entropy=False, gates=self.gates) as rec:
            logits = self.model(input_ids=inputs, attention_mask=attention_mask, use_cache=False).logits
        logp = torch.log_softmax(logits[:, prompt_len - 1 :].float() / temperature, -1)
        logp = logp.gather(-1, generated.unsqueeze(-1)).squeeze(-1)  # [B, T]
        texts = tok.batch_decode(generated.masked_fill(~response_mask, tok.pad_token_id), skip_special_tokens=True)
        return RolloutBatch(input_ids=inputs, attention_mask=attention_mask, targets=generated,
                            response_mask=response_mask, logp_rollout=logp.masked_fill(~response_mask, 0.0),
                            routes=rec.routes, prompt_len=prompt_len, completions=texts)


class DyingEngine(PerPromptEngine):
    """Rank 1 is killed (SIGKILL, as by the kernel's OOM killer) when it samples step 2."""

    def generate(self, prompts, **kwargs) -> RolloutBatch:
        if world_from_env().rank == 1 and self.rounds == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().generate(prompts, **kwargs)


ENGINES = {"per-prompt": PerPromptEngine, "dying": DyingEngine}
