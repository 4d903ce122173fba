"""The GSPO/GRPO training loop with Routing Replay off / R2 / R3 (``moestab train``).

Modules: ``config`` (TrainConfig), ``rollout`` (HF generate engine), ``forward`` (policy forward with
replay/recording), ``step`` (one RL step, in phases), ``checkpoint``, ``warm_start``, ``threads``, ``evaluate``,
``loop``. What a step computed and how it is recorded (token layout, step tensors, metrics, token tables) is the
recording layer's, :mod:`moestab.recording`, which every trainer calls.
"""

from moestab.train.config import TrainConfig
from moestab.train.loop import RunResult, TrainingError, train

__all__ = ["RunResult", "TrainConfig", "TrainingError", "train"]
