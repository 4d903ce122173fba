"""Comparing runs across conditions: runs grouped by their run.json config, each group's seeds reduced to a mean and
a standard deviation per step, curves smoothed, and the metrics.jsonl keys the runs logged.

The question these serve is "did routing volatility rise, and did it hurt GRPO more than GSPO?": one answer needs
several seeds per condition (one seed's curve is mostly noise) and the conditions told apart by what their configs
say, not by folder names. Pure functions over configs (``RunInfo.config``) and metrics frames
(:func:`moestab.records.reader.load_metrics`); the dashboard's Compare page draws what they return, and nothing here
imports Streamlit. Every value is a metrics.jsonl number: grouping, averaging over seeds and smoothing reshape
numbers, they define no metric.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from moestab.analysis.dashboard_data import metric_curve
from moestab.metrics import keys

ABSENT = "(absent)"
"""The value of a config field in a run whose config lacks it (e.g. a TRL or diagnostics run's config)."""

IDENTITY_FIELDS = frozenset({"seed", "out", "resume", "cache_dir", "overwrite", "progress", "report_to"})
"""Config fields that tell runs apart (or say how a run was started) rather than which condition it ran: left out of
the default grouping, so that the seeds of one condition fall into one group."""

OFF_VALUES = frozenset({"0", "0.0", "false", "null", '""', "[]", "{}"})
"""A config value as :func:`config_table` writes it (JSON text) that means a setting is off."""

ALL_RUNS = "all runs"
"""The group of every run when no field is chosen."""

DEFAULT_KEYS = (
    keys.REWARD_MEAN,
    keys.EVAL_ACCURACY,
    keys.ROUTING_CHANGED.format(pair="old_new"),
    keys.MISMATCH_K3.format(pair="rollout_old"),
    keys.RATIO_TOKEN_LOG_VAR,
    keys.CLIP_TOKEN_FRAC_LATER,
)
"""Curves of the first view: reward and eval accuracy beside old -> new routing change, rollout -> trainer mismatch
(pi_old as used in the ratio: what the loss sees), Var(log w) and the clipped share."""

CURVE_COLUMNS = ("run", "step", "value")
BAND_COLUMNS = ("group", "step", "mean", "sd", "low", "high", "n", "runs")


def field_text(value: Any) -> str:
    """A config value as the text groups are told apart by: strings as they are, anything else as JSON (``0.0002``,
    ``null``, ``[1, 2]``, keys of a mapping sorted), so equal values give equal text."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def config_table(configs: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """One row per run (index: the run's label, in the mapping's order), one text column per config field found in
    any run (first-seen order), :data:`ABSENT` where a run's config lacks the field."""
    fields = list(dict.fromkeys(field for config in configs.values() for field in config))
    rows = [[field_text(config[f]) if f in config else ABSENT for f in fields] for config in configs.values()]
    return pd.DataFrame(rows, index=pd.Index(list(configs), name="run"), columns=fields, dtype=object)


def varying_fields(table: pd.DataFrame) -> list[str]:
    """The fields of :func:`config_table` whose value is not the same in every run, in the table's order."""
    return [field for field in table.columns if table[field].nunique(dropna=False) > 1]


def default_group_fields(fields: Iterable[str], table: pd.DataFrame | None = None) -> list[str]:
    """``fields`` without :data:`IDENTITY_FIELDS`: the conditions, so that seeds share a group. With the runs'
    ``table`` (:func:`config_table`), also without the fields that are absent from some runs and off wherever present
    (one value among 0, false, null, empty): a run written before a setting existed ran without it, so it is no
    other condition (a field such as ``trainer: trl``, present in some runs only, still groups)."""
    conditions = [field for field in fields if field not in IDENTITY_FIELDS]
    if table is None:
        return conditions

    def only_off_when_present(field: str) -> bool:
        present = table[field][table[field] != ABSENT].unique()
        return len(present) == 1 and present[0] in OFF_VALUES

    return [field for field in conditions if not only_off_when_present(field)]


STYLE_ORDER = ("algo", "routing_replay", "rollout_dtype", "trainer", "model", "lr")
"""Config fields most worth a colour, then a dash, in that order: the objective and the replay mode are what the
comparison is usually about."""


def style_fields(fields: Sequence[str], table: pd.DataFrame | None = None) -> tuple[str | None, str | None]:
    """The fields to colour and to dash the lines by, among the grouping ``fields``: those of :data:`STYLE_ORDER`
    first, then the others in their order; ``None`` where there is no field left. With the runs' ``table``, when
    that colour and dash together do not tell every group apart (e.g. dense and MoE GRPO both ``algo=grpo,
    routing_replay=off``), ``(None, None)``: colour by the group itself."""
    ranked = sorted(fields, key=lambda f: (STYLE_ORDER.index(f) if f in STYLE_ORDER else len(STYLE_ORDER)))
    colour, dash = (ranked[0] if ranked else None), (ranked[1] if len(ranked) > 1 else None)
    if table is not None and fields:
        styled = [f for f in (colour, dash) if f is not None]
        if table.groupby(styled).ngroups < table.groupby(list(fields)).ngroups:
            return None, None
    return colour, dash


def group_labels(table: pd.DataFrame, fields: Sequence[str]) -> pd.Series:
    """Each run's group: ``field=value`` of ``fields`` joined by ``", "`` (:data:`ALL_RUNS` without fields), indexed
    by run like ``table``. Runs with equal values of every field share a group."""
    missing = [field for field in fields if field not in table.columns]
    if missing:
        raise KeyError(f"no config field {missing} among {list(table.columns)}")
    if not fields:
        return pd.Series(ALL_RUNS, index=table.index, name="group", dtype=object)
    labels = [", ".join(f"{field}={table.at[run, field]}" for field in fields) for run in table.index]
    return pd.Series(labels, index=table.index, name="group", dtype=object)


def group_members(groups: pd.Series) -> dict[str, list[str]]:
    """Group -> its runs, groups in the order their first run appears."""
    members: dict[str, list[str]] = {}
    for run, group in groups.items():
        members.setdefault(group, []).append(str(run))
    return members


def _scalar_numbers(column: pd.Series) -> pd.Series | None:
    """The column as float64 when it holds numbers (nulls allowed), ``None`` when it holds lists or text."""
    present = column.dropna()
    if present.map(lambda v: isinstance(v, list | dict | str | bool)).any():
        return None
    return pd.to_numeric(column, errors="coerce").astype(np.float64)


def metric_keys(frames: Mapping[str, pd.DataFrame]) -> dict[str, int]:
    """Every scalar metrics.jsonl key of the runs' frames -> how many runs have a number for it at some step.

    List-valued keys (``.../changed_by_layer``) and ``step`` are left out; a key whose every value is null counts
    for no run. Keys of :data:`moestab.metrics.keys.KEYS` come in metrics.jsonl's order, any other keys after them,
    sorted.
    """
    counts: dict[str, int] = {}
    for frame in frames.values():
        for key in frame.columns:
            if key == keys.STEP:
                continue
            numbers = _scalar_numbers(frame[key])
            if numbers is None:
                continue
            counts[key] = counts.get(key, 0) + int(numbers.notna().any())
    known = [key for key in keys.KEYS if key in counts]
    other = sorted(key for key in counts if key not in keys.KEYS)
    return {key: counts[key] for key in [*known, *other]}


def runs_without(frames: Mapping[str, pd.DataFrame], key: str) -> list[str]:
    """The runs (in the mapping's order) with no number for ``key`` at any step: the key is absent or always null."""
    out = []
    for run, frame in frames.items():
        numbers = _scalar_numbers(frame[key]) if key in frame else None
        if numbers is None or not numbers.notna().any():
            out.append(run)
    return out


def describe(key: str) -> str:
    """The definition of a metrics.jsonl key from the key table (``""`` for a key the table does not declare)."""
    row = keys.KEYS.get(key)
    return "" if row is None else row.definition


def curves(frames: Mapping[str, pd.DataFrame], key: str, starts: Mapping[str, float] | None = None) -> pd.DataFrame:
    """``key`` against step for every run that has it: columns ``run``, ``step``, ``value``
    (:func:`moestab.analysis.dashboard_data.metric_curve` stacked), runs in the mapping's order.

    ``starts``: a value per run drawn at step 0 (the starting policy's eval accuracy), for the runs that have ``key``.
    """
    parts = []
    for run, frame in frames.items():
        if key not in frame or _scalar_numbers(frame[key]) is None:
            continue
        curve = metric_curve(frame, key, (starts or {}).get(run))
        if len(curve):
            parts.append(curve.assign(run=run)[list(CURVE_COLUMNS)])
    if not parts:
        return pd.DataFrame({"run": pd.Series(dtype=object), "step": pd.Series(dtype=np.int64),
                             "value": pd.Series(dtype=np.float64)})
    return pd.concat(parts, ignore_index=True)


def ema(values: Sequence[float] | np.ndarray, weight: float) -> np.ndarray:
    """Exponential moving average with TensorBoard's debiasing: the t-th output is the mean of the values so far,
    value i weighted by ``weight ** (t - i)``; so the first output is the first value, and ``weight`` 0 returns the
    values unchanged. NaN values are skipped (their output is NaN; they do not enter later outputs).

    Debiased rather than started at the first value, so that the first value is not given the weight of every
    earlier step (a curve's start would otherwise lag as much as its end)."""
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"the smoothing weight must be in [0, 1), got {weight}")
    values = np.asarray(values, np.float64)
    out = np.full(values.shape, np.nan)
    total, norm = 0.0, 0.0
    for i, value in enumerate(values):
        if np.isnan(value):
            continue
        total = weight * total + value
        norm = weight * norm + 1.0
        out[i] = total / norm
    return out


def smooth(curves: pd.DataFrame, weight: float) -> pd.DataFrame:
    """:func:`curves`'s frame, rows in the same order, with each run's values replaced by their :func:`ema` in step
    order (``weight`` 0: a copy). Smoothing comes before the mean over seeds, so a group's band is the spread of its
    smoothed runs."""
    ema([], weight)  # checks the weight
    if weight == 0 or not len(curves):
        return curves.copy()
    ordered = curves.sort_values(["run", "step"], kind="stable")
    values = ordered.groupby("run", sort=False)["value"].transform(lambda v: ema(v.to_numpy(), weight))
    return curves.assign(value=values.reindex(curves.index))


def aggregate(curves: pd.DataFrame, groups: Mapping[str, str]) -> pd.DataFrame:
    """Each group's runs reduced per step: columns ``group``, ``step``, ``mean``, ``sd`` (sample standard deviation
    over the group's runs that have a value at that step, n - 1 in the denominator; NaN with one run), ``low`` and
    ``high`` (mean -+ sd), ``n`` (runs with a value at the step) and ``runs`` (runs of the group with the key at all).

    Runs are aligned on ``step``: a step that only some runs reached (a run still going, a run that logs the key at
    other steps) is the mean of those, and ``n`` says how many. ``groups``: run -> group (:func:`group_labels`); a
    run of ``curves`` without a group raises ``KeyError``. Groups and steps sorted.
    """
    if not len(curves):
        return pd.DataFrame({name: pd.Series(dtype=object if name == "group" else np.float64)
                             for name in BAND_COLUMNS})
    unknown = sorted(set(curves["run"]) - set(groups))
    if unknown:
        raise KeyError(f"runs {unknown} have no group")
    frame = curves.assign(group=curves["run"].map(groups))
    size = frame.groupby("group")["run"].nunique().rename("runs")
    stats = frame.groupby(["group", "step"])["value"].agg(mean="mean", sd="std", n="count").reset_index()
    stats["low"] = stats["mean"] - stats["sd"]
    stats["high"] = stats["mean"] + stats["sd"]
    stats = stats.join(size, on="group")
    return stats[list(BAND_COLUMNS)].sort_values(["group", "step"], kind="stable").reset_index(drop=True)


def step_domain(frames: Iterable[pd.DataFrame]) -> tuple[int, int] | None:
    """The smallest and largest ``step`` over the frames (one step axis for every chart), ``None`` when all are
    empty."""
    steps = [frame["step"] for frame in frames if len(frame)]
    if not steps:
        return None
    joined = pd.concat(steps)
    return int(joined.min()), int(joined.max())


def named_values(table: pd.DataFrame, field: str) -> pd.Series:
    """``field=value`` of each run of :func:`config_table` (indexed by run): how :func:`label_fields` names a run's
    value of ``field``."""
    return table[field].map(lambda value: f"{field}={value}")


def label_fields(frame: pd.DataFrame, table: pd.DataFrame, groups: Mapping[str, str],
                 fields: Sequence[str]) -> pd.DataFrame:
    """``frame`` (:func:`curves`' or :func:`aggregate`'s) with one column per config field of ``fields``, after its
    first column, so a chart can colour or dash its lines by a field: ``field=value`` of the run (a frame with
    ``run``), or of the group (one with ``group`` only; distinct values of a field that is not a group field are
    joined by ``" / "``). Named values read on their own in a legend, and stay text in a CSV (``true`` or ``0.0002``
    alone would be read back as a boolean or a number). ``table``: :func:`config_table`; ``groups``: run -> group. A
    field named like a column of ``frame`` raises ``ValueError``."""
    clash = [field for field in fields if field in frame.columns]
    if clash:
        raise ValueError(f"config field(s) {clash} are named like columns of the frame")
    out = frame.copy()
    for i, field in enumerate(dict.fromkeys(fields)):
        named = named_values(table, field)
        if "run" in frame.columns:
            values = frame["run"].map(named)
        else:
            by_group: dict[str, list[str]] = {}
            for run, group in groups.items():
                by_group.setdefault(group, []).append(named[run])
            values = frame["group"].map({group: " / ".join(dict.fromkeys(texts)) for group, texts in by_group.items()})
        out.insert(1 + i, field, values.astype(object))
    return out
