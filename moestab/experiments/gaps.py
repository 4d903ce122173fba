"""The rollout->trainer gap three ways on the same bf16-sampled tokens: free routing, forced experts (R3), forced
experts and gates (TRR). Used by scripts/replay_gaps.py, notebooks/04 and bench/gpu_check.py."""

from __future__ import annotations

import random

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from moestab.metrics.mismatch import estimator_agreement, mismatch_stats
from moestab.metrics.routes import intersection_sizes, route_change
from moestab.recording.batch import RolloutBatch
from moestab.tasks import task_from_spec
from moestab.train import TrainConfig
from moestab.train.forward import chunked_policy_forward, response_routes
from moestab.train.recipe import base_policy_path
from moestab.train.rollout import HFRolloutEngine

SIDES = (("free routing", {}), ("R3: forced experts", {"replay": True}),
         ("TRR: forced experts and gates", {"replay": True, "force_gates": True}))


def replay_gaps(
    seed: int, task_spec: str, prompts: int, cache_dir: str | None = None, *, device: str = "cpu",
    trainer_dtypes: tuple[torch.dtype, ...] = (torch.float32,), **config_fields
) -> dict[str, float]:
    """k1 / k3 / F(2) of each side against the rollout, and free routing's router / token flips (percent), for
    the warm-started base of ``TrainConfig(task=task_spec, seed=seed, **config_fields)`` on ``device``. For free
    routing also the check of k1 against k3 on these sampled tokens
    (:func:`~moestab.metrics.mismatch.estimator_agreement`, standard errors over sequences): ``k1 se``, ``k3 se``,
    ``k1 - k3``, ``k1 - k3 se``, ``min k3 term``. ``trainer_dtypes``: :func:`policy_gaps`'s."""
    config = TrainConfig(task=task_spec, seed=seed, cache_dir=cache_dir, **config_fields)
    task = task_from_spec(config.task)
    path, _ = base_policy_path(config, task, log=lambda s: None)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    texts = [ex.prompt for ex in task.sample(prompts, random.Random(seed))]
    return policy_gaps(model, tokenizer, texts, max_new_tokens=task.max_answer_chars + 1, seed=seed,
                       trainer_dtypes=trainer_dtypes)


def policy_gaps(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: list[str], *, max_new_tokens: int, seed: int,
    trainer_dtypes: tuple[torch.dtype, ...] = (torch.float32,),
) -> dict[str, float]:
    """The three gaps of :func:`replay_gaps` for any float32 ``model`` (on its device): a bf16 rollout engine samples
    ``texts`` (temperature 1), then a trainer in each of ``trainer_dtypes`` scores the same tokens. The float32
    trainer is ``model`` itself and its keys are :func:`replay_gaps`'s; another dtype's keys start with its name
    (``"bfloat16 trainer, free routing: k3"``); a bf16 trainer holds the rollout engine's own weights, so its gap is
    the one between ``generate()`` and a full forward of the same weights."""
    engine = HFRolloutEngine(model, tokenizer, dtype=torch.bfloat16, gates=True)
    torch.manual_seed(seed)
    batch = engine.generate(texts, max_new_tokens=max_new_tokens, temperature=1.0)
    out: dict[str, float] = {"response tokens": float(batch.response_mask.sum())}
    for dtype in trainer_dtypes:
        trainer = model if dtype == model.dtype else engine.model if dtype == engine.model.dtype else None
        if trainer is None:
            raise ValueError(f"trainer dtype {dtype}: the trainers are the model ({model.dtype}) and the rollout "
                             f"engine's copy ({engine.model.dtype})")
        prefix = "" if trainer is model else f"{str(dtype).removeprefix('torch.')} trainer, "
        out.update({prefix + key: value for key, value in _sides(trainer, batch).items()})
    return out


def _sides(model: PreTrainedModel, batch: RolloutBatch) -> dict[str, float]:
    """Each of :data:`SIDES` of ``model`` against ``batch``'s rollout, on the response tokens."""
    mask = batch.response_mask  # [B, T]
    host_mask = mask.cpu()  # [B, T]
    sequence = torch.arange(batch.batch_size)[:, None].expand(mask.shape)[host_mask].numpy()  # [tokens] row of each
    logp_rollout = batch.logp_rollout[mask].float().cpu().numpy()  # [tokens]
    chunks = list(torch.arange(batch.batch_size).split(64))
    out: dict[str, float] = {}
    for name, how in SIDES:  # no grad: the three forwards are measurements
        with torch.no_grad():
            fwd = chunked_policy_forward(model, batch, chunks, temperature=1.0, replay=batch.routes if how else None,
                                         force_gates=how.get("force_gates", False), record=not how)
        logp = fwd.logp[mask].float().cpu().numpy()  # [tokens]
        stats = mismatch_stats(logp, logp_rollout)
        out.update({f"{name}: k1": stats["k1"], f"{name}: k3": stats["k3"], f"{name}: F(2)": stats["f2"]})
        if not how:  # the replayed sides use the rollout's experts by construction
            out.update(_agreement(logp, logp_rollout, sequence))
            inter = intersection_sizes(response_routes(fwd.routes, batch)[mask].cpu().numpy(),
                                       response_routes(batch.routes, batch)[mask].cpu().numpy())
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
