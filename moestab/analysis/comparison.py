"""Runs compared by condition from the command line (``moestab compare``): "does GRPO's routing change more than
GSPO's, by how much, with what uncertainty".

The same functions as the dashboard's Compare page (:mod:`moestab.analysis.compare`): runs grouped by the config
fields that differ between conditions (how a run was measured left out), each run's mean over one step window that
every run has, each group's mean +- its standard error over seeds, and each group minus a baseline group paired seed
by seed with a 95% t-interval. :func:`comparison_markdown` writes it as a report a pull request or a paper draft can
hold, with the figures :func:`write_figures` draws (matplotlib, the ``plots`` extra).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from moestab.analysis.compare import (
    ABSENT,
    DEFAULT_KEYS,
    SEED_FIELD,
    common_steps,
    config_table,
    curves,
    default_group_fields,
    group_labels,
    group_members,
    group_stats,
    paired_difference,
    varying_fields,
    window_means,
)
from moestab.analysis.labels import format_value, is_percent, metric_label
from moestab.run_folder.reader import Skipped, load_metrics, read_run_info

GROUP_COLUMNS = ("metric", "group", "runs", "mean", "sd", "se")
DIFFERENCE_COLUMNS = ("metric", "group", "baseline", "pairs", "mean", "low", "high", "unpaired")


@dataclass(frozen=True)
class Comparison:
    """Groups of runs over one step window, per metric: each group's mean +- se, each group minus the baseline."""

    window: tuple[int, int]
    fields: tuple[str, ...]
    """The config fields the groups are told apart by."""
    members: dict[str, list[str]]
    """Group -> its runs."""
    baseline: str
    groups: pd.DataFrame
    """:data:`GROUP_COLUMNS`: per metric and group, its runs' window means reduced to mean, sd and se."""
    differences: pd.DataFrame
    """:data:`DIFFERENCE_COLUMNS`: per metric, each group minus :attr:`baseline`, paired by seed, 95% t-interval."""
    curves: dict[str, pd.DataFrame]
    """Metric -> :func:`moestab.analysis.compare.curves` of every run (for the figures)."""


def run_labels(paths: Sequence[Path]) -> list[str]:
    """Each run's folder name, or its path where two runs share a name."""
    names = [Path(p).name for p in paths]
    return [str(p) if names.count(n) > 1 else n for p, n in zip(paths, names, strict=True)]


def compare_runs(paths: Sequence[Path], *, by: Sequence[str] | None = None, metrics: Sequence[str] = DEFAULT_KEYS,
                 steps: tuple[int, int] | None = None, baseline: str | None = None,
                 skipped: list[Skipped] | None = None) -> Comparison:
    """Compare the runs at ``paths``: grouped by ``by`` (default: every config field that differs between runs and
    changes training, :func:`~moestab.analysis.compare.default_group_fields`), over ``steps`` (default: the steps
    every run has), each of ``metrics``; ``baseline`` names a group (default: the first). ``ValueError`` names what
    does not fit (no common step, an unknown group or field)."""
    labels = run_labels(paths)
    infos = {label: read_run_info(path) for label, path in zip(labels, paths, strict=True)}
    frames = {label: load_metrics(path, skipped) for label, path in zip(labels, paths, strict=True)}
    table = config_table({label: info.config for label, info in infos.items()})
    fields = list(by) if by is not None else default_group_fields(varying_fields(table), table)
    unknown = [f for f in fields if f not in table.columns]
    if unknown:
        raise ValueError(f"no config field {unknown}; the runs' fields that differ: {varying_fields(table)}")
    groups = group_labels(table, fields)
    members = group_members(groups)
    window = steps or common_steps(frames)
    if window is None:
        raise ValueError("the runs share no step (a run has none, or two runs' steps do not overlap); give --steps")
    base = baseline or next(iter(members))
    if base not in members:
        raise ValueError(f"no group {base!r}; the groups: {list(members)}")
    seeds = dict(table[SEED_FIELD]) if SEED_FIELD in table.columns else dict.fromkeys(table.index, ABSENT)
    group_rows, diff_rows, drawn = [], [], {}
    for key in metrics:
        runs_curves = curves(frames, key)
        drawn[key] = runs_curves
        means = window_means(runs_curves, window)
        stats = group_stats(means, dict(groups))
        group_rows += [{"metric": key, **row} for row in stats.to_dict(orient="records")]
        for group in members:
            if group == base:
                continue
            diff = paired_difference(means, dict(groups), seeds, group, base)
            ci = diff.interval
            diff_rows.append({"metric": key, "group": group, "baseline": base, "pairs": 0 if ci is None else ci.n,
                              "mean": math.nan if ci is None else ci.mean, "low": math.nan if ci is None else ci.low,
                              "high": math.nan if ci is None else ci.high, "unpaired": len(diff.unpaired)})
    return Comparison(window, tuple(fields), members, base, pd.DataFrame(group_rows, columns=list(GROUP_COLUMNS)),
                      pd.DataFrame(diff_rows, columns=list(DIFFERENCE_COLUMNS)), drawn)


def _value(key: str, value: float, *, difference: bool = False) -> str:
    """``value`` in ``key``'s unit (:func:`moestab.analysis.labels.format_value`: shares in percent, differences of
    shares in percentage points); ``-`` when missing."""
    return format_value(value, is_percent(key), difference=difference) or "-"


def comparison_text(c: Comparison) -> str:
    """The comparison as plain text: per metric, each group's mean +- se (n runs), then each group minus the
    baseline with its 95% interval and the number of seed pairs; values in each metric's unit (analysis.labels)."""
    lines = [f"steps {c.window[0]}-{c.window[1]}; groups by {', '.join(c.fields) or 'nothing (one group)'}; "
             f"baseline: {c.baseline}"]
    for key in dict.fromkeys(c.groups["metric"]):
        label = metric_label(key)
        lines.append(f"\n{label.title} ({label.unit}) [{key}]")
        for row in c.groups[c.groups["metric"] == key].itertuples(index=False):
            se = "" if math.isnan(row.se) else f" +- {_value(key, row.se)}"
            lines.append(f"  {row.group}: {_value(key, row.mean)}{se}  ({row.runs} runs)")
        for row in c.differences[c.differences["metric"] == key].itertuples(index=False):
            interval = ("no seed pairs" if row.pairs == 0 else f"{_signed(key, row.mean)} (95% CI "
                        f"{_signed(key, row.low)}, {_signed(key, row.high)}), {row.pairs} seed pairs")
            extra = f"; {row.unpaired} runs unpaired" if row.unpaired else ""
            lines.append(f"  {row.group} - {row.baseline}: {interval}{extra}")
    return "\n".join(lines)


def _signed(key: str, value: float) -> str:
    return _value(key, value, difference=True)


def comparison_markdown(c: Comparison, figures: Mapping[str, str] | None = None) -> str:
    """A self-contained Markdown report: the groups and their runs, a table per metric (group mean +- se, the
    difference to the baseline with its 95% interval), and the figures (``figures``: metric -> relative PNG path)."""
    out = ["# Runs compared (moestab compare)", "",
           f"Step window {c.window[0]}-{c.window[1]} (each run's mean over these steps); groups told apart by "
           f"`{', '.join(c.fields) or '-'}`; differences are each group minus **{c.baseline}**, paired by seed, with "
           "a 95% t-interval; +- is the standard error of the group mean over its runs.", "", "## Groups", ""]
    out += [f"- **{group}**: {', '.join(runs)}" for group, runs in c.members.items()]
    for key in dict.fromkeys(c.groups["metric"]):
        label = metric_label(key)
        out += ["", f"## {label.title}", "", f"`{key}`, {label.unit}.", "",
                "| group | runs | mean +- se | minus the baseline (95% CI) | seed pairs |", "|---|---|---|---|---|"]
        diffs = c.differences[c.differences["metric"] == key].set_index("group")
        for row in c.groups[c.groups["metric"] == key].itertuples(index=False):
            se = "" if math.isnan(row.se) else f" +- {_value(key, row.se)}"
            if row.group in diffs.index and diffs.at[row.group, "pairs"]:
                d = diffs.loc[row.group]
                diff, pairs = (f"{_signed(key, d['mean'])} ({_signed(key, d['low'])}, {_signed(key, d['high'])})",
                               str(int(d["pairs"])))
            else:
                diff, pairs = ("(baseline)" if row.group == c.baseline else "no seed pairs"), "-"
            out.append(f"| {row.group} | {row.runs} | {_value(key, row.mean)}{se} | {diff} | {pairs} |")
        if figures and key in figures:
            out += ["", f"![{label.title}, group mean +- se over runs]({figures[key]})"]
    return "\n".join(out) + "\n"


def write_figures(c: Comparison, folder: Path) -> dict[str, str]:
    """One PNG per metric in ``folder``: each group's mean over its runs against step, +- the standard error, the
    step window shaded. Metric -> file name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    groups = {run: group for group, runs in c.members.items() for run in runs}
    for key, frame in c.curves.items():
        if not len(frame):
            continue
        label = metric_label(key)
        fig, ax = plt.subplots(figsize=(6.4, 3.4))
        tidy = frame.assign(group=frame["run"].map(groups))
        for group, part in tidy.groupby("group", sort=False):
            by_step = part.groupby("step")["value"]
            mean, se = by_step.mean(), by_step.std() / by_step.count() ** 0.5
            scale = 100 if label.unit.startswith("%") else 1
            ax.plot(mean.index, mean * scale, label=f"{group} ({part['run'].nunique()} runs)")
            ax.fill_between(mean.index, (mean - se.fillna(0)) * scale, (mean + se.fillna(0)) * scale, alpha=0.2)
        ax.axvspan(c.window[0], c.window[1], color="grey", alpha=0.08)
        ax.set(xlabel="step", ylabel=label.unit, title=label.title)
        ax.legend(fontsize=7)
        fig.tight_layout()
        name = key.replace("/", "_") + ".png"
        fig.savefig(folder / name, dpi=110)
        plt.close(fig)
        written[key] = name
    return written
