"""Comparing runs across conditions: runs grouped by their run.json config, each group's seeds reduced to a mean and
a standard deviation per step, curves smoothed, and the metrics.jsonl keys the runs logged.

The question these serve is "did routing volatility rise, and did it hurt GRPO more than GSPO?": one answer needs
several seeds per condition (one seed's curve is mostly noise) and the conditions told apart by what their configs
say, not by folder names. Pure functions over configs (``RunInfo.config``) and metrics frames
(:func:`moestab.run_folder.reader.load_metrics`); the dashboard's Compare page draws what they return, and nothing here
imports Streamlit. Every value is a metrics.jsonl number: grouping, averaging over seeds and smoothing reshape
numbers, they define no metric.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from moestab.analysis.dashboard_data import metric_curve
from moestab.metrics import keys
from moestab.metrics.paired import PairedInterval, paired_interval

ABSENT = "(absent)"
"""The value of a config field in a run whose config lacks it (e.g. a TRL or diagnostics run's config)."""

IDENTITY_FIELDS = frozenset({"seed", "out", "resume", "cache_dir", "overwrite", "progress", "report_to",
                             "report_expert_load_matrix", "steps"})
"""Config fields that tell runs apart (or say how a run was started, or how long it was planned to run) rather than
which condition it ran."""
MEASUREMENT_FIELDS = frozenset({"measure_every", "measure_fraction", "eval_every", "eval_size", "save_every",
                                "threads", "record_fraction", "record_layers", "routing_share",
                                "measure_base_routes", "route_integrity", "on_collapse_warning"})
"""Config fields that say what was measured, how often, or how the run was computed, not how it trained: the
measurement budget and its cadence, the eval cadence and size, the save cadence, torch's threads, the token tables'
share and layers, the measure-only forwards (routing's share, the distance from the base), the route-integrity
policy and the collapse-warning policy."""
NOT_CONDITION_FIELDS = IDENTITY_FIELDS | MEASUREMENT_FIELDS
"""Left out of the default grouping, so that the seeds of one condition fall into one group however each was
measured (the quick start measures every 4th step, a sweep every step; a GRPO run planned for 17 steps and one for
57 ran the same condition; the step window compares them over the steps both have)."""

SEED_FIELD = "seed"
"""The config field paired differences match runs by."""

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
    """``fields`` without :data:`NOT_CONDITION_FIELDS`: the conditions, so that seeds share a group however each was
    measured. With the runs' ``table`` (:func:`config_table`), also without the fields that are absent from some
    runs and off wherever present (one value among 0, false, null, empty): a run written before a setting existed ran
    without it, so it is no other condition (a field such as ``trainer: trl``, present in some runs only, still
    groups)."""
    conditions = [field for field in fields if field not in NOT_CONDITION_FIELDS]
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


def key_counts(names: Mapping[str, Iterable[str]]) -> dict[str, int]:
    """Every scalar metrics.jsonl key of the runs -> how many runs have a number for it at some step (``names``: run ->
    the keys it has a number for, :func:`moestab.run_folder.reader.load_metrics`'s ``names``). Keys of
    :data:`moestab.metrics.keys.KEYS` come in metrics.jsonl's order, any other keys after them, sorted."""
    counts: dict[str, int] = {}
    for run_keys in names.values():
        for key in set(run_keys):
            counts[key] = counts.get(key, 0) + 1
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


DRAWN_STEPS = 2000
"""Most steps a chart draws per run: a browser (and Streamlit's message) holds a few thousand points a line well, not
the ~150,000 steps of a 1 GB metrics.jsonl. Longer curves are thinned by :func:`thin`."""


def thin(curves: pd.DataFrame, max_steps: int = DRAWN_STEPS) -> tuple[pd.DataFrame, int]:
    """:func:`curves`'s frame for drawing: when it holds more than ``max_steps`` distinct steps, steps are binned
    ``width`` at a time on one grid for every run (from the first step), each run's values averaged over a bin (NaN
    left out) and labelled by the bin's first step, so runs still align on step; ``(frame, width)``, ``width`` 1 and
    the frame unchanged when nothing was binned. The means over step windows are taken on the unthinned curves."""
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    steps = curves["step"]
    if not len(curves) or steps.nunique() <= max_steps:
        return curves, 1
    first, last = int(steps.min()), int(steps.max())
    width = -(-(last - first + 1) // max_steps)  # ceil
    binned = curves.assign(step=first + (steps - first) // width * width)
    # Runs in their order, steps ascending within each (as curves() stacks them): groups kept in that order.
    return binned.groupby(["run", "step"], as_index=False, sort=False)["value"].mean(), width


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


# -- "by how much": one step window for every run, per-run means, group means, paired differences -------------------

WINDOW_COLUMNS = ("run", "mean", "steps", "first", "last")
GROUP_STAT_COLUMNS = ("group", "runs", "mean", "sd", "se")
PAIR_COLUMNS = ("seed", "run_a", "run_b", "a", "b", "difference")


def step_ranges(frames: Mapping[str, pd.DataFrame]) -> dict[str, tuple[int, int]]:
    """Each run's first and last ``step`` (metrics frames; a run without a step is left out), in the mapping's
    order."""
    return {run: (int(frame["step"].min()), int(frame["step"].max())) for run, frame in frames.items() if len(frame)}


def common_steps(frames: Mapping[str, pd.DataFrame]) -> tuple[int, int] | None:
    """The steps every run has: from the latest first step to the earliest last step of the runs' metrics frames,
    both included; ``None`` when a run has no step or two runs' steps do not overlap. The default step window: a mean
    over steps 1-17 beside one over steps 1-57 would compare different stretches of training."""
    ranges = step_ranges(frames)
    if not frames or len(ranges) < len(frames):
        return None
    first, last = max(r[0] for r in ranges.values()), min(r[1] for r in ranges.values())
    return (first, last) if first <= last else None


def window_means(curves: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    """Each run's mean over the steps of ``window`` (both ends included) of :func:`curves`' ``value``: columns ``run``,
    ``mean``, ``steps`` (the steps with a value in the window), ``first`` and ``last`` (the first and last of those).
    Runs with no value in the window are left out; runs in the frame's order. Unsmoothed values: the mean over the
    window is itself the smoothing."""
    first, last = window
    if first > last:
        raise ValueError(f"the step window must run forwards, got {first}..{last}")
    inside = curves[(curves["step"] >= first) & (curves["step"] <= last) & curves["value"].notna()]
    stats = inside.groupby("run", sort=False).agg(mean=("value", "mean"), steps=("step", "count"),
                                                  first=("step", "min"), last=("step", "max")).reset_index()
    return stats[list(WINDOW_COLUMNS)]


def group_stats(means: pd.DataFrame, groups: Mapping[str, str]) -> pd.DataFrame:
    """Each group's runs' window means (:func:`window_means`) reduced to ``mean``, ``sd`` (n - 1) and ``se`` = sd /
    sqrt(runs), the standard error of the group mean over its runs (seeds); sd and se are NaN with one run. Columns
    :data:`GROUP_STAT_COLUMNS`, groups in the order of their first run in ``means``."""
    if not len(means):
        return pd.DataFrame({c: pd.Series(dtype=object if c == "group" else np.float64) for c in GROUP_STAT_COLUMNS})
    frame = means.assign(group=means["run"].map(groups))
    if frame["group"].isna().any():
        raise KeyError(f"runs {sorted(frame.loc[frame['group'].isna(), 'run'])} have no group")
    stats = frame.groupby("group", sort=False)["mean"].agg(runs="count", mean="mean", sd="std").reset_index()
    stats["se"] = stats["sd"] / np.sqrt(stats["runs"])
    return stats[list(GROUP_STAT_COLUMNS)]


@dataclass(frozen=True)
class PairedDifference:
    """Group ``a`` minus group ``b``, run against run of the same seed, over a step window."""

    interval: PairedInterval | None
    """Mean of the seeds' differences and its t-interval (:func:`moestab.metrics.paired.paired_interval`); ``None``
    without a pair."""
    pairs: pd.DataFrame
    """One row per seed: :data:`PAIR_COLUMNS` (the two runs, their window means, ``a - b``), sorted by seed."""
    unpaired: tuple[tuple[str, str], ...]
    """(run, why) of each run of the two groups left out of the pairs."""


def paired_difference(means: pd.DataFrame, groups: Mapping[str, str], seeds: Mapping[str, str], a: str, b: str,
                      level: float = 0.95) -> PairedDifference:
    """Group ``a`` minus group ``b``: each run's window mean (:func:`window_means`) paired with the other group's run
    of the same seed (``seeds``: run -> its config's seed as :func:`field_text` writes it, :data:`ABSENT` when its
    config has none), the differences' mean and ``level`` t-interval. A run is left out, saying why, when its config
    names no seed, when no run of its seed in the other group has a window mean, or when two runs of one group share
    its seed (which to pair is not known)."""
    if a == b:
        raise ValueError(f"a paired difference needs two groups, got {a!r} twice")
    value = dict(zip(means["run"], means["mean"], strict=True))
    unpaired: list[tuple[str, str]] = []
    by_seed: dict[str, dict[str, list[str]]] = {}
    for run, group in groups.items():
        if group not in (a, b) or run not in value:
            continue
        if seeds.get(run, ABSENT) == ABSENT:
            unpaired.append((run, "its config names no seed"))
            continue
        by_seed.setdefault(seeds[run], {a: [], b: []})[group].append(run)
    rows = []
    for seed, runs in by_seed.items():
        if len(runs[a]) == 1 and len(runs[b]) == 1:
            run_a, run_b = runs[a][0], runs[b][0]
            rows.append((seed, run_a, run_b, value[run_a], value[run_b], value[run_a] - value[run_b]))
            continue
        crowded = [group for group in (a, b) if len(runs[group]) > 1]
        for group, other in ((a, b), (b, a)):
            why = (f"seed {seed} has {len(runs[crowded[0]])} runs in {crowded[0]}" if crowded
                   else f"no run of seed {seed} in {other} has a value in the window")
            unpaired += [(run, why) for run in runs[group]]
    pairs = pd.DataFrame(rows, columns=list(PAIR_COLUMNS)).astype({c: np.float64 for c in ("a", "b", "difference")})
    pairs = pairs.sort_values("seed", key=lambda s: s.map(_seed_order), kind="stable").reset_index(drop=True)
    interval = paired_interval(pairs["a"].tolist(), pairs["b"].tolist(), level) if len(pairs) else None
    return PairedDifference(interval, pairs, tuple(unpaired))


def _seed_order(seed: str) -> tuple[float, str]:
    """Numeric seeds in numeric order, then any other text."""
    try:
        return float(seed), seed
    except ValueError:
        return math.inf, seed
