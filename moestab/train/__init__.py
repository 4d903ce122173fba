"""The GSPO/GRPO training loop with Routing Replay off / R2 / R3 (``moestab train``).

Modules: ``config`` (TrainConfig), ``rollout`` (HF generate engine), ``batch`` (token layout),
``forward`` (policy forward with replay/recording), ``step`` (one RL step, in phases), ``step_tensors``
(what a step computed per token), ``step_metrics`` (its metrics.jsonl line, via ``moestab.metrics``),
``token_table`` (per-token records), ``checkpoint``, ``warm_start``, ``threads``, ``evaluate``, ``loop``.
"""

from moestab.train.config import TrainConfig
from moestab.train.loop import RunResult, TrainingError, train

__all__ = ["RunResult", "TrainConfig", "TrainingError", "train"]
