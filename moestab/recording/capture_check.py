"""What a trainer does when its captured routes fail a route-integrity check (``moestab.metrics.integrity``).

One wording and one policy for every entry point (``moestab train``, the TRL integration, ``DiagnosticsRun``):
``warn`` (default) logs the first failing step and records it in run.json's ``warnings``, and training goes on;
``refuse`` raises :class:`~moestab.metrics.integrity.BrokenCaptureError` naming the step, the layer and the check.
``moestab train`` judges a step's capture before its updates, so a refused capture is never replayed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from moestab.metrics.integrity import BrokenCaptureError, failures, route_integrity
from moestab.recording.batch import RolloutBatch
from moestab.routing.routes import Routes
from moestab.run_folder import schema
from moestab.run_folder.schema import INTEGRITY_POLICIES

WARNING_PREFIX = "route integrity:"
"""How run.json's warning about a failing capture starts (one per run)."""


def check_policy(policy: str) -> None:
    if policy not in INTEGRITY_POLICIES:
        raise ValueError(f"route_integrity must be one of {list(INTEGRITY_POLICIES)}, got {policy!r}")


def verdict(metrics: Mapping[str, object], *, step: int | None = None, policy: str = "warn",
            agreement: bool = True) -> str | None:
    """None when the step's ``routes/integrity/*`` keys pass; else the message naming the failing layers and checks.
    Under ``refuse`` the message is raised as :class:`BrokenCaptureError`."""
    check_policy(policy)
    problems = failures(metrics, agreement=agreement)
    if not problems:
        return None
    where = f"step {step}: " if step is not None else ""
    shown = "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")
    message = f"{WARNING_PREFIX} {where}the captured routes failed {len(problems)} check(s): {shown}"
    if policy == "refuse":
        raise BrokenCaptureError(f"{message}. Stopped before these routes were used (route_integrity refuse); check "
                                 "the rollout engine's route capture, or set route_integrity warn to go on")
    return message


def warn_once(message: str | None, warnings: tuple[str, ...], add: Callable[[str], None],
              log: Callable[[str], None]) -> None:
    """Log ``message`` and add it to run.json's ``warnings`` unless the run already holds a route-integrity
    warning (the first failing step says enough; every step's keys hold the rest)."""
    if message is None or any(w.startswith(WARNING_PREFIX) for w in warnings):
        return
    log(message)
    add(message)


def refuse_broken_capture(batch: RolloutBatch, free: Routes | None, replay: str) -> None:
    """``moestab train --route-integrity refuse``, before a step's updates: :class:`BrokenCaptureError` when the
    rollout's routes fail a check against the trainer's free pi_old routes (``free``; None: the reference-free checks
    only). Under a base-routed replay the agreement is not judged (the rollout routes as the base by design)."""
    captured = batch.response(batch.routes.indices).cpu().numpy()  # [tokens, layers, k]
    reference = None if free is None else batch.response(free.indices).cpu().numpy()
    judged = replay not in schema.BASE_ROUTED_MODES
    metrics = route_integrity(captured.astype(np.int16), None if reference is None else reference.astype(np.int16),
                              num_experts=batch.routes.num_experts, agreement=judged)
    verdict(metrics, policy="refuse", agreement=judged)
