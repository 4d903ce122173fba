"""The rollout->trainer gap three ways on the same bf16-sampled tokens: free routing, forced experts (R3), forced
experts and gates (TRR). Used by scripts/replay_gaps.py and notebooks/04."""

from __future__ import annotations

import random

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from moestab.metrics.mismatch import estimator_agreement, mismatch_stats
from moestab.metrics.routes import intersection_sizes, route_change
from moestab.tasks import task_from_spec
from moestab.train import TrainConfig
from moestab.train.forward import chunked_policy_forward, response_routes
from moestab.train.recipe import base_policy_path
from moestab.train.rollout import HFRolloutEngine

SIDES = (("free routing", {}), ("R3: forced experts", {"replay": True}),
         ("TRR: forced experts and gates", {"replay": True, "force_gates": True}))


def replay_gaps(
    seed: int, task_spec: str, prompts: int, cache_dir: str | None = None, **config_fields
) -> dict[str, float]:
    """k1 / k3 / F(2) of each side against the rollout, and free routing's router / token flips (percent), for
    the warm-started base of ``TrainConfig(task=task_spec, seed=seed, **config_fields)``. For free routing also
    the check of k1 against k3 on these sampled tokens (:func:`~moestab.metrics.mismatch.estimator_agreement`,
    standard errors over sequences): ``k1 se``, ``k3 se``, ``k1 - k3``, ``k1 - k3 se``, ``min k3 term``."""
    config = TrainConfig(task=task_spec, seed=seed, cache_dir=cache_dir, **config_fields)
    task = task_from_spec(config.task)
    path, _ = base_policy_path(config, task, log=lambda s: None)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = HFRolloutEngine(model, tokenizer, dtype=torch.bfloat16, gates=True)
    torch.manual_seed(seed)
    texts = [ex.prompt for ex in task.sample(prompts, random.Random(seed))]
    batch = engine.generate(texts, max_new_tokens=task.max_answer_chars + 1, temperature=1.0)
    mask = batch.response_mask  # [B, T]
    sequence = torch.arange(batch.batch_size)[:, None].expand(mask.shape)[mask].numpy()  # [tokens] row of each
    chunks = list(torch.arange(batch.batch_size).split(64))
    out: dict[str, float] = {"response tokens": float(mask.sum())}
    for name, how in SIDES:  # no grad: the three forwards are measurements
        with torch.no_grad():
            fwd = chunked_policy_forward(model, batch, chunks, temperature=1.0, replay=batch.routes if how else None,
                                         force_gates=how.get("force_gates", False), record=not how)
        stats = mismatch_stats(fwd.logp[mask].numpy(), batch.logp_rollout[mask].numpy())
        out.update({f"{name}: k1": stats["k1"], f"{name}: k3": stats["k3"], f"{name}: F(2)": stats["f2"]})
        if not how:  # the replayed sides use the rollout's experts by construction
            out.update(_agreement(fwd.logp[mask].numpy(), batch.logp_rollout[mask].numpy(), sequence))
            inter = intersection_sizes(response_routes(fwd.routes, batch)[mask].numpy(),
                                       response_routes(batch.routes, batch)[mask].numpy())
            rates = route_change(inter, batch.routes.top_k)
            out["free routing: routers flipped %"] = 100 * float(rates["router_flip"][0])
            out["free routing: tokens with >= 1 flipped layer %"] = 100 * float(rates["token_flip"][0])
    return out


def _agreement(logp_trainer: np.ndarray, logp_rollout: np.ndarray, sequence: np.ndarray) -> dict[str, float]:
    """Free routing's k1-vs-k3 check on the sampled tokens, under :func:`replay_gaps`'s key names."""
    check = estimator_agreement(logp_trainer, logp_rollout, sequence)
    return {"free routing: k1 se": check["k1_se"], "free routing: k3 se": check["k3_se"],
            "free routing: k1 - k3": check["k1_minus_k3"], "free routing: k1 - k3 se": check["k1_minus_k3_se"],
            "free routing: min k3 term": check["min_k3_term"]}
