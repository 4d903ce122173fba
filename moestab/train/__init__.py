"""The GSPO/GRPO training loop with Routing Replay off / R2 / R3 (``moestab train``).

Modules: ``config`` (TrainConfig), ``recipe`` (what the probes share with training: device, base policy, loading
it, step settings), ``rollout`` (HF generate engine), ``forward`` (policy forward with replay/recording), ``step``
(one RL step, in phases), ``run_folder`` (the run's lifetime in its folder: lock, status, signals, how it ended),
``checkpoint`` (the weights and training state a checkpoint holds), ``warm_start``, ``threads``, ``evaluate``,
``loop`` (the loop, in its phases). What a step computed and how it is recorded (token layout, step tensors,
metrics, token tables) is the recording layer's, :mod:`moestab.recording`, which every trainer calls; the run
folder itself is :class:`moestab.records.RunFolder`'s.
"""

from moestab.train.config import TrainConfig
from moestab.train.loop import RunResult, train
from moestab.train.run_folder import TrainingError

__all__ = ["RunResult", "TrainConfig", "TrainingError", "train"]
