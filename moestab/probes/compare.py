"""The routing and log-prob difference between two probe records of the same tokens.

Every number is computed by the functions that own it elsewhere (``moestab.metrics.routes.route_change`` for the
changed / flip rates, ``moestab.analysis.attribution.flip_rate_by_margin`` for flips against router margin,
``moestab.metrics.mismatch.mismatch_stats`` for k1 / k3 / F(2)), so a probe and a training run report the same
quantity under the same name. ``a`` is the reference side: margins are ``a``'s and log-prob differences are
``logp_b - logp_a``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from moestab.analysis.attribution import flip_rate_by_margin, router_flips
from moestab.analysis.bins import DEFAULT_POSITION_EDGES, bin_left_edges
from moestab.metrics.mismatch import mismatch_stats
from moestab.metrics.routes import intersection_sizes, route_change
from moestab.probes.collect import ProbeRecord
from moestab.probes.errors import ProbeError


@dataclass(frozen=True)
class Comparison:
    """Tables of one comparison; ``summary`` is a single row."""

    summary: pd.DataFrame
    """``tokens``, ``changed``, ``router_flip``, ``token_flip`` (routes) and ``k1``, ``k3``, ``f2`` (log-probs)."""
    by_layer: pd.DataFrame
    """``layer``, ``changed``, ``router_flip``."""
    by_position: pd.DataFrame
    """``position`` (left edge of the bin), ``tokens``, ``changed``, ``router_flip``, ``token_flip``."""
    by_margin: pd.DataFrame
    """Router flip rate per quantile bin of ``a``'s router margin (``flip_rate_by_margin`` columns)."""


def check_same_tokens(a: ProbeRecord, b: ProbeRecord) -> None:
    if a.tokens != b.tokens or not (np.array_equal(a.text, b.text) and np.array_equal(a.position, b.position)):
        raise ProbeError(f"the two records cover different tokens ({a.tokens} vs {b.tokens}); both sides must "
                         "tokenize the suite the same way (same tokenizer, same max_tokens)")
    if a.layers != b.layers or a.top_k != b.top_k:
        raise ProbeError(f"the two records route differently shaped models (layers {a.layers} vs {b.layers}, "
                         f"top_k {a.top_k} vs {b.top_k})")


def compare_records(
    a: ProbeRecord, b: ProbeRecord, *, position_edges: Sequence[int] = DEFAULT_POSITION_EDGES, margin_bins: int = 10
) -> Comparison:
    """How ``b`` routes and scores the tokens ``a`` saw (see :class:`Comparison`)."""
    check_same_tokens(a, b)
    k = a.top_k
    inter = intersection_sizes(a.routes, b.routes)  # [tokens, layers]
    overall = route_change(inter, k)
    shift = mismatch_stats(b.logp, a.logp, sequence=a.text)
    summary = pd.DataFrame([{
        "tokens": a.tokens,
        "changed": float(overall["changed"][0]),
        "router_flip": float(overall["router_flip"][0]),
        "token_flip": float(overall["token_flip"][0]),
        "k1": shift["k1"], "k3": shift["k3"], "f2": shift["f2"],
    }])
    by_layer = pd.DataFrame({"layer": list(a.layers), "changed": overall["changed_by_layer"][0],
                             "router_flip": overall["router_flip_by_layer"][0]})
    labels = bin_left_edges(a.position, position_edges)  # [tokens]
    bins, group = np.unique(labels, return_inverse=True)
    grouped = route_change(inter, k, groups=group, n_groups=len(bins))
    by_position = pd.DataFrame({"position": bins, "tokens": grouped["tokens"].astype(np.int64),
                                "changed": grouped["changed"], "router_flip": grouped["router_flip"],
                                "token_flip": grouped["token_flip"]})
    flipped, recorded = router_flips(a.routes, b.routes)  # [tokens, layers] each
    by_margin = flip_rate_by_margin(flipped, recorded, a.margin, bins=margin_bins)
    return Comparison(summary, by_layer, by_position, by_margin)
