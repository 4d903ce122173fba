"""One small adapter per MoE family: how to recognise its router and how it turns scores into gates.

In transformers v5 every supported family routes through a router module whose forward returns
``(router_logits [tokens, experts], gate_weights [tokens, top_k], expert_indices [tokens, top_k])``.
Recording reads that output (the gate weights as given, with ``RoutingRecorder(gates=True)``); replay
replaces the last two with forced indices and gates recomputed from the *current* logits, so the router
still receives gradients, or, with ``force_gates``, with the recorded gates as given (router frozen).

Adding a family = writing one ``RouterAdapter`` (router class path + gate function) and listing it in
``ADAPTERS``. The gate function must reproduce the family's own gates exactly when given the
family's own indices (tests check this for every adapter).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import torch
from torch import nn

GateFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
ScoreFn = Callable[[nn.Module, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class RouterAdapter:
    """How moestab reads and forces the routing decision of one MoE family."""

    family: str
    """Name of the family (the transformers ``model_type``)."""
    router_class: str
    """Dotted path of the router module class in transformers."""
    gates: GateFn
    """``(router, logits [N, E], indices [N, k]) -> gate weights [N, k]`` with the family's normalisation."""
    selection_scores: ScoreFn
    """``(router, logits [N, E]) -> [N, E]``: the scores the family ranks to pick its top-k."""

    def router_type(self) -> type[nn.Module] | None:
        """The router class, or None when this transformers build lacks the family."""
        return _import_class(self.router_class)

    def num_experts(self, router: nn.Module) -> int:
        return int(router.num_experts)

    def top_k(self, router: nn.Module) -> int:
        return int(router.top_k)


@cache
def _import_class(dotted: str) -> type[nn.Module] | None:
    # Cached: discovery asks for every (module, adapter) pair, and import_module is not free.
    module_path, _, name = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module_path), name)
    except (ImportError, AttributeError):
        return None


def _softmax_gates(router: nn.Module, logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Qwen2/3-MoE, OLMoE: softmax over all experts (float32), gather, optional renormalisation."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)  # [N, E]
    top = probs.gather(-1, indices)  # [N, k]
    if router.norm_topk_prob:
        top = top / top.sum(dim=-1, keepdim=True)
    return top.to(logits.dtype)


def _mixtral_gates(router: nn.Module, logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Mixtral: softmax over all experts in float32, gather, always renormalised (kept in float32)."""
    top = torch.softmax(logits.float(), dim=-1).gather(-1, indices)  # [N, k]
    return top / top.sum(dim=-1, keepdim=True)


def _gpt_oss_gates(router: nn.Module, logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """GPT-OSS: softmax over the chosen experts' logits only."""
    return torch.softmax(logits.gather(-1, indices), dim=-1, dtype=logits.dtype)  # [N, k]


def _deepseek_v3_gates(router: nn.Module, logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3: sigmoid scores (without the selection bias), optional renormalisation, scaling."""
    top = logits.sigmoid().gather(-1, indices)  # [N, k]
    if router.norm_topk_prob:
        top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
    return top * router.routed_scaling_factor


def _logits_as_scores(router: nn.Module, logits: torch.Tensor) -> torch.Tensor:
    # Softmax and top-k-on-logits families rank experts by logit (softmax is monotone).
    return logits


def _deepseek_v3_scores(router: nn.Module, logits: torch.Tensor) -> torch.Tensor:
    """Bias-corrected sigmoid scores, -inf outside the token's selected expert groups."""
    scores = logits.sigmoid() + router.e_score_correction_bias  # [N, E]
    n_tokens, n_experts = scores.shape
    grouped = scores.view(n_tokens, router.num_group, n_experts // router.num_group)  # [N, G, E/G]
    group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # [N, G]
    group_idx = group_scores.topk(router.topk_group, dim=-1, sorted=False).indices  # [N, topk_group]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, group_idx, True)  # [N, G]
    keep = keep.unsqueeze(-1).expand_as(grouped).reshape(n_tokens, n_experts)  # [N, E]
    return scores.masked_fill(~keep, float("-inf"))


_T = "transformers.models"
ADAPTERS: tuple[RouterAdapter, ...] = (
    RouterAdapter("qwen3_moe", f"{_T}.qwen3_moe.modeling_qwen3_moe.Qwen3MoeTopKRouter",
                  _softmax_gates, _logits_as_scores),
    RouterAdapter("qwen2_moe", f"{_T}.qwen2_moe.modeling_qwen2_moe.Qwen2MoeTopKRouter",
                  _softmax_gates, _logits_as_scores),
    RouterAdapter("olmoe", f"{_T}.olmoe.modeling_olmoe.OlmoeTopKRouter", _softmax_gates, _logits_as_scores),
    RouterAdapter("mixtral", f"{_T}.mixtral.modeling_mixtral.MixtralTopKRouter",
                  _mixtral_gates, _logits_as_scores),
    RouterAdapter("gpt_oss", f"{_T}.gpt_oss.modeling_gpt_oss.GptOssTopKRouter",
                  _gpt_oss_gates, _logits_as_scores),
    RouterAdapter("deepseek_v3", f"{_T}.deepseek_v3.modeling_deepseek_v3.DeepseekV3TopkRouter",
                  _deepseek_v3_gates, _deepseek_v3_scores),
)

SUPPORTED_FAMILIES: tuple[str, ...] = tuple(a.family for a in ADAPTERS)


def adapter_for(module: nn.Module) -> RouterAdapter | None:
    """The adapter whose router class ``module`` is an instance of (exact family match first)."""
    exact = _adapters_by_type()
    adapter = exact.get(type(module))
    if adapter is not None:
        return adapter
    for router_type, adapter in exact.items():  # subclasses (e.g. a family derived by inheritance)
        if isinstance(module, router_type):
            return adapter
    return None


@cache
def _adapters_by_type() -> dict[type[nn.Module], RouterAdapter]:
    return {t: a for a in ADAPTERS if (t := a.router_type()) is not None}
