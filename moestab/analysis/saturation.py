"""Router saturation: how much of a reference's routing another set of routes already agrees with.

OLMoE (arXiv 2409.02060, §"Router saturation"): for probe tokens ``x`` and a layer,
``saturation = (1/N) sum_x |TopK_t(x) ∩ TopK_ref(x)| / k`` (the reference is usually the final
checkpoint), and the top-1 variant, the share of tokens whose top-1 expert matches the reference's.

Top-1 is read from slot 0, so routes given to :func:`router_saturation` must list each decision's
experts best first. ``moestab.probes.collect`` (what the saturation probe records with) makes sure of it for
every family: it records the selection score of each chosen expert and ranks the slots by it
(``Routes.ranked``), which matters for DeepSeek-V3, whose router picks with ``topk(..., sorted=False)`` (its
score is the bias-corrected sigmoid within the selected groups, not the gate weight). The top-k variant
compares sets and does not depend on slot order.

Route arrays are ``[tokens, layers, top_k]`` int16, -1 = not recorded; a token whose routes in a
layer hold a -1 (in either array) is left out of that layer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from moestab.metrics.routes import INVALID, check_routes, intersection_sizes


def router_saturation(routes: np.ndarray, reference: np.ndarray, layers: Sequence[int] | None = None) -> pd.DataFrame:
    """Per-layer saturation of ``routes`` against ``reference`` (same probe tokens, same shape).

    Returns one row per layer: ``layer`` (labels from ``layers``, default 0..L-1), ``tokens``
    (recorded in both), ``saturation`` (mean share of the reference's top-k also chosen by
    ``routes``) and ``saturation_top1`` (share of tokens whose slot-0 experts agree). NaN for a
    layer with no recorded token. A route set against itself has saturation 1.
    """
    routes = check_routes(routes, "routes")
    reference = check_routes(reference, "reference")
    inter = intersection_sizes(routes, reference)  # [tokens, layers]
    n_layers, k = routes.shape[1], routes.shape[2]
    labels = np.arange(n_layers) if layers is None else np.asarray(layers)
    if labels.shape != (n_layers,):
        raise ValueError(f"layers must list {n_layers} labels, got {len(labels)}")
    recorded = inter != INVALID  # [tokens, layers]
    count = recorded.sum(axis=0)  # [layers]
    shared = np.where(recorded, inter, 0).sum(axis=0, dtype=np.int64)  # [layers]
    top1 = (routes[:, :, 0] == reference[:, :, 0]) & recorded  # [tokens, layers]
    with np.errstate(invalid="ignore", divide="ignore"):
        return pd.DataFrame(
            {
                "layer": labels,
                "tokens": count.astype(np.int64),
                "saturation": shared / (k * count),
                "saturation_top1": top1.sum(axis=0) / count,
            }
        )


def pairwise_saturation(
    routes: Sequence[np.ndarray], steps: Sequence[int], layers: Sequence[int] | None = None
) -> pd.DataFrame:
    """:func:`router_saturation` of every pair of route sets of the same probe tokens, one row per pair and layer:
    ``step_a`` < ``step_b`` (the checkpoints' steps), ``distance`` (``step_b - step_a``), ``layer``, ``tokens``,
    ``saturation``, ``saturation_top1``. Both are symmetric in the pair, so each pair appears once, and a
    checkpoint is never paired with itself (where saturation is 1 by construction).

    ``routes``: one ``[tokens, layers, top_k]`` array per checkpoint, in the order of ``steps`` (distinct).
    """
    if len(routes) != len(steps):
        raise ValueError(f"give one step per route set: {len(routes)} route sets, {len(steps)} steps")
    if len(set(steps)) != len(steps):
        raise ValueError(f"steps must be distinct, got {list(steps)}")
    order = np.argsort(np.asarray(steps))
    frames = []
    for i, a in enumerate(order):
        for b in order[i + 1:]:
            frame = router_saturation(routes[a], routes[b], layers=layers)
            frame.insert(0, "distance", int(steps[b]) - int(steps[a]))
            frame.insert(0, "step_b", int(steps[b]))
            frame.insert(0, "step_a", int(steps[a]))
            frames.append(frame)
    columns = ["step_a", "step_b", "distance", "layer", "tokens", "saturation", "saturation_top1"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def proximity_null(pairs: pd.DataFrame, value: str = "saturation") -> pd.DataFrame:
    """Saturation against the final checkpoint, and what proximity in steps alone would give it.

    ``pairs``: one row per checkpoint pair (``step_a`` < ``step_b``, ``value``), e.g. :func:`pairwise_saturation`
    averaged over layers. Against the final step ``F`` a checkpoint at step ``s`` is ``d = F - s`` steps away, and
    nearer checkpoints agree more even if routing drifts at a constant rate. The null is the same distance taken
    at the start of training, the pair (first step ``S``, ``S + d``): if routing settles, late pairs agree more
    than early pairs ``d`` apart. One row per checkpoint ``step`` < ``F`` whose early pair exists: ``distance``
    (``d``), ``against_final`` (the pair ``(s, F)``), ``null`` (the pair ``(S, S + d)``), ``excess``
    (``against_final - null``) and ``same_distance_mean`` (mean over every pair ``d`` apart). The first checkpoint's
    row is its own null (the same pair, excess 0); the final checkpoint against itself is never a row.
    """
    missing = [c for c in ("step_a", "step_b", value) if c not in pairs.columns]
    if missing:
        raise KeyError(f"proximity_null needs column(s) {missing}; has {list(pairs.columns)}")
    if pairs.duplicated(["step_a", "step_b"]).any():
        raise ValueError("give one row per checkpoint pair (average over layers first)")
    by_pair = pairs.set_index(["step_a", "step_b"])[value]
    first, final = int(pairs.step_a.min()), int(pairs.step_b.max())
    distance = pairs.step_b - pairs.step_a
    rows = []
    for (step, end), against in by_pair.items():
        d = end - step
        if end != final or (first, first + d) not in by_pair.index:
            continue
        null = float(by_pair[(first, first + d)])
        rows.append({"step": step, "distance": d, "against_final": float(against), "null": null,
                     "excess": float(against) - null,
                     "same_distance_mean": float(pairs.loc[distance == d, value].mean())})
    columns = ["step", "distance", "against_final", "null", "excess", "same_distance_mean"]
    return pd.DataFrame(rows, columns=columns).sort_values("step", ignore_index=True)


def rises(values: Sequence[float]) -> tuple[int, int]:
    """``(rises, transitions)``: how many consecutive values go up, out of how many transitions. Give the values in
    step order without the reference checkpoint itself (its saturation against itself is 1 by construction, so
    counting it would add a rise that measures nothing)."""
    x = np.asarray(values, dtype=np.float64)  # [checkpoints]
    if x.size < 2:
        return 0, 0
    return int(np.sum(x[1:] > x[:-1])), int(x.size - 1)
