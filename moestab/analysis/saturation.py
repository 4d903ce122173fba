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
