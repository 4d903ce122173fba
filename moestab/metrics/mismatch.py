"""Rollout -> trainer log-prob mismatch: how far a trainer's log-probs are from the rollout engine's sampler.

REFERENCES "Train-inference mismatch": with ``d = log pi_train - log mu_rollout`` on rollout tokens,
``k1 = mean(-d)``, ``k3 = mean(exp(d) - 1 - d)``, ``f2 = mean(|d| > ln 2)`` (F(2)) and
``chi2_seq = E_seq[exp(2 sum_t d)] - 1`` (inf when ``exp`` overflows float64). Which trainer
log-prob is compared is the caller's choice; moestab reports two (docs/metrics.md): pi_old as used in
the ratio (``rollout_old``) and the trainer's free pi_old (``rollout_old_free``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moestab.metrics.kl import extreme_terms, k1_terms, k3_terms

MISMATCH_STATS = ("tokens", "sequences", "mean_d", "std_d", "k1", "k3", "f2", "chi2_seq")
"""Keys of :func:`mismatch_stats`."""


def mismatch_stats(
    logp_trainer: np.ndarray, logp_rollout: np.ndarray, sequence: np.ndarray | None = None
) -> dict[str, float]:
    """Mismatch statistics of token log-probs ``[tokens]`` (NaN pairs are dropped).

    ``sequence`` ``[tokens]`` labels each token's sequence (any hashable ids, e.g. ``step * B + seq``);
    without it ``chi2_seq`` and ``sequences`` are NaN. Returns the keys of :data:`MISMATCH_STATS`.
    """
    trainer = np.asarray(logp_trainer, dtype=np.float64)
    rollout = np.asarray(logp_rollout, dtype=np.float64)
    if trainer.shape != rollout.shape or trainer.ndim != 1:
        raise ValueError(f"log-probs must be [tokens] of one length, got {trainer.shape}, {rollout.shape}")
    d = trainer - rollout  # [tokens]
    keep = np.isfinite(d)
    d = d[keep]
    out: dict[str, float] = {"tokens": float(d.size), "sequences": np.nan}
    if d.size == 0:
        out.update({name: np.nan for name in MISMATCH_STATS[2:]})
        return out
    out.update(
        {
            "mean_d": float(d.mean()),
            "std_d": float(d.std()),
            "k1": float(np.mean(k1_terms(d))),
            "k3": float(np.mean(k3_terms(d))),
            "f2": float(np.mean(extreme_terms(d))),
            "chi2_seq": np.nan,
        }
    )
    if sequence is not None:
        seq = np.asarray(sequence)
        if seq.shape != keep.shape:
            raise ValueError(f"sequence must be [tokens] like the log-probs, got {seq.shape}")
        codes, _ = pd.factorize(seq[keep])
        sums = np.bincount(codes, weights=d)  # [sequences] sum_t d
        out["sequences"] = float(sums.size)
        with np.errstate(over="ignore"):
            out["chi2_seq"] = float(np.mean(np.exp(2.0 * sums)) - 1.0)
    return out
