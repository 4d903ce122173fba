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

from moestab.metrics.kl import EXTREME_LOG_RATIO_5, extreme_terms, k1_terms, k3_terms

MISMATCH_STATS = ("tokens", "sequences", "mean_d", "std_d", "k1", "k3", "f2", "chi2_seq")
"""Keys of :func:`mismatch_stats`."""


def _log_prob_pair(logp_trainer: np.ndarray, logp_rollout: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both sides as float64 ``[tokens]`` arrays of one length, or a ValueError naming their shapes."""
    trainer = np.asarray(logp_trainer, dtype=np.float64)
    rollout = np.asarray(logp_rollout, dtype=np.float64)
    if trainer.shape != rollout.shape or trainer.ndim != 1:
        raise ValueError(f"log-probs must be [tokens] of one length, got {trainer.shape}, {rollout.shape}")
    return trainer, rollout


def mismatch_stats(
    logp_trainer: np.ndarray, logp_rollout: np.ndarray, sequence: np.ndarray | None = None
) -> dict[str, float]:
    """Mismatch statistics of token log-probs ``[tokens]`` (NaN pairs are dropped).

    ``sequence`` ``[tokens]`` labels each token's sequence (any hashable ids, e.g. ``step * B + seq``);
    without it ``chi2_seq`` and ``sequences`` are NaN. Returns the keys of :data:`MISMATCH_STATS`.
    """
    trainer, rollout = _log_prob_pair(logp_trainer, logp_rollout)  # [tokens] each, float64
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


ESTIMATOR_STATS = ("tokens", "sequences", "k1", "k1_se", "k3", "k3_se", "k1_minus_k3", "k1_minus_k3_se",
                   "min_k3_term")
"""Keys of :func:`estimator_agreement`."""


def mean_and_se(values: np.ndarray, cluster: np.ndarray | None = None) -> tuple[float, float]:
    """Mean of ``values`` ``[tokens]`` and its standard error: over clusters (``cluster`` ``[tokens]``, e.g. each
    token's sequence, whose tokens are not independent) when given, ``sqrt(C / (C - 1) * sum_c (S_c - n_c m)^2) / N``
    with ``S_c`` / ``n_c`` the sum / count of cluster ``c``; without clusters every token is its own, which is the
    sample sd over ``sqrt(N)``. The SE is NaN with fewer than two clusters."""
    x = np.asarray(values, dtype=np.float64)  # [N]
    if x.size == 0:
        return float("nan"), float("nan")
    mean = float(x.mean())
    codes = np.arange(x.size) if cluster is None else pd.factorize(np.asarray(cluster))[0]  # [N]
    sums = np.bincount(codes, weights=x)  # [C] S_c
    counts = np.bincount(codes)  # [C] n_c
    n_clusters = sums.size
    if n_clusters < 2:
        return mean, float("nan")
    spread = float(np.sum((sums - counts * mean) ** 2))
    return mean, float(np.sqrt(n_clusters / (n_clusters - 1) * spread) / x.size)


def estimator_agreement(
    logp_trainer: np.ndarray, logp_rollout: np.ndarray, sequence: np.ndarray | None = None
) -> dict[str, float]:
    """k1 and k3 of ``d = log pi_train - log mu_rollout`` on tokens *sampled from the rollout* ``mu``, each with its
    standard error (:func:`mean_and_se`, over ``sequence`` clusters when given), and their difference.

    On tokens sampled from ``mu`` both estimate ``KL(mu || pi_train)``: per token ``k1 - k3 = 1 - exp(d)``, whose
    expectation is ``1 - E_mu[pi / mu] = 0``. So ``k1 - k3`` within a few of its SEs of 0 is what "k1 ~ k3"
    means; on teacher-forced text (tokens not drawn from ``mu``) neither is an estimate of the KL and the two need
    not agree. ``min_k3_term`` is the smallest per-token k3 (>= 0 by construction, up to rounding). NaN pairs are
    dropped; returns the keys of :data:`ESTIMATOR_STATS`.
    """
    trainer, rollout = _log_prob_pair(logp_trainer, logp_rollout)  # [tokens] each, float64
    if sequence is not None and np.shape(sequence) != trainer.shape:
        raise ValueError(f"sequence must be [tokens] like the log-probs, got {np.shape(sequence)}")
    d = trainer - rollout  # [tokens]
    keep = np.isfinite(d)
    d = d[keep]
    seq = None if sequence is None else np.asarray(sequence)[keep]  # [kept]
    k1, k1_se = mean_and_se(k1_terms(d), seq)
    k3_each = k3_terms(d)  # [kept]
    k3, k3_se = mean_and_se(k3_each, seq)
    diff, diff_se = mean_and_se(-np.expm1(d), seq)  # k1 - k3 per token = 1 - exp(d)
    return {"tokens": float(d.size), "sequences": np.nan if seq is None else float(pd.unique(seq).size),
            "k1": k1, "k1_se": k1_se, "k3": k3, "k3_se": k3_se, "k1_minus_k3": diff, "k1_minus_k3_se": diff_se,
            "min_k3_term": float(k3_each.min()) if d.size else float("nan")}


SPREAD_STATS = ("abs_d", "sq_d", "f5", "prob_diff_mean", "prob_diff_max", "prob_diff_std")
"""Keys of :func:`mismatch_spread`."""


def mismatch_spread(logp_trainer: np.ndarray, logp_rollout: np.ndarray) -> dict[str, float]:
    """How far apart the two log-probs of each token ``[tokens]`` are, in the forms other RL frameworks log them
    (NaN pairs are dropped; every value NaN without a pair). With ``d = log pi_train - log mu_rollout``:

    - ``abs_d = mean |d|`` and ``sq_d = mean d^2`` (AReaL's ``logp_abs_diff`` / ``logp_sq_diff``, PR #1496);
    - ``f5 = mean 1[|d| > ln 5]`` (AReaL's ``extreme_frac_tau5``; ``f2`` of :func:`mismatch_stats` is its ``tau2``);
    - ``prob_diff_*``: mean, max and sample standard deviation (n - 1, as ``torch.std``; NaN for one token) of
      ``|exp(log pi_train) - exp(log mu_rollout)|``, verl's ``training/rollout_probs_diff_{mean,max,std}``
      (``verl.utils.debug.metrics.calculate_debug_metrics``).
    """
    trainer, rollout = _log_prob_pair(logp_trainer, logp_rollout)  # [tokens] each, float64
    d = trainer - rollout  # [tokens]
    keep = np.isfinite(d)
    if not keep.all():
        d, trainer, rollout = d[keep], trainer[keep], rollout[keep]
    if d.size == 0:
        return {name: float("nan") for name in SPREAD_STATS}
    prob_diff = np.abs(np.exp(trainer) - np.exp(rollout))  # [tokens]
    return {
        "abs_d": float(np.mean(np.abs(d))),
        "sq_d": float(np.mean(d * d)),
        "f5": float(np.mean(extreme_terms(d, EXTREME_LOG_RATIO_5))),
        "prob_diff_mean": float(prob_diff.mean()),
        "prob_diff_max": float(prob_diff.max()),
        "prob_diff_std": float(prob_diff.std(ddof=1)) if d.size > 1 else float("nan"),
    }
