"""The GSPO/GRPO training loop with Routing Replay off / R2 / R3 (``moestab train``).

Modules: ``config`` (TrainConfig), ``recipe`` (what the probes share with training: device, base policy, loading
it, step settings), ``warm_start`` and ``router_losses`` (the warm-started base), ``base_fingerprint`` (which base a
run routes by), ``route_bases`` (the frozen models a run routes by or measures against), ``engine`` (the rollout-engine
contract), ``rollout`` (the HF generate engine), ``vllm_engine``, ``vllm_support`` and ``vllm_worker`` (the vLLM
engine), ``forward`` (policy forward with replay/recording), the step: ``step`` (its spine), ``step_settings`` (what
it needs to know, its seeds), ``step_sample`` (rollout and rewards), ``step_update`` (pi_old and the minibatch
updates), ``step_forwards`` (its forwards for the measurements); ``history`` (history resampling), ``evaluate``,
``optim``, ``checkpoint`` (the weights and training state a checkpoint holds), ``run_lifetime`` (the run's lifetime in
its folder: lock, status, signals, how it ended), ``interrupt`` (deferred Ctrl-C), ``threads``, ``distributed`` and
``launch`` (``--nproc``), ``key_owners`` (which function computes each metrics.jsonl key), ``loop`` (the loop, in its
phases). What a step computed and how it is recorded (token layout, step tensors, metrics, token tables) is the
recording layer's, :mod:`moestab.recording`, which every trainer calls; the run folder itself is
:class:`moestab.run_folder.RunFolder`'s.

``TrainConfig`` imports no torch; the loop's names are imported on first use (PEP 562 ``__getattr__``), so
``moestab train --help`` builds its flags from ``TrainConfig`` without loading torch and transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from moestab.train.config import TrainConfig

if TYPE_CHECKING:
    from moestab.train.loop import RunResult, train
    from moestab.train.run_lifetime import TrainingError

__all__ = ["RunResult", "TrainConfig", "TrainingError", "train", "warm_started_base"]


def __getattr__(name: str) -> object:
    """The loop's names, imported when first asked for."""
    if name in ("RunResult", "train"):
        from moestab.train import loop

        return getattr(loop, name)
    if name == "warm_started_base":
        from moestab.train.recipe import warm_started_base

        return warm_started_base
    if name == "TrainingError":
        from moestab.train.run_lifetime import TrainingError

        return TrainingError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
