"""Issue 57's study: can a rule over moestab's per-step signals warn of a GRPO collapse before it shows, and do the
routing signals add anything over what any trainer logs? (docs/collapse.md registers it.)

Definitions (registered): a run *collapses* when its final eval accuracy is more than ``COLLAPSE_DROP`` below its
start; its *onset* is the first evaluation from which every evaluation to the end is more than ``ONSET_DROP`` below
the start. A warning at a step in ``[onset - HORIZON, onset - 1]`` is a *hit* (lead time: onset minus the first such
step); a warning in a run that did not collapse is a *false alarm*, counted per 100 steps of such runs. Rules
(:class:`~moestab.metrics.collapse_warning.WarningRule`) are calibrated on the development runs to the registered
false-alarm rate and the best one is shipped; the held-out runs are scored once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from moestab.experiments.grid import GridRun, grid_runs
from moestab.experiments.powered import manifest
from moestab.metrics import keys
from moestab.metrics.collapse_warning import (
    COLLAPSE_DROP,
    ONSET_DROP,
    SIGNALS,
    CollapseWatch,
    WarningRule,
    collapse_onset,
    fire_steps,
)
from moestab.run_folder.errors import RunError
from moestab.run_folder.reader import load_metrics, read_run_info

HORIZON = 30
"""Steps before the onset in which a warning counts as a hit."""
FALSE_ALARMS_PER_100 = 0.5
"""The registered operating point: false alarms per 100 steps of development runs that did not collapse."""
FA_GRID = (0.25, 0.5, 1.0, 2.0)
"""False-alarm rates the recall curve is reported at."""
THRESHOLDS = tuple(round(0.25 * i, 2) for i in range(-40, 81))
"""The thresholds calibration tries (a z-score for a single signal, log-odds for a model), in order."""
L2 = 1.0
"""The logistic models' L2 penalty on their weights (not the intercept)."""
RULE_DEFAULTS = WarningRule(signals=("vol",), weights=(1.0,), threshold=0.0)
"""The baseline window, smoothing, refractory period, z clip and scale floor every candidate shares."""
BASELINES = tuple(s for s, sig in SIGNALS.items() if sig.family == "baseline")
ROUTING = tuple(s for s, sig in SIGNALS.items() if sig.family == "routing")
MODELS: dict[str, tuple[str, ...]] = {
    "logit:baselines": BASELINES,
    "logit:baselines+routing": BASELINES + ROUTING,
    "logit:all": tuple(SIGNALS),
}
"""The logistic models, by the signals they weigh."""


@dataclass(frozen=True)
class StudyRun:
    """A run of the study: its folder, the set it belongs to (``dev`` or a held-out set) and its arm."""

    path: Path
    split: str
    arm: str
    seed: int


# ---- the runs ------------------------------------------------------------------------------------------------------
DEV_DRIFT_ARMS = ("moe_grpo_off", "moe_grpo_r3", "constant_grpo")
"""Issue 52's stage-1 arms (lr 5e-4), development runs."""
NEW_ARMS: dict[str, tuple[str, dict[str, Any], tuple[int, ...]]] = {
    # split, TrainConfig fields over the powered experiment's base, seeds
    "dev_grpo_off_lr1e-3": ("dev", {"algo": "grpo", "routing_replay": "off", "lr": 1e-3}, tuple(range(2000, 2010))),
    "held_grpo_off": ("held_seeds", {"algo": "grpo", "routing_replay": "off", "lr": 5e-4}, tuple(range(3000, 3010))),
    "held_grpo_r3": ("held_seeds", {"algo": "grpo", "routing_replay": "rollout", "lr": 5e-4},
                     tuple(range(3000, 3010))),
    "held_grpo_off_lr1e-3": ("held_seeds", {"algo": "grpo", "routing_replay": "off", "lr": 1e-3},
                             tuple(range(3000, 3010))),
    "held_default_grpo_off_lr1e-3": ("held_setting", {"algo": "grpo", "routing_replay": "off", "lr": 1e-3,
                                                      "model": "embedded"}, tuple(range(3000, 3010))),
}
"""The runs made for the study: more collapses for development, and the held-out sets (new seeds; the default
model, a setting the development runs do not have)."""


def new_runs(base: dict[str, Any], model: str, out: str | Path) -> list[GridRun]:
    """The study's own runs, ``out/<arm>/seed-<s>``, development first, seed by seed."""
    runs = []
    for arm, (_, fields, seeds) in NEW_ARMS.items():
        for seed in seeds:
            runs += grid_runs({**base, "model": model, **fields}, {}, [seed], Path(out) / arm)
    return runs


def study_runs(drift_out: str | Path, out: str | Path, drift_seeds: Iterable[int]) -> list[StudyRun]:
    """Every run of the study: issue 52's stage-1 runs and the study's own, with their split."""
    runs = [StudyRun(Path(drift_out) / arm / f"seed-{s}", "dev", arm, s) for arm in DEV_DRIFT_ARMS for s in drift_seeds]
    for arm, (split, _, seeds) in NEW_ARMS.items():
        runs += [StudyRun(Path(out) / arm / f"seed-{s}", split, arm, s) for s in seeds]
    return runs


# ---- outcomes ------------------------------------------------------------------------------------------------------
def onset_step(evals: pd.Series, start: float) -> int | None:
    """``evals`` (eval accuracy by step, in step order) of a run that started at ``start``: the onset of its collapse
    (:func:`~moestab.metrics.collapse_warning.collapse_onset`), None when it did not collapse."""
    return collapse_onset(list(evals.index), list(evals.to_numpy()), start)


@dataclass(frozen=True)
class RunRecord:
    """What the study reads of one run: its per-step signals and its onset (None: it did not collapse)."""

    run: StudyRun
    steps: pd.DataFrame  # one row per step, the signals' keys and ``step``
    onset: int | None
    start: float
    final: float


def read_run(run: StudyRun) -> RunRecord:
    m = load_metrics(run.path)
    info = read_run_info(run.path)
    start = info.warm_start_accuracy
    evals = m.dropna(subset=[keys.EVAL_ACCURACY]).set_index(keys.STEP)[keys.EVAL_ACCURACY]
    columns = [keys.STEP] + [s.key for s in SIGNALS.values() if s.key in m]
    return RunRecord(run, m[columns], onset_step(evals, start), start, float(evals.iloc[-1]))


def _step_dicts(record: RunRecord) -> list[tuple[int, dict]]:
    rows = record.steps.to_dict("records")
    return [(int(row[keys.STEP]), row) for row in rows]


# ---- scoring a rule ------------------------------------------------------------------------------------------------
def score_series(rule: WarningRule, record: RunRecord) -> list[tuple[int, float | None]]:
    """The rule's score at each step of ``record`` (None before its baseline); its threshold plays no part."""
    watch = CollapseWatch(replace(rule, threshold=math.inf))
    out = []
    for step, metrics in _step_dicts(record):
        watch.update(step, metrics)
        out.append((step, watch.score))
    return out


def score_run(rule: WarningRule, record: RunRecord,
              scores: list[tuple[int, float | None]] | None = None) -> dict[str, Any]:
    """One run under ``rule``: its warnings, whether one was a hit, the lead time, and its false alarms
    (``scores``: :func:`score_series` of the rule and run, when already computed)."""
    scores = score_series(rule, record) if scores is None else scores
    fired = fire_steps(scores, rule.threshold, rule.refractory)
    steps = int(record.steps[keys.STEP].max())
    out: dict[str, Any] = {"path": str(record.run.path), "split": record.run.split, "arm": record.run.arm,
                           "seed": record.run.seed, "collapsed": record.onset is not None, "onset": record.onset,
                           "warnings": " ".join(map(str, fired)), "watched_steps": steps - rule.baseline_steps + 1}
    if record.onset is None:
        out.update(hit=False, lead=math.nan, false_alarms=len(fired))
    else:
        window = [s for s in fired if record.onset - HORIZON <= s <= record.onset - 1]
        out.update(hit=bool(window), lead=record.onset - window[0] if window else math.nan, false_alarms=0)
    return out


def summarize(rows: pd.DataFrame) -> dict[str, float]:
    """Recall, false alarms per 100 watched steps of runs that did not collapse, and lead times (steps)."""
    collapsed, quiet = rows[rows.collapsed], rows[~rows.collapsed]
    watched = quiet.watched_steps.sum()
    leads = collapsed.lead.dropna()
    return {"runs": len(rows), "collapsed": len(collapsed), "hits": int(collapsed.hit.sum()),
            "recall": float(collapsed.hit.mean()) if len(collapsed) else math.nan,
            "false_alarms": int(quiet.false_alarms.sum()),
            "false_alarms_per_100": float(100 * quiet.false_alarms.sum() / watched) if watched else math.nan,
            "lead_median": float(leads.median()) if len(leads) else math.nan,
            "lead_min": float(leads.min()) if len(leads) else math.nan,
            "lead_max": float(leads.max()) if len(leads) else math.nan}


def score_rule(rule: WarningRule, records: Sequence[RunRecord]) -> pd.DataFrame:
    return pd.DataFrame([score_run(rule, r) for r in records])


def calibrate(rule: WarningRule, records: Sequence[RunRecord], fa_per_100: float) -> WarningRule | None:
    """``rule`` at the lowest threshold of :data:`THRESHOLDS` whose false alarms on ``records`` are at most
    ``fa_per_100`` per 100 steps; None when none is. Each run's score series is computed once."""
    series = [score_series(rule, r) for r in records]
    for threshold in THRESHOLDS:
        candidate = replace(rule, threshold=threshold)
        rows = pd.DataFrame([score_run(candidate, r, s) for r, s in zip(records, series, strict=True)])
        if summarize(rows)["false_alarms_per_100"] <= fa_per_100:
            return candidate
    return None


# ---- the logistic models -------------------------------------------------------------------------------------------
def z_table(records: Sequence[RunRecord], signals: Sequence[str]) -> pd.DataFrame:
    """Per run and step after the baseline: every signal's z-score (the rule's own) and the step's label: 1 in a
    collapsed run's hit window, 0 in a run that did not collapse; other steps are left out."""
    probe = replace(RULE_DEFAULTS, signals=tuple(signals), weights=(0.0,) * len(signals))
    rows = []
    for record in records:
        watch = CollapseWatch(probe)
        for step, metrics in _step_dicts(record):
            watch.update(step, metrics)
            z = watch.z_scores()
            if z is None:
                continue
            if record.onset is None:
                label = 0
            elif record.onset - HORIZON <= step <= record.onset - 1:
                label = 1
            else:
                continue
            rows.append({"run": str(record.run.path), "step": step, "label": label, **z})
    return pd.DataFrame(rows)


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = L2, iterations: int = 50) -> tuple[float, np.ndarray]:
    """L2-penalised logistic regression by Newton's method (the intercept unpenalised): ``(intercept, weights)``.
    ``x`` ``[n, d]``, ``y`` ``[n]`` in {0, 1}."""
    n, d = x.shape
    design = np.hstack([np.ones((n, 1)), x])  # [n, d + 1]
    beta = np.zeros(d + 1)
    penalty = np.diag([0.0] + [l2] * d)
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-design @ beta))  # [n]
        gradient = design.T @ (p - y) + penalty @ beta
        hessian = design.T @ (design * (p * (1 - p))[:, None]) + penalty
        step = np.linalg.solve(hessian, gradient)
        beta -= step
        if np.abs(step).max() < 1e-10:
            break
    return float(beta[0]), beta[1:]


def logistic_rule(records: Sequence[RunRecord], signals: Sequence[str], name: str) -> WarningRule:
    """A logistic model over ``signals``' z-scores fitted on ``records`` (threshold 0, to be calibrated)."""
    table = z_table(records, signals)
    if table.empty or table.label.nunique() < 2:
        raise ValueError(f"{name}: the development runs give no collapsed and non-collapsed steps to fit on")
    intercept, weights = fit_logistic(table[list(signals)].to_numpy(float), table.label.to_numpy(float))
    return replace(RULE_DEFAULTS, signals=tuple(signals), weights=tuple(round(float(w), 6) for w in weights),
                   intercept=round(intercept, 6), name=name)


def candidates(dev: Sequence[RunRecord]) -> list[WarningRule]:
    """Every registered candidate, uncalibrated: one rule per signal, and the logistic models fitted on ``dev``."""
    single = [replace(RULE_DEFAULTS, signals=(s,), weights=(1.0,), name=s) for s in SIGNALS]
    return single + [logistic_rule(dev, signals, name) for name, signals in MODELS.items()]


def select(calibrated: Sequence[WarningRule], dev: Sequence[RunRecord]) -> WarningRule:
    """The registered choice: the highest development recall at the operating point, then the longest median lead,
    then the fewest signals."""
    def key(rule: WarningRule) -> tuple[float, float, int]:
        s = summarize(score_rule(rule, dev))
        return (_or(s["recall"], -1.0), _or(s["lead_median"], -1.0), -len(rule.signals))

    return max(calibrated, key=key)


def _or(value: float, default: float) -> float:
    return default if math.isnan(value) else value


def registration() -> dict[str, Any]:
    """What the study fixes before any of its evaluations (docs/collapse.md commits it)."""
    defaults = RULE_DEFAULTS
    return {
        "collapse": f"final eval accuracy more than {100 * COLLAPSE_DROP:.0f} points below the start (the powered "
                    "and drift experiments' definition)",
        "onset": "the first evaluation from which every evaluation to the end is more than "
                 f"{100 * ONSET_DROP:.0f} points below the start",
        "hit": f"a warning at a step in [onset - {HORIZON}, onset - 1]; lead time: onset minus the first such step",
        "false_alarm": "a warning in a run that did not collapse; rate: per 100 watched steps (after the baseline) "
                       "of such runs",
        "operating_point": f"false alarms <= {FALSE_ALARMS_PER_100} per 100 steps on the development runs",
        "recall_curve_at": list(FA_GRID),
        "signals": {s.name: {"key": s.key, "direction": s.direction, "family": s.family} for s in SIGNALS.values()},
        "rule": {"baseline_steps": defaults.baseline_steps, "smoothing": defaults.smoothing,
                 "refractory": defaults.refractory, "z_clip": defaults.z_clip,
                 "relative_floor": defaults.relative_floor,
                 "thresholds": [THRESHOLDS[0], THRESHOLDS[-1], 0.25]},
        "candidates": {"single": list(SIGNALS), "logistic": {k: list(v) for k, v in MODELS.items()},
                       "logistic_fit": f"L2 {L2} on the weights, Newton's method; label 1 on a collapsed run's hit "
                                       "window, 0 on every watched step of a run that did not collapse"},
        "selection": "the candidate with the highest development recall at the operating point, then the longest "
                     "median lead, then the fewest signals; shipped as moestab's default rule",
        "dev": {"issue52_stage1": {"arms": list(DEV_DRIFT_ARMS), "seeds": [2000, 2014], "lr": 5e-4},
                **{arm: {"fields": fields, "seeds": [seeds[0], seeds[-1]]} for arm, (split, fields, seeds)
                   in NEW_ARMS.items() if split == "dev"}},
        "held_out": {arm: {"split": split, "fields": fields, "seeds": [seeds[0], seeds[-1]]}
                     for arm, (split, fields, seeds) in NEW_ARMS.items() if split != "dev"},
        "readings": "Held-out recall and false alarms of the shipped rule at the operating point are the result. "
                    "Routing signals add over the baselines if the best candidate holding a routing signal has a "
                    "higher held-out recall at the operating point than the best baselines-only candidate (both "
                    "chosen on the development runs); otherwise they add nothing here, and that is reported.",
    }


# ---- cost, fit and report ------------------------------------------------------------------------------------------
ESTIMATED_SECONDS = {"run": {"embedded:fine": 217.0, "embedded": 120.0}, "base": {"embedded:fine": 250.0,
                                                                               "embedded": 150.0}}
"""Core-seconds per run and per warm-started base on this project's 2-core machine, by model family: the fine
model's from the drift experiment's plan (docs/drift.md), the default model's guessed at about half (4 layers of 8
experts against 8 of 64)."""


def plan(runs: Sequence[GridRun], cached_seeds: Iterable[int] = range(2000, 2015)) -> str:
    """The study's own runs and their estimated cost (bases of seeds the drift experiment built are cached)."""
    cached = set(cached_seeds)
    seconds, bases = 0.0, set()
    for run in runs:
        family = run.config.model.split(",")[0]
        seconds += ESTIMATED_SECONDS["run"][family]
        if run.config.seed not in cached or family != "embedded:fine":
            bases.add((family, run.config.seed))
    seconds += sum(ESTIMATED_SECONDS["base"][family] for family, _ in bases)
    by_arm: dict[str, int] = {}
    for run in runs:
        by_arm[run.run_dir.parent.name] = by_arm.get(run.run_dir.parent.name, 0) + 1
    return (f"{len(runs)} runs ({', '.join(f'{a} {n}' for a, n in by_arm.items())}) and {len(bases)} new bases: "
            f"~{seconds / 3600:.1f} core-hours estimated")


def _records(runs: Iterable[StudyRun]) -> list[RunRecord]:
    missing = [str(r.path) for r in runs if not _finished(r.path)]
    if missing:
        raise FileNotFoundError(f"{len(missing)} run(s) of the study are not finished, e.g. {missing[:3]}; run them "
                                "first (`scripts/collapse_study.py run`, scripts/drift_experiment.py run)")
    return [read_run(r) for r in runs]


def _finished(path: Path) -> bool:
    try:
        return read_run_info(path).status == "finished"
    except RunError:  # a missing or unreadable run is not finished: the caller lists it
        return False


def rule_to_dict(rule: WarningRule) -> dict[str, Any]:
    return {"name": rule.name, "signals": list(rule.signals), "weights": list(rule.weights),
            "intercept": rule.intercept, "threshold": rule.threshold}


def rule_from_dict(data: dict[str, Any]) -> WarningRule:
    return replace(RULE_DEFAULTS, name=data["name"], signals=tuple(data["signals"]), weights=tuple(data["weights"]),
                   intercept=float(data["intercept"]), threshold=float(data["threshold"]))


def _table(rules: Sequence[WarningRule], records: Sequence[RunRecord], split: str) -> list[dict[str, Any]]:
    return [{"split": split, "rule": r.name, "signals": " ".join(r.signals), "threshold": r.threshold,
             **summarize(score_rule(r, records))} for r in rules]


def fit(dev: Sequence[RunRecord]) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """Calibrate every candidate on the development runs and choose one (the registered selection), with the best of
    each family: ``(candidates, per-run rows of the chosen rule, choice)``, as ``dev_candidates.csv``,
    ``dev_runs.csv`` and ``chosen.json`` hold them."""
    calibrated = [c for c in (calibrate(rule, dev, FALSE_ALARMS_PER_100) for rule in candidates(dev)) if c]
    chosen = select(calibrated, dev)
    baseline_only = [r for r in calibrated if all(SIGNALS[s].family == "baseline" for s in r.signals)]
    with_routing = [r for r in calibrated if any(SIGNALS[s].family == "routing" for s in r.signals)]
    choice = {"shipped": rule_to_dict(chosen), "best_baselines_only": rule_to_dict(select(baseline_only, dev)),
              "best_with_routing": rule_to_dict(select(with_routing, dev)),
              "calibrated": [rule_to_dict(r) for r in calibrated]}
    return pd.DataFrame(_table(calibrated, dev, "dev")), score_rule(chosen, dev), choice


def report(dev: Sequence[RunRecord], held: Sequence[RunRecord],
           choice: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Score the chosen rules on the held-out runs once: ``(per held-out run under the shipped rule, every
    calibrated candidate per held-out set and together, the recall curve)``; the curve re-calibrates the shipped rule
    and the best of each family on the development runs at each rate of :data:`FA_GRID`."""
    calibrated = [rule_from_dict(d) for d in choice["calibrated"]]
    rows = []
    for split in [*sorted({r.run.split for r in held}), "held_out"]:
        subset = [r for r in held if split in ("held_out", r.run.split)]
        rows += _table(calibrated, subset, split)
    curve = []
    roles = {choice[k]["name"]: choice[k] for k in ("shipped", "best_baselines_only", "best_with_routing")}
    for fa in FA_GRID:
        for rule in map(rule_from_dict, roles.values()):  # a rule holding two roles once
            at = calibrate(rule, dev, fa)
            if at is not None:
                curve.append({"false_alarms_per_100_dev": fa, "rule": rule.name, "threshold": at.threshold,
                              **{f"held_out_{k}": v for k, v in summarize(score_rule(at, held)).items()}})
    return score_rule(rule_from_dict(choice["shipped"]), held), pd.DataFrame(rows), pd.DataFrame(curve)


FIT_FILES = ("dev_candidates.csv", "dev_runs.csv", "chosen.json")
REPORT_FILES = ("held_out_runs.csv", "held_out.csv", "recall_curve.csv")


def save_fit(fitted: tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]], dest: str | Path) -> list[Path]:
    """:func:`fit`'s result as :data:`FIT_FILES` in ``dest``."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    table, per_run, choice = fitted
    paths = [dest / name for name in FIT_FILES]
    table.to_csv(paths[0], index=False)
    per_run.to_csv(paths[1], index=False)
    paths[2].write_text(json.dumps(choice, indent=1) + "\n")
    return paths


def save_report(reported: Sequence[pd.DataFrame], dest: str | Path) -> list[Path]:
    """:func:`report`'s result as :data:`REPORT_FILES` in ``dest``."""
    paths = [Path(dest) / name for name in REPORT_FILES]
    for path, table in zip(paths, reported, strict=True):
        table.to_csv(path, index=False)
    return paths


def write_fit(runs: Sequence[StudyRun], dest: str | Path) -> list[Path]:
    """:func:`fit` on the development runs of ``runs``, saved to ``dest`` (:data:`FIT_FILES`)."""
    return save_fit(fit(_records([r for r in runs if r.split == "dev"])), dest)


def write_report(runs: Sequence[StudyRun], choice: dict[str, Any], dest: str | Path, own: str | Path) -> list[Path]:
    """:func:`report` on ``runs``, saved to ``dest`` (:data:`REPORT_FILES`); and ``manifest.csv``, the study's own
    runs (of :data:`NEW_ARMS`, relative to ``own``; the development runs borrowed from issue 52 are in its manifest)
    with their hashes, times and commits."""
    held = _records([r for r in runs if r.split != "dev"])
    dev = _records([r for r in runs if r.split == "dev"])
    paths = save_report(report(dev, held, choice), dest)
    manifest([r.path for r in runs if r.arm in NEW_ARMS], own).to_csv(Path(dest) / "manifest.csv", index=False)
    return [*paths, Path(dest) / "manifest.csv"]
