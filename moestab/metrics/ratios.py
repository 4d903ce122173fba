"""Importance ratios of one step and their clipping: the one definition of every ``ratio/*`` and ``clip/*`` number.

Per token, ``log w = logp_update - logp_old`` (the log-ratio that entered the loss); per sequence,
GSPO's ``log s_i = mean_t log w_it`` (GSPO arXiv 2507.18071, Eq. 7). A token is *clipped* when the
ratio that governs it in the loss was clipped: its own (token-level objectives) or its sequence's
(sequence-level: a clipped sequence clips all its tokens), as GSPO Fig. 2 counts them.

The first minibatch of a step updates from ``theta = theta_old``, so its ratios are 1 by construction
and it never clips; the ``*_later`` fractions are over minibatches 2..n only, which is what the
ratio's movement actually produced (at 4 minibatches the all-minibatch fraction is diluted by a quarter).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moestab.metrics.clipping import clipped_fraction

CLIP_FRACTIONS = ("token_frac", "seq_frac", "token_frac_later", "seq_frac_later")
"""Keys of :func:`clip_fractions`."""

RATIO_QUANTILES: tuple[float, ...] = (0.001, 0.01, 0.5, 0.99, 0.999)
"""Quantiles of ``w`` and ``s`` reported per step (``ratio/token_q0.99``, ...)."""


def _sequence_codes(sequence: np.ndarray) -> tuple[np.ndarray, int]:
    codes, levels = pd.factorize(np.asarray(sequence))
    return codes, len(levels)


def clip_fractions(clipped: np.ndarray, sequence: np.ndarray, minibatch: np.ndarray) -> dict[str, float]:
    """Clipped shares of tokens and of sequences, over all minibatches and over minibatches 2..n.

    Args:
        clipped: ``[tokens]`` bool, the token's governing ratio was clipped.
        sequence: ``[tokens]`` sequence id of each token (any hashable labels).
        minibatch: ``[tokens]`` 0-based minibatch index of each token's sequence.

    Returns:
        ``token_frac`` (clipped tokens / tokens), ``seq_frac`` (sequences with a clipped token /
        sequences), and ``token_frac_later``, ``seq_frac_later`` over the tokens of minibatches >= 1
        (NaN when there are none, e.g. a single minibatch); each a :func:`~moestab.metrics.clipping.clipped_fraction`.
    """
    clipped = np.asarray(clipped, dtype=bool)
    minibatch = np.asarray(minibatch)
    if not clipped.shape == np.shape(sequence) == minibatch.shape or clipped.ndim != 1:
        raise ValueError("clipped, sequence and minibatch must be [tokens] of one length")
    codes, n_seqs = _sequence_codes(sequence)
    seq_clipped = np.bincount(codes, weights=clipped, minlength=n_seqs) > 0  # [sequences]
    seq_minibatch = np.zeros(n_seqs, minibatch.dtype)
    seq_minibatch[codes] = minibatch  # [sequences]; all tokens of a sequence share its minibatch
    every_token, every_seq = np.ones_like(clipped), np.ones_like(seq_clipped)
    return {
        "token_frac": clipped_fraction(clipped, every_token),
        "seq_frac": clipped_fraction(seq_clipped, every_seq),
        "token_frac_later": clipped_fraction(clipped, minibatch > 0),
        "seq_frac_later": clipped_fraction(seq_clipped, seq_minibatch > 0),
    }


def sequence_log_ratios(log_w: np.ndarray, sequence: np.ndarray) -> np.ndarray:
    """``log s`` per sequence ``[sequences]`` (in order of first appearance): the mean ``log w`` of its tokens.

    The owner of ``log s`` for every measurement: the step's ``ratio/seq_*`` and ``moestab analyze`` /
    the dashboard (:func:`moestab.analysis.ratios.sequence_log_s`) call it, in float64 over the tokens as recorded.
    The loss keeps its own differentiable form on the padded batch, ``moestab.rl.ratios.sequence_log_ratios``
    (torch, gradients through every token, on the loss's device); tests/metrics/test_owners.py checks the two agree.
    """
    codes, n_seqs = _sequence_codes(sequence)
    sums = np.bincount(codes, weights=np.asarray(log_w, np.float64), minlength=n_seqs)
    return sums / np.bincount(codes, minlength=n_seqs)


def ratio_stats(log_w: np.ndarray, sequence: np.ndarray) -> dict[str, float]:
    """Statistics of the token ratio ``w`` and the sequence ratio ``s`` over all tokens / sequences given.

    Returns ``token_min``, ``token_max``, ``token_q<p>`` (of ``w``, for ``p`` in
    :data:`RATIO_QUANTILES`), ``token_log_var`` (population variance of ``log w``), and the same with
    ``seq_`` for ``s``. NaN when empty.
    """
    log_w = np.asarray(log_w, dtype=np.float64)
    out: dict[str, float] = {}
    for prefix, values in (("token", log_w), ("seq", sequence_log_ratios(log_w, sequence))):
        empty = values.size == 0
        out[f"{prefix}_min"] = np.nan if empty else float(np.exp(values.min()))
        out[f"{prefix}_max"] = np.nan if empty else float(np.exp(values.max()))
        quantiles = np.full(len(RATIO_QUANTILES), np.nan) if empty else np.exp(np.quantile(values, RATIO_QUANTILES))
        out.update({f"{prefix}_q{q:g}": float(v) for q, v in zip(RATIO_QUANTILES, quantiles, strict=True)})
        out[f"{prefix}_log_var"] = np.nan if empty else float(values.var())
    return out
