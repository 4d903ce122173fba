"""A collapse warning: a rule over a run's per-step signals, run the same way live (``moestab train``, the TRL
integration, ``DiagnosticsRun``, ``moestab watch``) and offline (the study that measures it, docs/collapse.md).

Each signal is a metrics.jsonl key with the direction it moves before a collapse. Per signal, the rule keeps the
median and the MAD of the run's first :attr:`WarningRule.baseline_steps` values (its own early baseline), an
exponentially weighted mean of every value, and its z-score ``direction * (mean - median) / scale``. The rule's score
is ``intercept + sum(weight * z)`` (one signal with weight 1: a threshold on its z-score; several: a logistic
model's log-odds), and a warning fires when the score passes :attr:`WarningRule.threshold` after the baseline, at
most once every :attr:`WarningRule.refractory` steps. The state is a function of the metrics seen so far: a resumed
run rebuilds it by feeding its metrics.jsonl again (:func:`warnings_over`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

MAD_TO_SD = 1.4826
"""A normal distribution's sd over its median absolute deviation."""
COLLAPSE_DROP = 0.10
"""A run has collapsed when its final eval accuracy is more than this (absolute) below its start."""
ONSET_DROP = 0.05
"""A collapse's onset: the first evaluation from which every evaluation is more than this below the start."""


@dataclass(frozen=True)
class Signal:
    """A per-step metrics.jsonl ``key`` that moves in ``direction`` (+1 rises, -1 falls) before a collapse (a per-layer
    list is read as its mean over layers); ``family``: ``routing`` / ``ratio`` / ``policy`` (moestab's) or
    ``baseline`` (what any trainer logs)."""

    name: str
    key: str
    direction: int
    family: str


SIGNALS: dict[str, Signal] = {s.name: s for s in (
    Signal("vol", "routing/old_new/changed", +1, "routing"),
    Signal("rollout_flip", "routing/rollout_old_free/router_flip", +1, "routing"),
    Signal("load_entropy", "experts/load_entropy", -1, "routing"),
    Signal("ratio_log_var", "ratio/token_log_var", +1, "ratio"),
    Signal("ratio_q999", "ratio/token_q0.999", +1, "ratio"),
    Signal("mismatch_k3", "mismatch/rollout_old_free/k3", +1, "ratio"),
    Signal("entropy", "entropy", -1, "policy"),
    Signal("reward", "reward/mean", -1, "baseline"),
    Signal("kl", "loss/kl/old_new_k3", +1, "baseline"),
    Signal("clip", "clip/token_frac", +1, "baseline"),
    Signal("grad_norm", "grad_norm", +1, "baseline"),
)}
"""Every candidate signal of the study, by name (docs/collapse.md registers them)."""


@dataclass(frozen=True)
class WarningRule:
    """A warning rule: ``signals`` (names in :data:`SIGNALS`) weighted by ``weights`` plus ``intercept``, against
    ``threshold``; the early baseline, smoothing, z-score clip and refractory period every signal shares."""

    signals: tuple[str, ...]
    weights: tuple[float, ...]
    threshold: float
    intercept: float = 0.0
    baseline_steps: int = 10
    smoothing: float = 0.3
    """The exponentially weighted mean's weight on the newest value."""
    refractory: int = 10
    z_clip: float = 10.0
    relative_floor: float = 0.1
    """The z-score's scale is at least this share of the baseline's median (a flat early signal is not noiseless)."""
    name: str = ""

    def __post_init__(self) -> None:
        unknown = [s for s in self.signals if s not in SIGNALS]
        if unknown:
            raise ValueError(f"unknown signal(s) {unknown}; valid: {', '.join(SIGNALS)}")
        if not self.signals or len(self.weights) != len(self.signals):
            raise ValueError(f"a rule needs one weight per signal; got signals {self.signals}, weights "
                             f"{self.weights}")
        if self.baseline_steps < 2 or self.refractory < 1 or not 0.0 < self.smoothing <= 1.0:
            raise ValueError("baseline_steps must be >= 2, refractory >= 1 and smoothing in (0, 1]")

    @property
    def keys(self) -> tuple[str, ...]:
        """The metrics.jsonl keys the rule reads."""
        return tuple(SIGNALS[s].key for s in self.signals)

    def describe(self) -> str:
        if len(self.signals) == 1 and self.intercept == 0.0 and self.weights == (1.0,):
            s = SIGNALS[self.signals[0]]
            word = "rises" if s.direction > 0 else "falls"
            return f"{s.name} ({s.key}) {word} more than {self.threshold:g} robust sd from its first " \
                   f"{self.baseline_steps} steps"
        terms = " + ".join(f"{w:+.3g} z[{s}]" for s, w in zip(self.signals, self.weights, strict=True))
        return f"{self.intercept:+.3g} {terms} > {self.threshold:g}"


DEFAULT_RULE = WarningRule(
    signals=("reward", "kl", "clip", "grad_norm", "vol", "rollout_flip", "load_entropy"),
    weights=(-0.190223, 0.035787, -1.085331, -0.071956, 0.58107, -0.839562, 2.745656),
    intercept=-4.415302, threshold=-1.25, name="logit:baselines+routing",
)
"""The rule every trainer watches with: the one issue 57's study chose on its development runs (a logistic model of
the baselines' and the routing signals' z-scores, calibrated to 0.5 false alarms per 100 steps there;
docs/collapse_results/chosen.json, which a test holds it to). Its measured recall and false alarms: docs/collapse.md."""


@dataclass(frozen=True)
class CollapseWarning:
    """A warning: the ``step`` it fired at, the rule's ``score``, the ``signal`` that contributed most, and every
    signal's z-score."""

    step: int
    score: float
    signal: str
    z: dict[str, float]

    def message(self, rule: WarningRule) -> str:
        s = SIGNALS[self.signal]
        return (f"collapse warning at step {self.step}: {s.name} ({s.key}) is {self.z[self.signal]:+.1f} robust sd "
                f"from its first {rule.baseline_steps} steps (rule score {self.score:.2f} > {rule.threshold:g})")


@dataclass
class _Track:
    """One signal's state: its baseline values (the first ``baseline_steps``), then median and scale; its mean."""

    early: list[float] = field(default_factory=list)
    median: float = math.nan
    scale: float = math.nan
    mean: float = math.nan


class CollapseWatch:
    """The rule's state over one run, fed one step's metrics at a time (:meth:`update`)."""

    def __init__(self, rule: WarningRule) -> None:
        self.rule = rule
        self._tracks = {s: _Track() for s in rule.signals}
        self.last_warning: int | None = None
        self.score: float | None = None

    def _feed(self, track: _Track, value: float) -> None:
        rule = self.rule
        track.mean = value if math.isnan(track.mean) else rule.smoothing * value + (1 - rule.smoothing) * track.mean
        if len(track.early) < rule.baseline_steps:
            track.early.append(value)
            if len(track.early) == rule.baseline_steps:
                ordered = sorted(track.early)
                track.median = _median(ordered)
                mad = _median(sorted(abs(v - track.median) for v in ordered))
                track.scale = max(MAD_TO_SD * mad, rule.relative_floor * abs(track.median), 1e-12)

    def has_baseline(self, signal: str) -> bool:
        """Whether ``signal`` has its baseline (the rule's first ``baseline_steps`` values)."""
        return not math.isnan(self._tracks[signal].scale)

    def z_scores(self) -> dict[str, float] | None:
        """Every signal's clipped z-score now; None while a signal's baseline is incomplete."""
        out = {}
        for name, track in self._tracks.items():
            if math.isnan(track.scale):
                return None
            z = SIGNALS[name].direction * (track.mean - track.median) / track.scale
            out[name] = max(-self.rule.z_clip, min(self.rule.z_clip, z))
        return out

    def update(self, step: int, metrics: Mapping[str, object]) -> CollapseWarning | None:
        """Feed step ``step``'s metrics (a missing or non-finite value leaves its signal as it was: an unmeasured
        step); the warning that fires at this step, if any."""
        for name, track in self._tracks.items():
            value = _scalar(metrics.get(SIGNALS[name].key))
            if value is not None:
                self._feed(track, value)
        z = self.z_scores()
        if z is None:
            self.score = None
            return None
        rule = self.rule
        contributions = {s: w * z[s] for s, w in zip(rule.signals, rule.weights, strict=True)}
        self.score = rule.intercept + sum(contributions.values())
        if not fires(step, self.score, rule.threshold, self.last_warning, rule.refractory):
            return None
        self.last_warning = step
        return CollapseWarning(step, self.score, max(contributions, key=contributions.__getitem__), z)


def fires(step: int, score: float, threshold: float, last_warning: int | None, refractory: int) -> bool:
    """Whether a rule fires at ``step``: its score above ``threshold``, ``refractory`` steps or more after its last
    warning (the one decision :class:`CollapseWatch` and :func:`fire_steps` share)."""
    return score > threshold and (last_warning is None or step - last_warning >= refractory)


def fire_steps(scores: Iterable[tuple[int, float | None]], threshold: float, refractory: int) -> list[int]:
    """The steps a rule fires at, from its score at each step (None before the baseline): what
    :class:`CollapseWatch` decides step by step, for a study that tries many thresholds on one score series."""
    fired: list[int] = []
    for step, score in scores:
        if score is not None and fires(step, score, threshold, fired[-1] if fired else None, refractory):
            fired.append(step)
    return fired


def warnings_over(rule: WarningRule, steps: Iterable[tuple[int, Mapping[str, object]]]) -> list[CollapseWarning]:
    """Every warning ``rule`` fires over ``(step, metrics)`` pairs in step order: the study's offline run and a
    resumed run's rebuilt state are this function."""
    watch = CollapseWatch(rule)
    return [w for step, metrics in steps if (w := watch.update(step, metrics)) is not None]


def collapse_onset(steps: Sequence[int], accuracies: Sequence[float], start: float | None) -> int | None:
    """The onset of a run's collapse from its evaluations (``accuracies`` at ``steps``, in step order) and its start
    accuracy: the first evaluation from which every evaluation to the end is more than :data:`ONSET_DROP` below the
    start, when the final one is more than :data:`COLLAPSE_DROP` below it; None when the run did not collapse (or the
    start is unknown)."""
    if start is None or not accuracies or not accuracies[-1] < start - COLLAPSE_DROP:
        return None
    first = len(accuracies)
    while first > 0 and accuracies[first - 1] < start - ONSET_DROP:
        first -= 1
    return int(steps[first])


def _scalar(value: object) -> float | None:
    """A signal's value at a step: a finite number, or a per-layer list's mean over its finite numbers
    (``experts/load_entropy``); None for anything else (missing, null, NaN, a nested list, an integer too large for a
    float): a run folder is untrusted input."""
    if isinstance(value, list):
        finite = [v for v in (_number(item) for item in value) if v is not None]
        return sum(finite) / len(finite) if finite else None
    return _number(value)


def _number(value: object) -> float | None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _median(ordered: list[float]) -> float:
    n = len(ordered)
    return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])
