"""RL objectives as pure, tested functions: log-probs, ratios, advantages, KL, policy losses, presets.

Calling surface for a training loop (shapes: ``B`` sequences of ``T`` response positions)::

    from moestab import rl

    preset = rl.get_preset(name)                       # grpo | gspo | gspo-token | dapo | dr-grpo | cispo | gmpo | rspo
    advantages = rl.compute_advantages(preset.advantage, rewards, group_size)   # [B] from rewards [B]

    logp = rl.token_logprobs(logits, tokens, temperature=sampling_temperature)  # [B, T], with grad
    runtime = {}                                       # what preset.runtime_inputs names, e.g.
    #   norm_constant=max_response_tokens              (dr-grpo: seq-mean-token-sum-norm)
    #   router_logp_new=..., router_logp_old=...       (rspo: [B, T, layers, top_k])
    #   ref_logp=...                                   (only if kl_coef > 0)
    kwargs = dict(logp=logp, old_logp=old_logp, advantages=advantages, mask=mask,
                  **preset.loss_kwargs(), **runtime)   # level, clip_low, clip_high, aggregation, kl_coef[, gamma_min]
    loss, metrics = rl.compute_policy_loss(preset.loss, **kwargs)    # 0-dim loss; dict of detached 0-dim tensors
    clipped = rl.compute_clipped_mask(preset.loss, **kwargs)         # [B, T] bool, the per-token `clipped` column

Spelling the settings out instead of ``loss_kwargs()`` is equivalent::

    loss, metrics = rl.compute_policy_loss(preset.loss, logp=..., old_logp=..., advantages=..., mask=...,
                                           level=preset.level, clip_low=preset.clip_low,
                                           clip_high=preset.clip_high, aggregation=preset.aggregation, **extra)

Conventions:

- every tensor argument is explicit; every loss is a pure function registered in ``LOSSES`` by one declaration,
  ``@objective(name, ...)`` on a function of ``LossInputs`` (``moestab.rl.objectives``; no config objects);
- ``advantages`` is ``[B]`` (per sequence) or ``[B, T]`` (per token; not for ``level="sequence"`` nor GMPO);
- ``mask`` is the response mask; values of other tensors at masked positions are never read (NaN padding is
  safe); an all-masked row contributes nothing (see ``moestab.rl.aggregation``);
- ``old_logp``, ``advantages``, ``ref_logp`` and the router log-probs are constants (detached);
- a bad name raises ``UnknownNameError`` (a ``KeyError`` and a ``ValueError``) listing the valid names;
  other bad input raises ``ValueError`` saying what is expected.

Formulas, metric keys and presets are documented in docs/objectives.md.
"""

from moestab.rl.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    group_centered_advantages,
    group_normalized_advantages,
)
from moestab.rl.aggregation import AGGREGATIONS, aggregate, shard_weight
from moestab.rl.errors import UnknownNameError
from moestab.rl.kl import kl_k1, kl_k1_per_token, kl_k3, kl_k3_per_token
from moestab.rl.logprobs import token_entropy, token_logprobs
from moestab.rl.losses import cispo_loss, gmpo_loss, policy_loss, rspo_loss
from moestab.rl.masking import as_bool_mask, masked_mean, masked_row_mean, response_lengths
from moestab.rl.objectives import (
    LEVELS,
    LossInputs,
    LossParts,
    LossTerms,
    Objective,
    objective,
    scoped_objectives,
)
from moestab.rl.presets import PRESETS, AlgorithmPreset, get_preset
from moestab.rl.ratios import (
    sequence_log_ratios,
    sequence_ratios,
    sequence_token_ratios,
    token_log_ratios,
    token_ratios,
)
from moestab.rl.registry import (
    LOSSES,
    compute_clipped_mask,
    compute_loss_parts,
    compute_policy_loss,
    get_loss,
)
from moestab.rl.router_shift import router_shift_weights

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "LEVELS",
    "LOSSES",
    "PRESETS",
    "AlgorithmPreset",
    "LossInputs",
    "LossParts",
    "LossTerms",
    "Objective",
    "UnknownNameError",
    "aggregate",
    "as_bool_mask",
    "cispo_loss",
    "compute_advantages",
    "compute_clipped_mask",
    "compute_loss_parts",
    "compute_policy_loss",
    "get_loss",
    "get_preset",
    "gmpo_loss",
    "group_centered_advantages",
    "group_normalized_advantages",
    "kl_k1",
    "kl_k1_per_token",
    "kl_k3",
    "kl_k3_per_token",
    "masked_mean",
    "masked_row_mean",
    "objective",
    "policy_loss",
    "response_lengths",
    "router_shift_weights",
    "rspo_loss",
    "scoped_objectives",
    "sequence_log_ratios",
    "sequence_ratios",
    "sequence_token_ratios",
    "shard_weight",
    "token_entropy",
    "token_log_ratios",
    "token_logprobs",
    "token_ratios",
]
