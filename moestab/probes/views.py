"""What a probe folder shows, shaped once: its description row, its tables stacked over folders, and the data of
its charts. The CLI's PNGs (``plots``) and the dashboard's Probes page draw these frames.

Each chart is one entry of :data:`CHARTS`: the probes it applies to, the table it reads and the function that shapes
it (lines: columns ``series``, ``x``, ``y``; heatmap: a grid, rows on y and columns on x). Adding a chart is one
entry; a probe without an entry is shown as its tables only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import pandas as pd
from pandas.api.types import is_numeric_dtype

from moestab.probes.errors import ProbeError
from moestab.probes.folder import ProbeResult

SERIES = "comparison"
"""Column naming the comparison a row belongs to, in tables holding several (numerics); else one series per probe."""


def describe(result: ProbeResult) -> dict[str, object]:
    """One row about ``result``: ``probe``, ``checkpoints``, the suite's ``suite`` (name), ``source``, ``texts``
    (count) and ``sha256``, ``settings`` (``key=value``, ...) and ``tables`` (names)."""
    suite = result.suite
    return {
        "probe": result.probe,
        "checkpoints": "; ".join(result.checkpoints),
        "suite": suite.get("name"),
        "source": suite.get("source"),
        "texts": suite.get("count"),
        "sha256": suite.get("sha256"),
        "settings": ", ".join(f"{key}={value}" for key, value in result.settings.items()),
        "tables": ", ".join(result.tables),
    }


def stack_tables(results: Mapping[str, ProbeResult], name: str, by: str = "folder") -> pd.DataFrame:
    """Table ``name`` of each result that has it, one under the other; with several results a first column ``by``
    says whose row it is (the mapping's keys)."""
    frames = {label: r.tables[name] for label, r in results.items() if name in r.tables}
    if not frames:
        return pd.DataFrame()
    if len(results) == 1:
        return next(iter(frames.values()))
    return pd.concat([t.assign(**{by: label})[[by, *t.columns]] for label, t in frames.items()], ignore_index=True)


def table_names(results: Sequence[ProbeResult]) -> list[str]:
    """Names of the tables of ``results``, in the order they first appear."""
    return list(dict.fromkeys(name for r in results for name in r.tables))


def _table(result: ProbeResult, name: str, columns: Sequence[str]) -> pd.DataFrame:
    """Table ``name`` of ``result``, checked to have numeric ``columns``."""
    if name not in result.tables:
        raise ProbeError(f"the {result.probe} probe folder has no table {name!r} (tables: {', '.join(result.tables)})")
    table = result.tables[name]
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ProbeError(f"table {name!r} has no column {', '.join(map(repr, missing))} "
                         f"(columns: {', '.join(map(str, table.columns))})")
    wrong = [c for c in columns if not is_numeric_dtype(table[c])]
    if wrong:
        raise ProbeError(f"column {', '.join(map(repr, wrong))} of table {name!r} is not numeric")
    return table


def _series(result: ProbeResult, table: pd.DataFrame) -> pd.Series:
    """The line each row belongs to: its ``comparison`` (numerics), else the probe's name."""
    if SERIES in table.columns:
        return table[SERIES].astype(str)
    return pd.Series(result.probe, index=table.index)


def flip_rate_by_margin(result: ProbeResult) -> pd.DataFrame:
    """Router flip rate (``y``) against the middle of its router-margin bin (``x``), per comparison (``series``)."""
    table = _table(result, "by_margin", ("margin_low", "margin_high", "flip_rate"))
    middle = (table["margin_low"] + table["margin_high"]) / 2
    return pd.DataFrame({"series": _series(result, table), "x": middle, "y": table["flip_rate"]})


def router_flip_by_layer(result: ProbeResult) -> pd.DataFrame:
    """Router flip rate (``y``) by layer (``x``), per comparison (``series``)."""
    table = _table(result, "by_layer", ("layer", "router_flip"))
    return pd.DataFrame({"series": _series(result, table), "x": table["layer"], "y": table["router_flip"]})


def _saturation_grid(result: ProbeResult, column: str) -> pd.DataFrame:
    """``column`` of the saturation table as checkpoint (rows, in probe order) x layer; a checkpoint given twice
    keeps both rows (the second is named ``label (2)``)."""
    table = _table(result, "saturation", ("layer", column))
    if "checkpoint" not in table.columns:
        raise ProbeError("table 'saturation' has no column 'checkpoint'")
    seen = table.groupby(["checkpoint", "layer"], sort=False).cumcount()
    rows = [str(c) if n == 0 else f"{c} ({n + 1})" for c, n in zip(table["checkpoint"], seen, strict=True)]
    wide = table.assign(row=rows).pivot(index="row", columns="layer", values=column)
    return wide.loc[list(dict.fromkeys(rows))].rename_axis(index="checkpoint")


def saturation_grid(result: ProbeResult) -> pd.DataFrame:
    """Top-k saturation against the reference, checkpoint x layer."""
    return _saturation_grid(result, "saturation")


def saturation_top1_grid(result: ProbeResult) -> pd.DataFrame:
    """Top-1 saturation against the reference, checkpoint x layer."""
    return _saturation_grid(result, "saturation_top1")


def changed_by_minibatches(result: ProbeResult) -> pd.DataFrame:
    """step-volatility: old->new ``changed`` (``y``) against the number of minibatches (``x``), one line per lr."""
    table = _table(result, "step_volatility", ("lr", "minibatches", "old_new_changed"))
    return pd.DataFrame({"series": [f"lr {lr:g}" for lr in table["lr"]], "x": table["minibatches"],
                         "y": table["old_new_changed"]})


def drift_by_minibatch(result: ProbeResult) -> pd.DataFrame:
    """step-volatility: update->old ``changed`` (``y``) at each minibatch index (``x``), one line per setting."""
    table = _table(result, "step_volatility_by_minibatch", ("lr", "minibatches", "minibatch", "update_old_changed"))
    table = table[table["minibatches"] > 1]  # a single update starts from pi_old: nothing to drift, one point at 0
    series = [f"lr {lr:g}, {n} minibatches" for lr, n in zip(table["lr"], table["minibatches"], strict=True)]
    return pd.DataFrame({"series": series, "x": table["minibatch"], "y": table["update_old_changed"]})


DEPTH_RATES = {"old_new_changed": "changed", "old_new_router_flip": "router flip", "old_new_token_flip": "token flip"}
"""depth: the columns drawn against depth and their line names."""


def flips_by_depth(result: ProbeResult) -> pd.DataFrame:
    """depth: changed, router flip and token flip from pi_old to pi_new (``y``) against depth (``x``)."""
    table = _table(result, "depth", ("depth", *DEPTH_RATES))
    return pd.concat([pd.DataFrame({"series": name, "x": table["depth"], "y": table[column]})
                      for column, name in DEPTH_RATES.items()], ignore_index=True)


def changed_by_layer_per_depth(result: ProbeResult) -> pd.DataFrame:
    """depth: old->new ``changed`` (``y``) by layer (``x``), one line per depth."""
    table = _table(result, "depth_by_layer", ("depth", "layer", "changed"))
    return pd.DataFrame({"series": [f"{n} layers" for n in table["depth"]], "x": table["layer"],
                         "y": table["changed"]})


@dataclass(frozen=True)
class Chart:
    """A figure of a probe table."""

    name: str
    probes: tuple[str, ...]
    """Probes it is drawn for."""
    table: str
    """The table it reads."""
    kind: Literal["lines", "heatmap"]
    shape: Callable[[ProbeResult], pd.DataFrame]
    """Lines: ``series``, ``x``, ``y``; heatmap: the grid."""
    title: str
    xlabel: str
    ylabel: str
    value: str = ""
    """Heatmap: what the colour shows."""
    limits: tuple[float, float] | None = None
    """Heatmap: the colour scale (default: the data's)."""
    log_x: bool = False
    """Lines: log x axis when every x is positive."""
    integer_x: bool = False
    """Lines: x is an index (layers)."""


_COMPARISONS = ("compare", "numerics")
CHARTS: tuple[Chart, ...] = (
    Chart("flip_rate_by_margin", _COMPARISONS, "by_margin", "lines", flip_rate_by_margin,
          "Router flip rate against router margin",
          "router margin (k-th minus (k+1)-th selection score), bin middle", "router flip rate", log_x=True),
    Chart("router_flip_by_layer", _COMPARISONS, "by_layer", "lines", router_flip_by_layer,
          "Router flip rate by layer", "MoE layer", "router flip rate", integer_x=True),
    Chart("saturation", ("saturation",), "saturation", "heatmap", saturation_grid,
          "Top-k router saturation vs the reference", "MoE layer", "checkpoint", "saturation", (0.0, 1.0)),
    Chart("saturation_top1", ("saturation",), "saturation", "heatmap", saturation_top1_grid,
          "Top-1 router saturation vs the reference", "MoE layer", "checkpoint", "saturation (top-1)", (0.0, 1.0)),
    Chart("changed_by_minibatches", ("step-volatility",), "step_volatility", "lines", changed_by_minibatches,
          "Routing change of one step against its minibatches", "minibatches (updates on the rollout batch)",
          "old->new changed", log_x=True, integer_x=True),
    Chart("drift_by_minibatch", ("step-volatility",), "step_volatility_by_minibatch", "lines", drift_by_minibatch,
          "Drift from pi_old at each update", "minibatch", "update->old changed", integer_x=True),
    Chart("flips_by_depth", ("depth",), "depth", "lines", flips_by_depth,
          "Routing change of one update against depth", "MoE layers", "old->new rate", log_x=True, integer_x=True),
    Chart("changed_by_layer_per_depth", ("depth",), "depth_by_layer", "lines", changed_by_layer_per_depth,
          "Routing change of one update by layer", "MoE layer", "old->new changed", integer_x=True),
)


def charts_for(probe: str) -> tuple[Chart, ...]:
    """The charts drawn for ``probe`` (none for a probe this module does not know)."""
    return tuple(chart for chart in CHARTS if probe in chart.probes)


def chart(name: str) -> Chart:
    for entry in CHARTS:
        if entry.name == name:
            return entry
    raise ProbeError(f"unknown chart {name!r}; valid charts: {', '.join(c.name for c in CHARTS)}")
