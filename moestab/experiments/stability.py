"""What instability looks like in one run: gradient spikes, collapse and when it happened.

One owner for these measures: the stress sweep (scripts/stress_sweep.py) and notebook 01 both read them here.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from moestab.metrics import keys
from moestab.metrics.collapse_warning import COLLAPSE_DROP
from moestab.run_folder.reader import load_metrics, read_run_info

SPIKE_FACTOR = 3.0
"""A step spikes when its largest minibatch gradient norm exceeds this many times the run's median."""


def grad_spikes(grad_norm_max: pd.Series, factor: float = SPIKE_FACTOR) -> pd.Series:
    """Per step: True where the step's largest minibatch gradient norm exceeds ``factor`` x the run's median."""
    return grad_norm_max > factor * grad_norm_max.median()


def collapse_step(metrics: pd.DataFrame, start_accuracy: float | None, drop: float = COLLAPSE_DROP) -> int | None:
    """The first evaluated step whose eval accuracy is more than ``drop`` below ``start_accuracy``; None if none
    is (or the start is unknown). Resolution is the run's ``eval_every``."""
    if start_accuracy is None or keys.EVAL_ACCURACY not in metrics:
        return None
    evaluated = metrics.dropna(subset=[keys.EVAL_ACCURACY])
    below = evaluated[evaluated[keys.EVAL_ACCURACY] < start_accuracy - drop]
    return int(below[keys.STEP].iloc[0]) if len(below) else None


def run_stability(run: str | Path) -> dict[str, float | None]:
    """One run's instability measures (rates are step means; steps are None when the event did not happen):

    ``start_acc`` / ``final_acc`` eval accuracy before RL and at the end; ``reward_gain`` mean reward of the last
    quarter of the steps minus the first quarter; ``ratio_log_var`` Var(log w); ``clip_later`` token clip fraction
    over minibatches 2..n; ``grad_spikes`` spiking steps (:func:`grad_spikes`); ``first_spike_step``;
    ``collapse`` 1.0 when the final accuracy is more than ``COLLAPSE_DROP`` below the start; ``collapse_step``
    (:func:`collapse_step`); ``peak_reward_step`` where the 5-step rolling mean reward peaked; ``vol`` old->new
    routing change; ``rollout_flip`` routers flipped between the rollout and the free pi_old.
    """
    m = load_metrics(run)
    info = read_run_info(run)
    start, final = info.warm_start_accuracy, info.final_accuracy
    quarter = max(1, len(m) // 4)
    spikes = grad_spikes(m[keys.GRAD_NORM_MAX])
    reward, steps = m[keys.REWARD_MEAN], m[keys.STEP]
    rolling = reward.rolling(5, min_periods=1).mean()
    return {
        "start_acc": start,
        "final_acc": final,
        "reward_gain": float(reward.iloc[-quarter:].mean() - reward.iloc[:quarter].mean()),
        "ratio_log_var": float(m[keys.RATIO_TOKEN_LOG_VAR].mean()),
        "clip_later": float(m[keys.CLIP_TOKEN_FRAC_LATER].mean()),
        "grad_spikes": float(spikes.sum()),
        "first_spike_step": int(steps[spikes].iloc[0]) if spikes.any() else None,
        "collapse": float(start is not None and final is not None and final < start - COLLAPSE_DROP),
        "collapse_step": collapse_step(m, start),
        "peak_reward_step": int(steps.iloc[int(rolling.to_numpy().argmax())]),
        "vol": float(m[keys.ROUTING_CHANGED.format(pair="old_new")].mean()),
        "rollout_flip": float(m[keys.ROUTING_ROUTER_FLIP.format(pair="rollout_old_free")].mean()),
    }
