"""One line per MoE family: which module is its router, how it ranks experts and how it weights the chosen ones.

In transformers v5 nearly every MoE family routes through a router module whose forward returns
``(router_logits [tokens, experts], gate_weights [tokens, top_k], expert_indices [tokens, top_k])``; Llama-4's
returns ``(scores [tokens, experts], router_logits)`` and has its own reader / writer here. Recording reads that
output; replay replaces the chosen experts with forced ones and the gates with the family's ``gating`` of the
*current* logits at those experts (so the router still gets gradients), or, with ``force_gates``, with recorded
gates (router frozen).

The routing math is data (``moestab.routing.gating``): most families are one of a few recipes with different
attribute names. ``moestab.routing.verify`` checks, on the model itself, that an adapter's gating reproduces the
router's own gates for the router's own experts and that its selection ranks those experts first, and refuses the
model when it does not (a transformers release that changed a family's math). Adding a family = one line in
``ADAPTERS`` plus a tiny config in ``moestab.models.families``; tests then hold it to every check.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
from torch import nn

from moestab.routing.gating import (
    ChoiceGating,
    DeepseekV2Selection,
    Gating,
    Selection,
    SparseMixerGating,
)

GateFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
"""``(router, logits [N, E], indices [N, k]) -> gates [N, k]``."""
ScoreFn = Callable[[nn.Module, torch.Tensor, tuple[Any, ...]], torch.Tensor]
"""``(router, logits [N, E], router forward args) -> selection scores [N, E]``."""
RouterOutput = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _read_triple(output: Any, top_k: int) -> RouterOutput:
    logits, gates, indices = output[0], output[1], output[2]
    return logits.reshape(-1, logits.shape[-1]), gates.reshape(-1, top_k), indices.reshape(-1, top_k)


def _write_triple(output: Any, logits: torch.Tensor, gates: torch.Tensor, indices: torch.Tensor) -> Any:
    return (logits.view_as(output[0]), gates.view_as(output[1]), indices.view_as(output[2]), *output[3:])


def _read_llama4(output: Any, top_k: int) -> RouterOutput:
    """Llama-4: ``(scores [N, E], logits [N, E])``; scores are sigmoid(logit) at the top-k, 0 elsewhere."""
    scores, logits = output[0], output[1]
    indices = logits.topk(top_k, dim=-1).indices  # [N, k], the family's own choice
    return logits, scores.gather(-1, indices), indices


def _write_llama4(output: Any, logits: torch.Tensor, gates: torch.Tensor, indices: torch.Tensor) -> Any:
    scores = torch.zeros_like(output[0]).scatter(-1, indices, gates.to(output[0].dtype))  # [N, E]
    return (scores, logits)


@dataclass(frozen=True)
class RouterAdapter:
    """How moestab reads and forces the routing decision of one MoE family."""

    family: str
    """The transformers ``model_type`` of the decoder that holds the router."""
    router_class: str
    """Dotted path of the router module class in transformers."""
    gates: GateFn
    """``(router, logits [N, E], indices [N, k]) -> gate weights [N, k]`` with the family's normalisation."""
    selection_scores: ScoreFn
    """``(router, logits [N, E], router forward args) -> [N, E]``: the scores the family ranks to pick its top-k."""
    num_experts_attr: str = "num_experts"
    """Router attribute holding the number of experts the router scores."""
    read: Callable[[Any, int], RouterOutput] = _read_triple
    """``(router output, top_k) -> (logits [N, E], gates [N, k], indices [N, k])``."""
    write: Callable[[Any, torch.Tensor, torch.Tensor, torch.Tensor], Any] = _write_triple
    """``(router output, logits, gates, indices) -> router output`` in the family's own format."""
    training_replay: str | None = None
    """Why replay is not exact while the router is in training mode (None: it is)."""
    router_input_dims: int = 2
    """Rank of the hidden states the MoE block hands its router (``[N, hidden]``, or 3 for ``[batch, seq, hidden]``)."""
    min_transformers: str | None = None
    """The oldest transformers release whose router this adapter reproduces, when that is newer than pyproject's
    lower bound (found by running tests/routing at each release: scripts/bisect_versions.py, docs/families.md); the
    family is refused on older releases instead of the floor being raised for every family."""

    def router_type(self) -> type[nn.Module] | None:
        """The router class, or None when this transformers build lacks it."""
        return _import_class(self.router_class)

    def num_experts(self, router: nn.Module) -> int:
        return int(getattr(router, self.num_experts_attr))

    def top_k(self, router: nn.Module) -> int:
        return int(router.top_k)

    def too_old(self, version: str) -> bool:
        """Whether transformers ``version`` predates the release this adapter needs."""
        from packaging.version import Version

        return self.min_transformers is not None and Version(version) < Version(self.min_transformers)

    def describe(self) -> tuple[str, str]:
        """(selection score, gate normalisation) in words, for docs/families.md."""
        return _describe(self.selection_scores), _describe(self.gates)


def _describe(fn: Any) -> str:
    return fn.describe() if hasattr(fn, "describe") else getattr(fn, "__name__", repr(fn))


@dataclass(frozen=True)
class UnsupportedRouting:
    """A family whose routing moestab cannot force exactly, and why."""

    family: str
    module_class: str
    """Class name (not path) of the module that marks the family in a model."""
    reason: str


@cache
def _import_class(dotted: str) -> type[nn.Module] | None:
    # Cached: discovery asks for every (module, adapter) pair, and import_module is not free.
    module_path, _, name = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module_path), name)
    except (ImportError, AttributeError):
        return None


# ---- the recipes --------------------------------------------------------------------------------------------
BY_LOGIT = Selection()
SOFTMAX = Gating("softmax")  # softmax over all experts, gathered, not renormalised (Jamba)
SOFTMAX_RENORM = Gating("softmax", renorm=True)  # Mixtral, MiniMax, HunYuan
SOFTMAX_NORM_TOPK = Gating("softmax", renorm="norm_topk_prob")  # Qwen2/3-MoE, OLMoE and their descendants
SOFTMAX_TOPK = Gating("softmax_topk")  # softmax over the chosen logits only, in float32: Granite-MoE
SOFTMAX_TOPK_OWN = Gating("softmax_topk", dtype="logits")  # ... in the logits' dtype: GPT-OSS, Aria
# DeepSeek-V3 and its many descendants: sigmoid scores, bias-corrected group-limited selection, renormalised when
# norm_topk_prob, scaled by routed_scaling_factor.
V3_GATES = Gating("sigmoid", renorm="norm_topk_prob", eps=1e-20, scale="routed_scaling_factor")
V3_SELECTION = Selection("sigmoid", bias="e_score_correction_bias", groups=True)


TRANSFORMERS_FLOORS: dict[str, str] = {
    "laguna": "5.7.0",
    "mellum": "5.10.1",
    "cohere2_moe": "5.13.0", "deepseek_v2": "5.13.0", "deepseek_v3": "5.13.0", "deepseek_v32": "5.13.0",
    "dots1": "5.13.0", "ernie4_5_moe": "5.13.0", "exaone_moe": "5.13.0", "glm4_moe": "5.13.0",
    "glm_moe_dsa": "5.13.0", "hunyuan_v1_moe": "5.13.0", "lfm2_moe": "5.13.0", "mimo_v2_flash": "5.13.0",
    "nemotron_h": "5.13.0", "phimoe": "5.13.0", "solar_open": "5.13.0",
    "axk1": "5.15.1", "axk2": "5.15.1", "glm4_moe_lite": "5.15.1", "granitemoe_swa": "5.15.1",
    "hy_v4": "5.17.0", "kimi_linear": "5.17.0",
    "longcat_flash": "5.19.0",
    "bailing_hybrid": "5.20.2", "kolibri1": "5.20.2",
    "aria_text": "5.21.1", "granitemoe": "5.21.1", "granitemoehybrid": "5.21.1", "granitemoeshared": "5.21.1",
    "jamba": "5.21.1",
}
"""Family -> the oldest transformers release from which its tests pass at every release run (where that is newer than
pyproject's lower bound): ``RouterAdapter.min_transformers``. Found by scripts/bisect_versions.py, one fresh venv per
release; the releases run and each family's outcome at each are in docs/versions.md. Below its floor a family's router
returns another output (logits only, or probabilities), lacks the attributes its adapter reads, or is absent."""


def _r(family: str, router: str, gates: GateFn = SOFTMAX_NORM_TOPK, selection: ScoreFn = BY_LOGIT,
       module: str | None = None, **extra: Any) -> RouterAdapter:
    package = module or family
    return RouterAdapter(family, f"transformers.models.{package}.modeling_{package}.{router}", gates, selection,
                         min_transformers=TRANSFORMERS_FLOORS.get(family), **extra)


ADAPTERS: tuple[RouterAdapter, ...] = (
    # softmax over all experts, renormalised when norm_topk_prob
    _r("qwen3_moe", "Qwen3MoeTopKRouter"),
    _r("qwen2_moe", "Qwen2MoeTopKRouter"),
    _r("olmoe", "OlmoeTopKRouter"),
    _r("flex_olmo", "FlexOlmoTopKRouter"),
    _r("mellum", "MellumTopKRouter"),
    _r("qwen3_next", "Qwen3NextTopKRouter"),
    _r("qwen3_5_moe_text", "Qwen3_5MoeTopKRouter", SOFTMAX_RENORM, module="qwen3_5_moe"),
    # softmax over all experts, always / never renormalised
    _r("mixtral", "MixtralTopKRouter", SOFTMAX_RENORM),
    _r("minimax", "MiniMaxTopKRouter", SOFTMAX_RENORM),
    _r("hunyuan_v1_moe", "HunYuanMoEV1Gate", SOFTMAX_RENORM),
    _r("jamba", "JambaTopKRouter", SOFTMAX),
    _r("ernie4_5_moe", "Ernie4_5_MoeTopKRouter", Gating("softmax", renorm=True, min_denominator="norm_min"),
       Selection("softmax", bias="moe_statics.e_score_correction_bias")),
    _r("deepseek_v2", "DeepseekV2TopkRouter", Gating("softmax", scale="routed_scaling_factor"),
       DeepseekV2Selection()),
    _r("longcat_flash", "LongcatFlashTopkRouter", Gating("softmax", scale="routed_scaling_factor"),
       Selection("softmax", bias="e_score_correction_bias"), num_experts_attr="n_routed_experts"),
    # softmax over the chosen experts' logits
    _r("gpt_oss", "GptOssTopKRouter", SOFTMAX_TOPK_OWN),
    _r("granitemoe", "GraniteMoeTopKRouter", SOFTMAX_TOPK),
    _r("granitemoeshared", "GraniteMoeSharedTopKRouter", SOFTMAX_TOPK),
    _r("granitemoe_swa", "GraniteMoeSWATopKRouter", SOFTMAX_TOPK),
    _r("granitemoehybrid", "GraniteMoeHybridTopKRouter", SOFTMAX_TOPK),
    _r("aria_text", "AriaTextTopKRouter", SOFTMAX_TOPK_OWN, module="aria"),
    _r("cohere2_moe", "Cohere2MoeTopKRouter", ChoiceGating("expert_selection_fn", (
        ("softmax", SOFTMAX_TOPK), ("sigmoid", Gating("sigmoid", renorm="norm_topk_prob", dtype="logits"))))),
    # sigmoid scores with a correction bias: DeepSeek-V3's recipe, group-limited
    _r("deepseek_v3", "DeepseekV3TopkRouter", V3_GATES, V3_SELECTION),
    _r("deepseek_v32", "DeepseekV32TopkRouter", V3_GATES, V3_SELECTION),
    _r("glm4_moe", "Glm4MoeTopkRouter", V3_GATES, V3_SELECTION),
    _r("glm4_moe_lite", "Glm4MoeLiteTopkRouter", V3_GATES, V3_SELECTION),
    _r("glm_moe_dsa", "GlmMoeDsaTopkRouter", V3_GATES, V3_SELECTION),
    _r("dots1", "Dots1TopkRouter", V3_GATES, V3_SELECTION),
    _r("kimi_linear", "KimiLinearTopkRouter", V3_GATES, V3_SELECTION),
    _r("bailing_hybrid", "BailingHybridTopkRouter", V3_GATES, V3_SELECTION),
    _r("nemotron_h", "NemotronHTopkRouter", V3_GATES, V3_SELECTION),
    _r("solar_open", "SolarOpenTopkRouter", V3_GATES, V3_SELECTION),
    _r("mimo_v2_flash", "MiMoV2FlashTopkRouter", V3_GATES, V3_SELECTION),
    _r("hy_v4", "HYV4TopkRouter", V3_GATES, V3_SELECTION),
    _r("exaone_moe", "ExaoneMoeTopkRouter", V3_GATES, V3_SELECTION),
    _r("axk1", "AXK1TopkRouter", V3_GATES, V3_SELECTION),
    _r("axk2", "AXK2TopkRouter", V3_GATES, V3_SELECTION),
    # sigmoid scores, the bias passed in by the MoE block (forward argument 1)
    _r("afmoe", "AfmoeTokenChoiceRouter", Gating("sigmoid", renorm=True, eps=1e-20, scale="route_scale"),
       Selection("sigmoid", bias=1), router_input_dims=3),
    _r("hy_v3", "HYV3TopKRouter", Gating("sigmoid", renorm=True, eps=1e-20, scale="router_scaling_factor"),
       Selection("sigmoid", bias=1)),
    _r("minimax_m2", "MiniMaxM2TopKRouter", Gating("sigmoid", renorm=True), Selection("sigmoid", bias=1)),
    _r("lfm2_moe", "Lfm2MoeTopKRouter",
       Gating("sigmoid", renorm="norm_topk_prob", eps=1e-6, scale="routed_scaling_factor", dtype="logits"),
       Selection("sigmoid", bias=1, bias_if="use_expert_bias", dtype="logits")),
    # sigmoid gates with the bias kept on the router
    _r("kolibri1", "Kolibri1TopKRouter", Gating("sigmoid_topk", renorm="norm_topk_prob"),
       Selection("logits", bias="e_score_correction_bias")),
    _r("laguna", "LagunaTopKRouter", Gating("sigmoid", renorm=True),
       Selection("sigmoid", bias="e_score_correction_bias")),
    # routers of their own
    _r("phimoe", "PhimoeTopKRouter", SparseMixerGating(),
       training_replay="PhiMoE's SparseMixer samples experts with Gumbel noise and rescales gates at random in "
                       "training mode; replay is exact only in eval mode (model.eval())"),
    _r("llama4_text", "Llama4Router", Gating("sigmoid"), module="llama4", read=_read_llama4, write=_write_llama4),
)

SUPPORTED_FAMILIES: tuple[str, ...] = tuple(a.family for a in ADAPTERS)

_CAPACITY = "encoder-decoder routing with an expert capacity: which tokens are dropped depends on the batch"
UNSUPPORTED: tuple[UnsupportedRouting, ...] = (
    UnsupportedRouting("deepseek_v4", "DeepseekV4HashRouter",
                       "its first layers route by a hash of the token id (no router scores to replay or measure)"),
    UnsupportedRouting("jetmoe", "JetMoeTopKGating",
                       "it routes twice per layer (attention experts and MLP experts) and hands its experts a "
                       "token-sorted layout instead of per-token top-k; one route per layer cannot describe it"),
    UnsupportedRouting("dbrx", "DbrxRouter",
                       "its router returns logits only and the top-k is taken inside DbrxFFN.route_tokens_to_experts, "
                       "a method moestab would have to patch"),
    UnsupportedRouting("switch_transformers", "SwitchTransformersTop1Router",
                       _CAPACITY),
    UnsupportedRouting("nllb_moe", "NllbMoeTop2Router",
                       _CAPACITY),
)
_UNSUPPORTED_CLASSES = frozenset(u.module_class for u in UNSUPPORTED)


def adapter_for(module: nn.Module) -> RouterAdapter | None:
    """The adapter whose router class ``module`` is an instance of: its own class's, else its nearest base's (a family
    derived by inheritance).

    Every module of a model is asked (``find_routers``, each time a recorder or replay is built), so this walks the
    class's MRO through one dict: ``isinstance`` against each of the router classes cost about 3 us per module.
    """
    by_type = _adapters_by_type()
    for cls in type(module).__mro__:
        adapter = by_type.get(cls)
        if adapter is not None:
            return adapter
    return None


def unsupported_for(module: nn.Module) -> UnsupportedRouting | None:
    """The unsupported-family entry ``module`` marks, if any (matched by class name)."""
    name = type(module).__name__
    if name not in _UNSUPPORTED_CLASSES:  # asked for every module of a model: most are not
        return None
    return next(u for u in UNSUPPORTED if u.module_class == name)


def missing_router_class(model_type: str | None) -> RouterAdapter | None:
    """The adapter of ``model_type`` when this transformers build lacks its router class (renamed or removed)."""
    adapter = next((a for a in ADAPTERS if a.family == model_type), None)
    return adapter if adapter is not None and adapter.router_type() is None else None


@cache
def _adapters_by_type() -> dict[type[nn.Module], RouterAdapter]:
    return {t: a for a in ADAPTERS if (t := a.router_type()) is not None}
