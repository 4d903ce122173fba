"""Second implementations of the rollout-engine contract, for tests/train/test_engine_contract.py.

- ``ReferenceEngine``: samples token by token with full forwards (no KV cache, no ``generate()``), then records the
  routes and log-probs of one teacher-forced forward: the contract written as plainly as possible.
- ``FakeVLLM``: a stand-in for ``vllm.LLM`` (and a ``vllm`` module to go with it) that speaks vLLM's output format:
  per completion ``token_ids``, ``logprobs`` and ``routed_experts`` (without a route for the last sampled token), in
  vLLM 0.33's one array (prompt and response, one uint8 row per decoder layer) or, with ``layout="split"``, the
  earlier releases' split (the prompt's as the request's ``prompt_routed_experts``, int16). It samples with Hugging
  Face ``generate()`` on its own copy of the policy, so ``VLLMRolloutEngine`` runs end to end on a CPU; weights reach
  it only through ``collective_rpc``.
"""

from __future__ import annotations

import copy
import types
from dataclasses import dataclass

import numpy as np
import torch

from moestab.recording.batch import RolloutBatch, response_mask_from_tokens
from moestab.routing import RoutingRecorder


class ReferenceEngine:
    def __init__(self, model, tokenizer, *, dtype=None, gates=False, seed: int = 0) -> None:
        self.model, self.tokenizer, self.gates = model, tokenizer, gates
        self.generator = torch.Generator().manual_seed(seed)

    def sync_weights(self) -> None:  # samples with the trainer's model itself
        pass

    @torch.no_grad()
    def generate(self, prompts, *, max_new_tokens, temperature) -> RolloutBatch:
        tok = self.tokenizer
        enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        seq, mask = enc.input_ids, enc.attention_mask
        done = torch.zeros(len(prompts), dtype=torch.bool)
        was_training = self.model.training
        self.model.eval()
        for _ in range(max_new_tokens):
            logits = self.model(input_ids=seq, attention_mask=mask, use_cache=False).logits[:, -1]  # [B, V]
            token = torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1, generator=self.generator)
            token = token.squeeze(-1).masked_fill(done, tok.pad_token_id)  # [B]
            seq = torch.cat([seq, token[:, None]], dim=1)
            mask = torch.cat([mask, (~done).long()[:, None]], dim=1)
            done |= token == tok.eos_token_id
        prompt_len = enc.input_ids.shape[1]
        generated = seq[:, prompt_len:]  # [B, T]
        response_mask = response_mask_from_tokens(generated, tok.eos_token_id)
        attention_mask = torch.cat([enc.attention_mask, response_mask[:, :-1].long()], dim=1)
        with RoutingRecorder(self.model, margin=False, entropy=False, gates=self.gates) as rec:
            logits = self.model(input_ids=seq[:, :-1], attention_mask=attention_mask, use_cache=False).logits
        self.model.train(was_training)
        logp = torch.log_softmax(logits[:, prompt_len - 1 :].float() / temperature, -1)
        logp = logp.gather(-1, generated.unsqueeze(-1)).squeeze(-1)  # [B, T]
        texts = tok.batch_decode(generated.masked_fill(~response_mask, tok.pad_token_id), skip_special_tokens=True)
        return RolloutBatch(input_ids=seq[:, :-1], attention_mask=attention_mask, targets=generated,
                            response_mask=response_mask, logp_rollout=logp.masked_fill(~response_mask, 0.0),
                            routes=rec.routes, prompt_len=prompt_len, completions=texts)


@dataclass
class _Logprob:
    logprob: float


class FakeSamplingParams:
    def __init__(self, **kwargs) -> None:
        self.__dict__.update(kwargs)


class FakeVLLM:
    """``vllm.LLM``'s surface as VLLMRolloutEngine uses it; ``rpc_calls`` counts weight pushes, ``cache_resets`` the
    prefix-cache resets that follow them."""

    def __init__(self, model, tokenizer, layout: str = "one-array") -> None:
        self.model = copy.deepcopy(model).eval()
        self.tokenizer = tokenizer
        self.layout = layout
        self.rpc_calls = 0
        self.cache_resets = 0

    def collective_rpc(self, method, args=()):
        """The worker extension's method, as moestab.train.vllm_worker names it: loads the folder's weights."""
        from safetensors.torch import load_file

        assert method == "moestab_sync_weights", method
        self.rpc_calls += 1
        self.model.load_state_dict(load_file(f"{args[0]}/model.safetensors"))
        return [0]

    def reset_prefix_cache(self) -> bool:
        self.cache_resets += 1
        return True

    @torch.no_grad()
    def generate(self, requests, params, use_tqdm=True):
        outputs = []
        for request, sp in zip(requests, params, strict=True):  # one SamplingParams per request, as moestab asks
            prompt = torch.tensor([request["prompt_token_ids"]])
            with RoutingRecorder(self.model, margin=False, entropy=False) as rec, torch.random.fork_rng(devices=[]):
                torch.manual_seed(sp.seed)
                out = self.model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=True,
                                          temperature=sp.temperature, top_k=0, top_p=1.0,
                                          max_new_tokens=sp.max_tokens, eos_token_id=sp.stop_token_ids,
                                          pad_token_id=self.tokenizer.pad_token_id, output_logits=True,
                                          return_dict_in_generate=True)
            tokens = out.sequences[0, prompt.shape[1]:].tolist()
            raw = torch.stack(out.logits, dim=1)[0].float()  # [T, V]
            logp = torch.log_softmax(raw / sp.temperature, -1)
            routes = rec.routes.indices[0].numpy()  # [P + T - 1, moe_layers, k]
            logprobs = [{t: _Logprob(float(logp[j, t]))} for j, t in enumerate(tokens)]
            if self.layout == "split":
                completion = types.SimpleNamespace(token_ids=tokens, logprobs=logprobs,
                                                   routed_experts=routes[prompt.shape[1]:])
                outputs.append(types.SimpleNamespace(prompt_routed_experts=routes[: prompt.shape[1]],
                                                     outputs=[completion]))
                continue
            every = np.zeros((routes.shape[0], self.model.config.num_hidden_layers, routes.shape[2]), np.uint8)
            every[:, list(rec.routes.layers)] = routes  # [P + T - 1, decoder_layers, k]: dense layers' rows stay 0
            completion = types.SimpleNamespace(token_ids=tokens, logprobs=logprobs, routed_experts=every)
            outputs.append(types.SimpleNamespace(outputs=[completion]))  # vLLM 0.33: no prompt_routed_experts
        return outputs


def fake_vllm_module() -> types.ModuleType:
    module = types.ModuleType("vllm")
    module.SamplingParams = FakeSamplingParams
    return module
