"""``--rollout-engine vllm``: rollouts sampled by vLLM with per-token log-probs and the routed experts of every
token (``enable_return_routed_experts``), converted into moestab's ``RolloutBatch`` / ``Routes``.

vLLM 0.33 returns, per completion, ``routed_experts`` ``[prompt_len + generated - 1, decoder_layers, top_k]``
(uint8 / uint16 expert ids, every decoder layer, the last sampled token never fed back); earlier releases split off
the prompt's as ``RequestOutput.prompt_routed_experts``. Both are read by ``moestab.routes_in.placement``, which
also places them like the Hugging Face engine's recorder: left-padded prompt, then the response inputs, -1
everywhere else. Nothing is ever filled in: a missing route is an error.

vLLM needs a CUDA GPU; ``require_vllm`` says so at start-up, before anything is written. It returns expert ids, not
gate weights, so TRR (``--routing-replay rollout-gates``) needs the Hugging Face engine.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from moestab.extras import install_line
from moestab.recording.batch import RolloutBatch, response_mask_from_tokens
from moestab.routes_in.placement import expert_ids, place_rows, vllm_rows
from moestab.routing import find_routers
from moestab.routing.routes import Routes
from moestab.train.distributed import full_state_dict, world_from_env

VLLM_HELP = (f"install the optional extra ({install_line('vllm')}, vLLM >= 0.33 on Linux with a CUDA GPU), or use "
             "--rollout-engine hf")


def require_vllm(device: torch.device) -> None:
    """Raise ``ValueError`` unless vLLM can sample here: importable, and the run on a CUDA device."""
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise ValueError(f"--rollout-engine vllm: vLLM is not installed ({exc}); {VLLM_HELP}") from exc
    if device.type != "cuda":
        raise ValueError(f"--rollout-engine vllm: vLLM samples on a CUDA GPU and this run's device is {device.type}; "
                         "run with --device cuda on a machine with a GPU, or use --rollout-engine hf")


def routes_from_vllm(
    routed: Sequence[np.ndarray | None],
    prompt_routed: Sequence[np.ndarray | None],
    prompt_lens: Sequence[int],
    response_lens: Sequence[int],
    prompt_width: int,
    length: int,
    layers: tuple[int, ...],
    decoder_layers: int,
    num_experts: int,
) -> Routes:
    """vLLM's per-request routes as one ``Routes`` ``[B, length, layers, top_k]`` in the trainer's layout.

    ``routed[i]``: request ``i``'s ``CompletionOutput.routed_experts``; ``prompt_routed[i]``: its
    ``RequestOutput.prompt_routed_experts`` (``None`` in vLLM 0.33's one-array layout; both read by
    :func:`~moestab.routes_in.placement.vllm_rows`). The layer axis is either every decoder layer
    (``decoder_layers`` rows, vLLM 0.33: the MoE ones, ``layers``, are kept) or the MoE layers only. Row ``i``'s
    ``prompt_lens[i]`` prompt routes end at column ``prompt_width`` (left padding); its first ``response_lens[i] - 1``
    response routes follow. ``ValueError`` when vLLM returned no routes, fewer than that, routes of another shape,
    or ids that are not experts (:func:`~moestab.routes_in.placement.expert_ids`): nothing is filled in.
    """
    if any(r is None for r in routed):
        raise ValueError("vLLM returned no routed experts for some requests: the engine must be built with "
                         "enable_return_routed_experts=True, and vLLM refuses it for some setups (pipeline "
                         "parallelism, prefix caching off, a model it cannot capture); never filled in by moestab")
    rows = []
    for i, (arr, head, p) in enumerate(zip(routed, prompt_routed, prompt_lens, strict=True)):
        field = f"request {i}'s routed_experts"
        seq, _ = vllm_rows(np.asarray(arr), None if head is None else np.asarray(head), int(p), start=0, field=field,
                           prompt_field=f"request {i}'s prompt_routed_experts")
        if seq.ndim != 3 or seq.shape[1] not in (decoder_layers, len(layers)):
            raise ValueError(f"vLLM returned {field} of shape {list(seq.shape)}; expected [tokens, layers, top_k] with "
                             f"one layer row per decoder layer ({decoder_layers}) or per MoE layer ({len(layers)})")
        if seq.shape[1] != len(layers):
            seq = seq[:, list(layers)]  # [tokens, moe_layers, top_k]: vLLM 0.33 has a row for every decoder layer
        rows.append(expert_ids(seq, field, num_experts))  # [tokens, moe_layers, top_k] int16
    indices, _ = place_rows(rows, [int(p) for p in prompt_lens], [int(r) for r in response_lens],
                            starts=[0] * len(rows), prompt_width=prompt_width, length=length,
                            field="vLLM's routed experts")  # [B, length, layers, top_k]
    return Routes(indices=torch.from_numpy(indices), layers=layers, num_experts=num_experts)


def _load_weights(worker, named: list[tuple[str, torch.Tensor]]) -> None:
    """Runs on each vLLM worker (``LLM.collective_rpc``): load the trainer's weights into its model."""
    worker.model_runner.model.load_weights(weights=named)


class VLLMRolloutEngine:
    """Samples with an in-process ``vllm.LLM`` built from the policy; weights pushed to it before every rollout."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, dtype: torch.dtype | None = None,
                 gates: bool = False, llm=None) -> None:
        """``llm``: an already built ``vllm.LLM`` (tests pass a stand-in); default: one built from a snapshot of
        ``model`` with ``enable_return_routed_experts=True``."""
        if gates:
            raise ValueError("--rollout-engine vllm returns expert ids, not gate weights: --routing-replay "
                             "rollout-gates (TRR) needs --rollout-engine hf")
        if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer needs eos and pad tokens for batched generation")
        self.policy = model
        self.tokenizer = tokenizer
        sites = find_routers(model, verify=False)
        self.layers = tuple(s.layer for s in sites)
        self.num_experts = sites[0].num_experts
        self.decoder_layers = int(model.config.get_text_config().num_hidden_layers)
        if llm is None:
            import vllm

            world = world_from_env()
            self._snapshot = tempfile.TemporaryDirectory(prefix="moestab-vllm-")
            model.save_pretrained(self._snapshot.name, state_dict=full_state_dict(model))  # a collective if sharded
            tokenizer.save_pretrained(self._snapshot.name)
            name = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
            # Under torchrun every process keeps its own engine on its own GPU, as TRL's colocate mode does
            # ("external_launcher": vLLM joins the launcher's processes instead of spawning workers).
            launcher = {"distributed_executor_backend": "external_launcher"} if world.distributed else {}
            llm = vllm.LLM(model=str(Path(self._snapshot.name)), dtype=name[dtype or model.dtype],
                           enable_return_routed_experts=True, enable_prefix_caching=True, seed=world.rank,
                           logprobs_mode="processed_logprobs",  # after temperature, as the trainer computes
                           **launcher)
        self.llm = llm

    def sync_weights(self) -> None:
        named = [(k, v.detach()) for k, v in full_state_dict(self.policy).items()]
        self.llm.collective_rpc(_load_weights, args=(named,))

    @torch.no_grad()
    def generate(self, prompts: list[str], *, max_new_tokens: int, temperature: float) -> RolloutBatch:
        from vllm import SamplingParams  # the stand-in in tests provides it too

        tok = self.tokenizer
        enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        prompt_ids = [ids[mask.bool()].tolist() for ids, mask in zip(enc.input_ids, enc.attention_mask, strict=True)]
        params = SamplingParams(temperature=temperature, top_k=-1, top_p=1.0, max_tokens=max_new_tokens,
                                logprobs=0, stop_token_ids=[tok.eos_token_id])
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params)
        completions = [o.outputs[0] for o in outputs]
        width = max(len(c.token_ids) for c in completions)
        generated = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)  # [B, T]
        logp = torch.zeros(len(prompts), width)  # [B, T]
        for i, c in enumerate(completions):
            generated[i, : len(c.token_ids)] = torch.tensor(c.token_ids)
            # logprobs=0 returns the sampled token's log-prob for each position
            logp[i, : len(c.token_ids)] = torch.tensor([step[t].logprob for step, t in zip(c.logprobs, c.token_ids,
                                                                                          strict=True)])
        response_mask = response_mask_from_tokens(generated, tok.eos_token_id)  # [B, T]
        prompt_len = enc.input_ids.shape[1]
        attention_mask = torch.cat([enc.attention_mask, response_mask[:, :-1].long()], dim=1)  # [B, L]
        sequences = torch.cat([enc.input_ids, generated], dim=1)  # [B, P + T]
        routes = routes_from_vllm(
            [c.routed_experts for c in completions], [getattr(o, "prompt_routed_experts", None) for o in outputs],
            prompt_lens=[len(ids) for ids in prompt_ids], response_lens=response_mask.sum(-1).tolist(),
            prompt_width=prompt_len, length=sequences.shape[1] - 1, layers=self.layers,
            decoder_layers=self.decoder_layers, num_experts=self.num_experts,
        )
        texts = tok.batch_decode(generated.masked_fill(~response_mask, tok.pad_token_id), skip_special_tokens=True)
        return RolloutBatch(
            input_ids=sequences[:, :-1], attention_mask=attention_mask, targets=generated,
            response_mask=response_mask, logp_rollout=logp.masked_fill(~response_mask, 0.0), routes=routes,
            prompt_len=prompt_len, completions=texts,
        )
