"""Tiny, randomly initialised configs of every supported MoE family (for tests, probes and ``embedded:family=``).

Sizes are deliberately small so that a forward runs in milliseconds on a CPU; the family-specific routing features
(shared experts, grouped bias-corrected selection, dense first layers, hybrid layer stacks) are kept. The six
``CORE_FAMILIES`` have hand-written configs and the deepest tests; every other family is built from its transformers
config class by one generic rule (``_generic``): the common size fields set where the class has them, plus the few
family-specific fields in ``FAMILY_FIELDS`` that keep it small, valid and representative.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import (
    AutoConfig,
    DeepseekV3Config,
    GptOssConfig,
    MixtralConfig,
    OlmoeConfig,
    PretrainedConfig,
    Qwen2MoeConfig,
    Qwen3MoeConfig,
)


def _qwen3_moe(vocab: int, hidden: int, layers: int, experts: int, top_k: int, **ids: int) -> PretrainedConfig:
    return Qwen3MoeConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, moe_intermediate_size=hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
        num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=True, max_position_embeddings=512, **ids,
        decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=True,
    )


def _qwen2_moe(vocab: int, hidden: int, layers: int, experts: int, top_k: int, **ids: int) -> PretrainedConfig:
    return Qwen2MoeConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, moe_intermediate_size=hidden,
        shared_expert_intermediate_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=False,
        max_position_embeddings=512, **ids, decoder_sparse_step=1, mlp_only_layers=[],
    )


def _olmoe(vocab: int, hidden: int, layers: int, experts: int, top_k: int, **ids: int) -> PretrainedConfig:
    return OlmoeConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=4, num_experts=experts, num_experts_per_tok=top_k,
        norm_topk_prob=False, max_position_embeddings=512, **ids,
    )


def _mixtral(vocab: int, hidden: int, layers: int, experts: int, top_k: int, **ids: int) -> PretrainedConfig:
    return MixtralConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=experts, num_experts_per_tok=top_k,
        max_position_embeddings=512, **ids, router_jitter_noise=0.0,
    )


def _gpt_oss(vocab: int, hidden: int, layers: int, experts: int, top_k: int, **ids: int) -> PretrainedConfig:
    return GptOssConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, num_local_experts=experts,
        num_experts_per_tok=top_k, max_position_embeddings=512, **ids, sliding_window=128,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
    )


def _deepseek_v3(vocab: int, hidden: int, layers: int, experts: int, top_k: int, **ids: int) -> PretrainedConfig:
    # Two expert groups, one kept per token: exercises the grouped, bias-corrected selection.
    # first_k_dense_replace=1 keeps DeepSeek's dense first layer, so MoE layers != decoder layers.
    return DeepseekV3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, moe_intermediate_size=hidden,
        num_hidden_layers=layers + 1, num_attention_heads=4, num_key_value_heads=4,
        n_routed_experts=experts, n_shared_experts=1, num_experts_per_tok=top_k, n_group=2, topk_group=1,
        first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=None,
        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
        max_position_embeddings=512, **ids, rope_interleave=False,
    )


CORE_FAMILIES: tuple[str, ...] = ("qwen3_moe", "qwen2_moe", "olmoe", "mixtral", "gpt_oss", "deepseek_v3")
"""Hand-written configs, tested in depth (record/replay under padding, generate, TRR, slot order, probes)."""

_V3_GROUPS = {"n_group": 2, "num_expert_group": 2, "topk_group": 1, "norm_topk_prob": True,
              "routed_scaling_factor": 2.5}
_MLA = {"q_lora_rank": 16, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
        "num_key_value_heads": 4}

# Per family: fields beyond the common sizes. ``layers`` is a hybrid family's repeating stack of layer kinds (spelled
# per family by _hybrid_fields). Families whose config can put dense layers first get one (_dense_first).
FAMILY_FIELDS: dict[str, dict[str, Any]] = {
    "flex_olmo": {"norm_topk_prob": False},
    "mellum": {"norm_topk_prob": True},
    "qwen3_next": {"norm_topk_prob": True, "layers": "linear,full", "decoder_sparse_step": 1,
                   "mlp_only_layers": [], "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                   "linear_key_head_dim": 8, "linear_value_head_dim": 8},
    "qwen3_5_moe_text": {"layers": "linear,full", "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                         "linear_key_head_dim": 8, "linear_value_head_dim": 8},
    "minimax": {"layers": "linear,full", "block_size": 16},
    "hunyuan_v1_moe": {"use_mixed_mlp_moe": False},
    "jamba": {"layers": "attn,mamba", "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": 8,
              "use_mamba_kernels": False},
    "ernie4_5_moe": {"moe_layer_start_index": 0, "moe_layer_interval": 1, "moe_num_shared_experts": 1},
    "deepseek_v2": {**_MLA, "n_group": 2, "topk_group": 1, "topk_method": "group_limited_greedy",
                    "n_shared_experts": 1, "routed_scaling_factor": 1.5},
    "longcat_flash": {**_MLA, "head_dim": 8, "zero_expert_num": 2, "ffn_hidden_size": 64, "expert_ffn_hidden_size": 32},
    "granitemoehybrid": {"layers": "attention,mamba", "mamba_d_state": 8, "mamba_n_heads": 4,
                         "mamba_n_groups": 1, "mamba_chunk_size": 16, "shared_intermediate_size": 32},
    "cohere2_moe": {"expert_selection_fn": "sigmoid", "norm_topk_prob": True},
    "deepseek_v3": {**_V3_GROUPS, **_MLA, "n_shared_experts": 1},
    "deepseek_v32": {**_V3_GROUPS, **_MLA, "n_shared_experts": 1, "index_n_heads": 2, "index_head_dim": 16,
                     "index_topk": 64},
    "glm4_moe": {**_V3_GROUPS, "n_shared_experts": 1},
    "glm4_moe_lite": {**_V3_GROUPS, **_MLA, "n_shared_experts": 1},
    "glm_moe_dsa": {**_V3_GROUPS, **_MLA, "n_shared_experts": 1, "index_n_heads": 2, "index_head_dim": 16,
                    "index_topk": 64},
    "dots1": {**_V3_GROUPS, "n_shared_experts": 1},
    "kimi_linear": {**_V3_GROUPS, **_MLA, "n_shared_experts": 1, "layers": "kda,full"},
    "bailing_hybrid": {**_V3_GROUPS, **_MLA, "n_shared_experts": 1, "layers": "linear,full"},
    "nemotron_h": {**_V3_GROUPS, "layers": "mamba,moe,attention,moe"},
    "solar_open": {**_V3_GROUPS, "n_shared_experts": 1},
    "mimo_v2_flash": {**_V3_GROUPS, "n_shared_experts": 1},
    "hy_v4": {**_V3_GROUPS},
    "exaone_moe": {**_V3_GROUPS, "n_shared_experts": 1},
    "axk1": {**_V3_GROUPS, **_MLA, "head_dim": 8, "n_shared_experts": 1},
    "axk2": {**_V3_GROUPS, **_MLA, "n_shared_experts": 1},
    "lfm2_moe": {"layers": "conv,full", "num_dense_layers": 0, "use_expert_bias": True, "norm_topk_prob": True},
    "kolibri1": {"norm_topk_prob": True},
    "phimoe": {"router_jitter_noise": 0.01, "input_jitter_noise": 0.0},
    "llama4_text": {"interleave_moe_layer_step": 1, "intermediate_size_mlp": 64, "attention_chunk_size": 64},
}


def _common_fields(vocab: int, hidden: int, layers: int, experts: int, top_k: int) -> dict[str, Any]:
    """Size fields most MoE configs share, under each of the names families use for them."""
    return {
        "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
        "moe_intermediate_size": hidden // 2, "shared_expert_intermediate_size": hidden // 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": hidden // 4, "max_position_embeddings": 512,
        "num_experts": experts, "num_local_experts": experts, "n_routed_experts": experts, "moe_num_experts": experts,
        "num_experts_per_tok": top_k, "moe_topk": top_k, "moe_k": top_k, "tie_word_embeddings": False,
    }


def _generic(family: str) -> Callable[..., PretrainedConfig]:
    fields = dict(FAMILY_FIELDS.get(family, {}))

    def build(vocab: int, hidden: int, layers: int, experts: int, top_k: int, **ids: int) -> PretrainedConfig:
        extra = dict(fields)
        known = _config_keys(family)
        stack = extra.pop("layers", None)
        kinds = stack.split(",") if stack else ["moe"]
        per_repeat = kinds.count("moe") if "moe" in kinds else len(kinds)  # MoE layers in one repeat of the stack
        pattern = kinds * -(-layers // per_repeat)  # enough repeats for `layers` MoE layers
        dense = _dense_first(known)
        if dense:  # the dense first layer takes the stack's first layer kind
            pattern = [kinds[0], *pattern]
        if stack:
            extra.update(_hybrid_fields(family, pattern, hidden))
        if dense == "mlp_layer_types":
            extra["mlp_layer_types"] = ["dense"] + ["sparse"] * (len(pattern) - 1)
        elif dense:
            extra[dense] = 1
        values = {**_common_fields(vocab, hidden, len(pattern), experts, top_k), **ids, **extra}
        return AutoConfig.for_model(family, **{k: v for k, v in values.items() if k in known or k in extra})

    build.__name__ = f"tiny_{family}"
    return build


def _dense_first(known: frozenset[str]) -> str | None:
    """The field that puts dense decoder layers before the MoE layers, in the family's spelling (None: it has none)."""
    return next((n for n in ("mlp_layer_types", "first_k_dense_replace", "num_dense_layers") if n in known), None)


def _config_keys(family: str) -> frozenset[str]:
    base = AutoConfig.for_model(family)
    return frozenset(base.to_dict()) | frozenset(getattr(base, "attribute_map", {}))


def _hybrid_fields(family: str, pattern: list[str], hidden: int) -> dict[str, Any]:
    """How each hybrid family spells its layer stack."""
    if family == "jamba":  # attention every other layer, experts in every layer
        return {"attn_layer_period": 2, "attn_layer_offset": 0, "expert_layer_period": 1, "expert_layer_offset": 0}
    if family in ("qwen3_next", "qwen3_5_moe_text", "minimax"):
        names = {"linear": "linear_attention", "full": "full_attention"}
        return {"layer_types": [names[k] for k in pattern]}
    if family == "granitemoehybrid":  # Mamba heads x head dim = mamba_expand (2) x hidden
        return {"layer_types": pattern, "mamba_d_head": hidden // 2}
    if family == "lfm2_moe":
        return {"layer_types": ["conv" if k == "conv" else "full_attention" for k in pattern]}
    if family == "kimi_linear":
        kda = [i + 1 for i, k in enumerate(pattern) if k == "kda"]
        full = [i + 1 for i, k in enumerate(pattern) if k == "full"]
        return {"linear_attn_config": {"kda_layers": kda, "full_attn_layers": full, "num_heads": 4, "head_dim": 16,
                                       "short_conv_kernel_size": 4}}
    if family == "bailing_hybrid":
        return {"layer_types": ["linear_attention" if k == "linear" else "full_attention" for k in pattern]}
    if family == "nemotron_h":
        symbols = {"mamba": "M", "moe": "E", "attention": "*"}
        return {"hybrid_override_pattern": "".join(symbols[k] for k in pattern), "mamba_num_heads": 4,
                "mamba_head_dim": 16, "n_groups": 1, "ssm_state_size": 8, "chunk_size": 16}
    raise ValueError(f"no hybrid layer rule for {family}")


TINY_CONFIGS: dict[str, Callable[..., PretrainedConfig]] = {
    "qwen3_moe": _qwen3_moe,
    "qwen2_moe": _qwen2_moe,
    "olmoe": _olmoe,
    "mixtral": _mixtral,
    "gpt_oss": _gpt_oss,
    "deepseek_v3": _deepseek_v3,
}
for _family in (
    "flex_olmo", "mellum", "qwen3_next", "qwen3_5_moe_text", "minimax", "hunyuan_v1_moe", "jamba", "ernie4_5_moe",
    "deepseek_v2", "longcat_flash", "granitemoe", "granitemoeshared", "granitemoe_swa", "granitemoehybrid",
    "aria_text", "cohere2_moe", "deepseek_v32", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "dots1", "kimi_linear",
    "bailing_hybrid", "nemotron_h", "solar_open", "mimo_v2_flash", "hy_v4", "exaone_moe", "axk1", "axk2", "afmoe",
    "hy_v3", "minimax_m2", "lfm2_moe", "kolibri1", "laguna", "phimoe", "llama4_text",
):
    TINY_CONFIGS[_family] = _generic(_family)


EXPERT_WIDTH_FIELDS: dict[str, str] = {
    "qwen3_moe": "moe_intermediate_size", "qwen2_moe": "moe_intermediate_size", "olmoe": "intermediate_size",
    "mixtral": "intermediate_size", "gpt_oss": "intermediate_size", "deepseek_v3": "moe_intermediate_size",
}
"""The config field holding a routed expert's FFN width, per family whose width ``tiny_config(expert_width=)`` sets
(the core families; every layer of the first four's MoE stack is an MoE layer, so the field sizes experts only)."""


def tiny_config(
    family: str = "qwen3_moe",
    *,
    vocab_size: int = 128,
    hidden_size: int = 64,
    num_moe_layers: int = 2,
    num_experts: int = 8,
    top_k: int = 2,
    expert_width: int | None = None,
) -> PretrainedConfig:
    """A tiny config of ``family`` with ``num_moe_layers`` MoE layers (DeepSeek-V3 adds a dense first layer);
    ``expert_width``: each routed expert's FFN width (None: the family's tiny default; families in
    :data:`EXPERT_WIDTH_FIELDS` only)."""
    if family not in TINY_CONFIGS:
        raise ValueError(f"unknown MoE family {family!r}; valid: {', '.join(sorted(TINY_CONFIGS))}")
    if hidden_size % 4:
        raise ValueError(f"hidden_size must be a multiple of 4 (4 attention heads), got {hidden_size}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in [1, num_experts={num_experts}], got {top_k}")
    # Special-token ids of moestab's character tokenizer (<pad>=0, <bos>=1, <eos>=2).
    ids = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    config = TINY_CONFIGS[family](vocab_size, hidden_size, num_moe_layers, num_experts, top_k, **ids)
    if expert_width is not None:
        if family not in EXPERT_WIDTH_FIELDS:
            raise ValueError(f"expert_width is not supported for {family}; valid: {', '.join(EXPERT_WIDTH_FIELDS)}")
        setattr(config, EXPERT_WIDTH_FIELDS[family], expert_width)
    return config
