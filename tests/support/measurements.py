"""A measurement that fills a token-table column of its own (issue 56.1): what a contributor adds, in one place.

``LogpNewAgain`` scores pi_new once more after the step's last update and writes the log-probs to a column of its
own, declared beside it; the built-in ``NewPolicy`` writes the same forward's log-probs to ``logp_new``, so the two
columns must agree exactly wherever the tables are written (one process or several, either trainer).
"""

from __future__ import annotations

from moestab.recording import measurements
from moestab.recording.step_fields import TOKEN, StepField

COLUMN = "logp_new_again"


class LogpNewAgain(measurements.Measurement):
    """pi_new's log-probs from a forward of its own, in column ``logp_new_again``."""

    fills = ("logp_new_again",)
    declares = (StepField("logp_new_again", TOKEN, column=COLUMN, optional=True),)

    @staticmethod
    def applies(setup: measurements.MeasureSetup) -> bool:
        return True

    def after_step(self, fwd, measured) -> None:
        self.logp_new_again = fwd.free(measured).logp  # [B, T]


ADDED = {"logp-new-again": LogpNewAgain}
"""Measurements a test adds by name (tests/support/dist_worker.py adds them in its processes too)."""


def add(name: str) -> tuple[type[measurements.Measurement], ...]:
    """``measurements.MEASUREMENTS`` with measurement ``name`` added."""
    return (*measurements.MEASUREMENTS, ADDED[name])
