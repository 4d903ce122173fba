"""Watching a run for a collapse while it trains: every trainer's one way (``moestab train``, the TRL integration,
``DiagnosticsRun``, ``moestab watch``) of feeding the warning rule (:mod:`moestab.metrics.collapse_warning`) each
step's metrics, adding its keys to the step's line, and saying what a warning means.

:func:`watch_run` is ``moestab watch``'s half: a run followed as any trainer writes it, the rule run over its own
metrics.jsonl lines (a run written without a watch, an older one or another tool's, is watched the same way).

``on_collapse_warning`` (:data:`POLICIES`): ``log`` logs the warning and keeps it in run.json's ``warnings``;
``stop`` does that and stops the run after the step (``moestab train``: saved, ``interrupted``, resumable; TRL:
``control.should_save`` and ``should_training_stop``; ``DiagnosticsRun.log``: :class:`CollapseStop`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from moestab.metrics import keys
from moestab.metrics.collapse_warning import DEFAULT_RULE, SIGNALS, CollapseWarning, CollapseWatch, WarningRule
from moestab.run_folder import schema
from moestab.run_folder.errors import Skipped
from moestab.run_folder.reader import MetricsFollower, load_metrics, read_run_info

POLICIES = schema.COLLAPSE_POLICIES
MISSING_AFTER = 4
"""Steps, in baselines, after which a rule whose signals are still missing says so once."""


class CollapseStop(RuntimeError):
    """A collapse warning under ``on_collapse_warning="stop"`` (raised by ``DiagnosticsRun.log`` after it wrote the
    step: the trainer around it stops)."""

    def __init__(self, warning: CollapseWarning, message: str) -> None:
        super().__init__(message)
        self.warning = warning


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"on_collapse_warning must be one of {list(POLICIES)} (log: log the warning and keep it in "
                         f"run.json; stop: stop the run after the step), got {policy!r}")
    return policy


@keys.computes(keys.COLLAPSE_SCORE, keys.COLLAPSE_WARNING, keys.COLLAPSE_WARNING_ON)
def collapse_keys(watch: CollapseWatch, warning: CollapseWarning | None) -> dict[str, object]:
    """The step's ``collapse/*`` keys: none while the rule's signals have no baseline yet."""
    if watch.score is None:
        return {}
    out: dict[str, object] = {keys.COLLAPSE_SCORE: watch.score, keys.COLLAPSE_WARNING: int(warning is not None)}
    if warning is not None:
        out[keys.COLLAPSE_WARNING_ON.format(signal=warning.signal)] = 1
    return out


class CollapseMonitor:
    """The rule's watch over one run, the warning's policy, and the note that it cannot fire (its signals missing)."""

    def __init__(self, policy: str = "log", rule: WarningRule = DEFAULT_RULE) -> None:
        self.policy = check_policy(policy)
        self.rule = rule
        self.watch = CollapseWatch(rule)
        self._seen = 0
        self._noted = False

    def replay(self, history: Iterable[tuple[int, Mapping[str, object]]]) -> CollapseMonitor:
        """Feed steps already recorded (a resumed run's), silently: the state a run that never stopped would have."""
        for step, metrics in history:
            self.observe(step, metrics)
        self.missing_note()  # due before the run stopped: it was said then, so it is marked said, not said again
        return self

    def replay_run(self, run_dir: str | Path, through: int) -> CollapseMonitor:
        """:meth:`replay` of ``run_dir``'s metrics.jsonl up to step ``through`` (none when it has no file yet)."""
        if through < 1 or not (Path(run_dir) / "metrics.jsonl").is_file():
            return self
        m = load_metrics(run_dir, skipped=[], keys=self.rule.keys)  # a bad line is left out, as the live step was
        m = m[m[keys.STEP] <= through]
        return self.replay((int(row[keys.STEP]), row) for row in m.to_dict("records"))

    def observe(self, step: int, metrics: Mapping[str, object]) -> tuple[dict[str, object], CollapseWarning | None]:
        """Feed step ``step``: the keys to add to its line and the warning that fired, if any."""
        self._seen += 1
        warning = self.watch.update(step, metrics)
        return collapse_keys(self.watch, warning), warning

    def message(self, warning: CollapseWarning, resume: str = "") -> str:
        """The warning's line; under ``stop``, what stopped and how to go on (``resume``: the command)."""
        text = warning.message(self.rule)
        if self.policy == "stop":
            text += "; stopped (on_collapse_warning=stop)" + (f": continue with `{resume}`" if resume else "")
        return text

    def missing_note(self) -> str | None:
        """Once, when :data:`MISSING_AFTER` baselines of steps have passed with a signal still missing: why no
        warning can fire in this run."""
        if self._noted or self.watch.score is not None or self._seen < MISSING_AFTER * self.rule.baseline_steps:
            return None
        self._noted = True
        missing = [f"{s} ({SIGNALS[s].key})" for s in self.rule.signals if not self.watch.has_baseline(s)]
        return (f"collapse watch: no warning can fire in this run: after {self._seen} steps the rule still lacks "
                f"{self.rule.baseline_steps} values of {', '.join(missing)}")


# ---- moestab watch: a run followed as it is written --------------------------------------------------------------
@dataclass
class Watched:
    """What a watch saw: the last step read, the warnings (their steps) and the lines it left out."""

    last_step: int = 0
    warnings: list[int] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    status: str = ""


def watch_run(run: str | Path, *, follow: bool = True, interval: float = 2.0, say: Callable[[str], None] = print,
              sleep: Callable[[float], None] = time.sleep, monitor: CollapseMonitor | None = None) -> Watched:
    """Read ``run``'s metrics.jsonl step by step, saying each warning as it fires (and why none can fire, once);
    with ``follow``, keep reading every ``interval`` seconds while the run is live (run.json ``running`` and its
    writer alive: a killed run ends the watch). A file rewritten from an earlier step (a resumed run) is watched
    again from its start: the steps already said are fed silently, the rest as they come. ``RunError`` when ``run``
    is not a readable run folder (checked first)."""
    run = Path(run)
    seen = Watched(status=read_run_info(run).live_status())
    fresh = monitor or CollapseMonitor()
    monitor = fresh
    follower = MetricsFollower(run, seen.skipped)
    said, restarts, silent_until = 0, 0, 0
    say(f"watching {run} ({seen.status}); rule: {monitor.rule.describe()}")
    while True:
        running = read_run_info(run).live_status() == schema.STATUS_RUNNING  # before reading: no line lost
        for row in follower.new_rows(final=not running):
            if follower.restarts != restarts:  # the file was rewritten: its state is rebuilt from its first line
                restarts, silent_until = follower.restarts, seen.last_step
                monitor, seen.last_step = CollapseMonitor(fresh.policy, fresh.rule), 0
            step = int(row[keys.STEP])
            if step <= seen.last_step:  # a repeated or earlier step of a damaged file: already watched
                continue
            seen.last_step = step
            _, warning = monitor.observe(step, row)
            if step <= silent_until:
                continue
            note = monitor.missing_note()
            if note is not None:
                say(note)
            if warning is not None:
                seen.warnings.append(step)
                say(monitor.message(warning))
        for problem in seen.skipped[said:]:
            say(f"left out: {problem.file}, line {problem.line}: {problem.reason}")
        said = len(seen.skipped)
        if not (follow and running):
            break
        sleep(interval)
    seen.status = read_run_info(run).live_status()
    say(f"{run}: {seen.status} at step {seen.last_step}; {len(seen.warnings)} collapse warning(s)"
        + (f" (steps {', '.join(map(str, seen.warnings))})" if seen.warnings else ""))
    return seen
