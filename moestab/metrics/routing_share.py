"""Routing's share of the ratio: the token log-ratio on the same weights with free and with replayed routes.

At each minibatch update the trainer can score the minibatch twice on the weights that produce ``logp_update``
(``--routing-share``): once with the policy's free routing and once with the routes that produced pi_old's
log-probs in the ratio replayed (``moestab.train.step``: R2's replay under ``off``; the update forward itself
under R2 / R3 / TRR). Per token, with ``logp_old`` pi_old as used in the ratio::

    log w_free     = logp_update(free routing)         - logp_old
    log w_replayed = logp_update(pi_old's routes kept) - logp_old

The difference is what routing change alone did to the ratio. Over a set of response tokens (one minibatch, or
the whole step), with population variances (divide by ``n``, as ``ratio/token_log_var``)::

    var_share = 1 - Var(log w_replayed) / Var(log w_free)

the share of the log-ratio's variance that routing change causes: 0 when replaying pi_old's routes leaves the
variance as it is (routing did not change, or changed nothing that mattered), 1 when replay removes it all,
negative when replay raised it. It is 0 when both variances are 0 (no variance to explain, e.g. the first
minibatch, whose weights are pi_old's) and NaN when only ``Var(log w_free)`` is 0 (nothing to take a share of)
or there is no token.
"""

from __future__ import annotations

import numpy as np

from moestab.metrics.clipping import clipped_fraction

ROUTING_SHARE_STATS = ("var_share", "log_var_free", "log_var_replayed", "clip_frac_free", "clip_frac_replayed",
                       "abs_log_w_free", "abs_log_w_replayed")
"""Keys of :func:`routing_share`, in metrics.jsonl's order."""


def variance_share(var_free: float, var_replayed: float) -> float:
    """``1 - var_replayed / var_free``; 0 when both are 0; NaN when only ``var_free`` is 0 or either is NaN."""
    if np.isnan(var_free) or np.isnan(var_replayed):
        return float("nan")
    if var_free == 0.0:
        return 0.0 if var_replayed == 0.0 else float("nan")
    return float(1.0 - var_replayed / var_free)


def routing_share(
    log_w_free: np.ndarray, log_w_replayed: np.ndarray, clipped_free: np.ndarray, clipped_replayed: np.ndarray,
) -> dict[str, float]:
    """Routing's share of the ratio over the tokens given (``[tokens]`` each, one token per position).

    Returns (:data:`ROUTING_SHARE_STATS`):

    - ``var_share``: :func:`variance_share` of the two variances below;
    - ``log_var_free``, ``log_var_replayed``: population variance of ``log w`` under each routing (float64);
    - ``clip_frac_free``, ``clip_frac_replayed``: share of the tokens whose governing ratio the objective clipped
      (:func:`~moestab.metrics.clipping.clipped_fraction`; the loss's own clip rule, evaluated on each log-ratio);
    - ``abs_log_w_free``, ``abs_log_w_replayed``: mean ``|log w|`` under each routing.

    Every value is NaN when there is no token.
    """
    free = np.asarray(log_w_free, dtype=np.float64)
    replayed = np.asarray(log_w_replayed, dtype=np.float64)
    clipped_free, clipped_replayed = np.asarray(clipped_free, bool), np.asarray(clipped_replayed, bool)
    if not free.shape == replayed.shape == clipped_free.shape == clipped_replayed.shape or free.ndim != 1:
        raise ValueError("log_w_free, log_w_replayed, clipped_free and clipped_replayed must be [tokens] of one length")
    if free.size == 0:
        return dict.fromkeys(ROUTING_SHARE_STATS, float("nan"))
    var_free, var_replayed = float(free.var()), float(replayed.var())
    every = np.ones_like(clipped_free)
    return {
        "var_share": variance_share(var_free, var_replayed),
        "log_var_free": var_free,
        "log_var_replayed": var_replayed,
        "clip_frac_free": clipped_fraction(clipped_free, every),
        "clip_frac_replayed": clipped_fraction(clipped_replayed, every),
        "abs_log_w_free": float(np.abs(free).mean()),
        "abs_log_w_replayed": float(np.abs(replayed).mean()),
    }


def routing_share_by_minibatch(
    log_w_free: np.ndarray, log_w_replayed: np.ndarray, clipped_free: np.ndarray, clipped_replayed: np.ndarray,
    minibatch: np.ndarray, minibatches: int,
) -> dict[str, list[float]]:
    """:func:`routing_share` over the tokens of each minibatch ``0 .. minibatches - 1`` (``minibatch``: ``[tokens]``
    each token's 0-based minibatch): every statistic as a list, NaN for a minibatch with no token."""
    minibatch = np.asarray(minibatch)
    parts = [routing_share(*(np.asarray(a)[minibatch == m] for a in (log_w_free, log_w_replayed, clipped_free,
                                                                       clipped_replayed)))
             for m in range(minibatches)]
    return {stat: [part[stat] for part in parts] for stat in ROUTING_SHARE_STATS}
