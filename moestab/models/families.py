"""Tiny, randomly initialised configs of every supported MoE family (for tests and probes).

Sizes are deliberately small so that a forward runs in milliseconds on a CPU; the family-specific
routing features (shared experts, grouped bias-corrected selection, router bias) are kept.
"""

from __future__ import annotations

from collections.abc import Callable

from transformers import (
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


TINY_CONFIGS: dict[str, Callable[..., PretrainedConfig]] = {
    "qwen3_moe": _qwen3_moe,
    "qwen2_moe": _qwen2_moe,
    "olmoe": _olmoe,
    "mixtral": _mixtral,
    "gpt_oss": _gpt_oss,
    "deepseek_v3": _deepseek_v3,
}


def tiny_config(
    family: str = "qwen3_moe",
    *,
    vocab_size: int = 128,
    hidden_size: int = 64,
    num_moe_layers: int = 2,
    num_experts: int = 8,
    top_k: int = 2,
) -> PretrainedConfig:
    """A tiny config of ``family`` with ``num_moe_layers`` MoE layers (DeepSeek-V3 adds a dense first layer)."""
    if family not in TINY_CONFIGS:
        raise ValueError(f"unknown MoE family {family!r}; valid: {', '.join(sorted(TINY_CONFIGS))}")
    if hidden_size % 4:
        raise ValueError(f"hidden_size must be a multiple of 4 (4 attention heads), got {hidden_size}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in [1, num_experts={num_experts}], got {top_k}")
    # Special-token ids of moestab's character tokenizer (<pad>=0, <bos>=1, <eos>=2).
    ids = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    return TINY_CONFIGS[family](vocab_size, hidden_size, num_moe_layers, num_experts, top_k, **ids)
