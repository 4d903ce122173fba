"""Probes by name: each takes checkpoints, a suite and settings and returns a :class:`ProbeResult`.

The registry's error lists the valid names; inputs are checked (checkpoint count, dtypes) before any model is
loaded, so bad input fails fast and writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from moestab.probes.checkpoints import Checkpoint, check_dtype, check_same_architecture, load_checkpoint
from moestab.probes.collect import collect
from moestab.probes.compare import Comparison, compare_records
from moestab.probes.errors import ProbeError
from moestab.probes.folder import ProbeResult
from moestab.probes.numerics import numerics
from moestab.probes.saturation import saturation
from moestab.probes.suites import ProbeSuite


@dataclass(frozen=True)
class ProbeSettings:
    """Settings every probe takes."""

    dtype: str = "float32"
    """Precision the checkpoints are loaded in (numerics: the reference precision)."""
    other_dtype: str = "bfloat16"
    """numerics only: the precision compared with ``dtype``."""
    device: str = "cpu"
    batch_size: int = 16
    max_tokens: int | None = None
    """Cut every suite text to this many tokens."""
    reference: int = -1
    """saturation only: index of the reference checkpoint (default: the last)."""
    progress: bool = False

    def check(self) -> None:
        check_dtype(self.dtype)
        check_dtype(self.other_dtype)
        if self.batch_size < 1:
            raise ProbeError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.max_tokens is not None and self.max_tokens < 2:
            raise ProbeError(f"max_tokens must be >= 2, got {self.max_tokens}")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ProbeError(f"device {self.device!r} is not valid; valid: cpu, cuda, cuda:N")


def _comparison_tables(comparison: Comparison, label: str | None = None) -> dict[str, pd.DataFrame]:
    tables = {"summary": comparison.summary, "by_layer": comparison.by_layer,
              "by_position": comparison.by_position, "by_margin": comparison.by_margin}
    if label is None:
        return tables
    return {name: table.assign(comparison=label) for name, table in tables.items()}


def _compare(checkpoints: list[Checkpoint], suite: ProbeSuite, s: ProbeSettings) -> dict[str, pd.DataFrame]:
    (a, b) = checkpoints
    model_a, tok_a = load_checkpoint(a, dtype=s.dtype, device=s.device)
    model_b, tok_b = load_checkpoint(b, dtype=s.dtype, device=s.device)
    check_same_architecture((a.label, model_a), (b.label, model_b))
    kwargs = {"batch_size": s.batch_size, "max_tokens": s.max_tokens, "progress": s.progress}
    record_a = collect(model_a, tok_a, suite.texts, **kwargs)
    record_b = collect(model_b, tok_b, suite.texts, **kwargs)
    return _comparison_tables(compare_records(record_a, record_b))


def _numerics(checkpoints: list[Checkpoint], suite: ProbeSuite, s: ProbeSettings) -> dict[str, pd.DataFrame]:
    (checkpoint,) = checkpoints  # dtype == other_dtype is allowed: the control that must show no flips
    parts = numerics(checkpoint, suite.texts, dtypes=(s.dtype, s.other_dtype), batch_size=s.batch_size,
                     max_tokens=s.max_tokens, device=s.device, progress=s.progress)
    tables: dict[str, list[pd.DataFrame]] = {}
    for label, comparison in parts.items():
        for name, table in _comparison_tables(comparison, label).items():
            tables.setdefault(name, []).append(table)
    return {name: pd.concat(frames, ignore_index=True) for name, frames in tables.items()}


def _saturation(checkpoints: list[Checkpoint], suite: ProbeSuite, s: ProbeSettings) -> dict[str, pd.DataFrame]:
    return {"saturation": saturation(checkpoints, suite.texts, reference=s.reference, dtype=s.dtype,
                                     batch_size=s.batch_size, max_tokens=s.max_tokens, device=s.device,
                                     progress=s.progress)}


@dataclass(frozen=True)
class Probe:
    run: Callable[[list[Checkpoint], ProbeSuite, ProbeSettings], dict[str, pd.DataFrame]]
    checkpoints: str
    """How many checkpoints it takes: 'one', 'two' or 'many' (a run folder gives its last / all checkpoints)."""
    help: str


PROBES: dict[str, Probe] = {
    "compare": Probe(_compare, "two", "routing and log-prob difference between two checkpoints on the same tokens"),
    "numerics": Probe(_numerics, "one", "the same weights in two precisions, and batched vs one sequence at a time"),
    "saturation": Probe(_saturation, "many", "OLMoE router saturation of each checkpoint against a reference"),
}


def get_probe(name: str) -> Probe:
    if name not in PROBES:
        raise ProbeError(f"unknown probe {name!r}; valid probes: {', '.join(PROBES)}")
    return PROBES[name]


def select_checkpoints(probe: str, given: list[list[Checkpoint]]) -> list[Checkpoint]:
    """The checkpoints ``probe`` runs on, from what each argument resolved to (a run folder: its checkpoints)."""
    want = get_probe(probe).checkpoints
    if want == "many":
        chosen = [c for group in given for c in group]
        if len(chosen) < 2:
            raise ProbeError(f"{probe} needs at least 2 checkpoints (or a run folder with several), got {len(chosen)}")
        return chosen
    count = {"one": 1, "two": 2}[want]
    if len(given) != count:
        raise ProbeError(f"{probe} takes {count} checkpoint{'s' if count > 1 else ''} (a run folder means its last "
                         f"checkpoint), got {len(given)}")
    return [group[-1] for group in given]


def run_probe(name: str, checkpoints: list[Checkpoint], suite: ProbeSuite, settings: ProbeSettings) -> ProbeResult:
    probe = get_probe(name)
    settings.check()
    tables = probe.run(checkpoints, suite, settings)
    return ProbeResult(name, [f"{c.label}={c.path}" for c in checkpoints], suite.manifest(),
                       {k: v for k, v in vars(settings).items() if k != "progress"}, tables)
