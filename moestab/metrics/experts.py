"""Expert load and co-activation from route arrays ``[tokens, layers, top_k]`` (int16, -1 = not recorded).

A decision (token, layer) with any -1 is left out of that layer's counts. Definitions:

- load of expert ``e`` in a layer: share of the layer's routed slots that chose ``e``
  (docs/metrics.md ``experts/load``); load entropy ``-sum_e p_e ln p_e`` in nats (``ln E`` when
  uniform); ``max_over_mean`` = ``max_e N_e / mean_e N_e``; dead experts were never chosen; ``max_vio`` =
  ``(max_e N_e - mean_e N_e) / mean_e N_e`` (prime-rl's load violation, :func:`max_violation`).
- co-activation (OLMoE arXiv 2409.02060): ``C[i, j] = N(i and j both chosen) / N(i)`` over the
  decisions of one layer; ``C[i, i] = 1`` for a chosen expert; a row is NaN for an unchosen ``i``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from moestab.metrics.routes import check_routes

_CHUNK_TOKENS = 65_536


def _recorded_decisions(chunk: np.ndarray) -> np.ndarray:
    """bool ``[tokens, layers]``: decisions of an int16 ``[tokens, layers, top_k]`` chunk without a -1."""
    if chunk.size == 0 or chunk.min() >= 0:
        return np.ones(chunk.shape[:2], bool)
    return (chunk >= 0).all(axis=2)


def expert_counts(routes: np.ndarray, num_experts: int) -> np.ndarray:
    """How many recorded decisions chose each expert: int64 ``[layers, num_experts]``.

    Raises ``ValueError`` for an expert id outside ``-1 .. num_experts - 1``.
    """
    routes = check_routes(routes)
    tokens, layers, _ = routes.shape
    counts = np.zeros(layers * num_experts, np.int64)
    offsets = (np.arange(layers, dtype=np.int64) * num_experts)[None, :, None]  # [1, layers, 1]
    for start in range(0, tokens, _CHUNK_TOKENS):
        chunk = routes[start : start + _CHUNK_TOKENS]  # [c, layers, k]
        if chunk.size and chunk.max() >= num_experts:
            raise ValueError(f"expert id {int(chunk.max())} >= num_experts={num_experts}")
        recorded = _recorded_decisions(chunk)  # [c, layers]
        index = chunk.astype(np.int64) + offsets  # [c, layers, k]
        if not recorded.all():
            index = index[recorded]  # [decisions, k]
        counts += np.bincount(index.reshape(-1), minlength=layers * num_experts)
    return counts.reshape(layers, num_experts)


def load_stats(counts: np.ndarray, layers: Sequence[int] | None = None) -> pd.DataFrame:
    """Per-layer load statistics of expert counts ``[layers, experts]`` (e.g. from :func:`expert_counts`).

    Columns: ``layer``, ``slots`` (routed slots counted), ``load_entropy`` (nats),
    ``load_entropy_norm`` (entropy / ln E, 1 = uniform), ``max_over_mean``, ``dead_experts``.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 2:
        raise ValueError(f"counts must be [layers, experts], got shape {counts.shape}")
    n_layers, n_experts = counts.shape
    labels = np.arange(n_layers) if layers is None else np.asarray(layers)
    if labels.shape != (n_layers,):
        raise ValueError(f"layers must list {n_layers} labels, got {len(labels)}")
    total = counts.sum(axis=1)  # [layers]
    with np.errstate(invalid="ignore", divide="ignore"):
        share = counts / total[:, None]  # [layers, experts]
        entropy = -np.where(share > 0, share * np.log(share), 0.0).sum(axis=1)
        entropy[total == 0] = np.nan
        max_over_mean = counts.max(axis=1) / counts.mean(axis=1)
    return pd.DataFrame(
        {
            "layer": labels,
            "slots": total.astype(np.int64),
            "load_entropy": entropy,
            "load_entropy_norm": entropy / np.log(n_experts) if n_experts > 1 else np.nan,
            "max_over_mean": max_over_mean,
            "dead_experts": (counts == 0).sum(axis=1).astype(np.int64),
        }
    )


def max_violation(counts: np.ndarray) -> np.ndarray:
    """prime-rl's ``max_vio`` per layer of expert counts ``[layers, experts]``: ``(max_e N_e - mean_e N_e) /
    mean_e N_e`` = ``max_over_mean - 1`` (0 when the load is uniform; NaN for a layer with no routed slot).

    prime-rl (``get_load_balance_stats``) by default first drops the ``top_k`` most loaded experts of each layer, to
    keep its padding tokens (routed like any token) out; moestab's counts hold no padding (-1 is never counted), so
    this is its ``try_to_avoid_padding_experts=False`` form.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 2:
        raise ValueError(f"counts must be [layers, experts], got shape {counts.shape}")
    mean = counts.mean(axis=1)  # [layers]
    with np.errstate(invalid="ignore", divide="ignore"):
        return (counts.max(axis=1) - mean) / mean


def coactivation_counts(routes: np.ndarray, num_experts: int, layer: int) -> np.ndarray:
    """``N[i, j]``: recorded decisions of layer index ``layer`` choosing both ``i`` and ``j`` (``N[i, i] = N(i)``).

    int64 ``[num_experts, num_experts]``; computed as ``X^T X`` of the decisions' one-hot rows.
    """
    routes = check_routes(routes)
    if not 0 <= layer < routes.shape[1]:
        raise ValueError(f"layer index {layer} out of range 0..{routes.shape[1] - 1}")
    out = np.zeros((num_experts, num_experts), np.float64)
    for start in range(0, routes.shape[0], _CHUNK_TOKENS):
        chunk = routes[start : start + _CHUNK_TOKENS, layer]  # [c, k]
        chunk = chunk[(chunk >= 0).all(axis=1)]
        if chunk.size and chunk.max() >= num_experts:
            raise ValueError(f"expert id {int(chunk.max())} >= num_experts={num_experts}")
        onehot = np.zeros((chunk.shape[0], num_experts), np.float32)  # [c, experts]
        np.put_along_axis(onehot, chunk.astype(np.int64), 1.0, axis=1)
        out += onehot.T.astype(np.float64) @ onehot.astype(np.float64)
    return out.round().astype(np.int64)


def coactivation(routes: np.ndarray, num_experts: int, layer: int) -> np.ndarray:
    """``C[i, j] = N(i and j) / N(i)`` for layer index ``layer``: float64 ``[experts, experts]``.

    Rows of experts never chosen are NaN.
    """
    counts = coactivation_counts(routes, num_experts, layer).astype(np.float64)
    diag = np.diag(counts).copy()
    with np.errstate(invalid="ignore", divide="ignore"):
        return counts / diag[:, None]
