"""Deferred Ctrl-C and SIGTERM: the loop finishes the step in flight, saves, and exits cleanly."""

from __future__ import annotations

import signal
import threading
from types import FrameType

from moestab.run_folder import schema

SIGNALS = (signal.SIGINT, signal.SIGTERM)


EXIT_COLLAPSE_STOP = 3
"""``moestab train``'s exit status when ``--on-collapse-warning stop`` stopped the run."""


def exit_status(status: str, signum: int, collapse_stop: bool = False) -> int:
    """``moestab train``'s exit status for a run that ended ``status`` (run.json): 0 ``finished``; ``interrupted``:
    :data:`EXIT_COLLAPSE_STOP` when a collapse warning stopped it, else 128 + the number of the signal that stopped
    it, as a shell reports a process a signal ended (130 SIGINT, 143 SIGTERM; 130 for a process of a multi-process
    run stopped because another one was signalled), so a script tells a stopped run from a finished one; 1
    otherwise."""
    if status == schema.STATUS_FINISHED:
        return 0
    if status == schema.STATUS_INTERRUPTED and collapse_stop:
        return EXIT_COLLAPSE_STOP
    if status == schema.STATUS_INTERRUPTED:
        return 128 + (signum or signal.SIGINT)
    return 1


class GracefulInterrupt:
    """Context manager turning the first SIGINT or SIGTERM into a flag; a second one interrupts at once
    (as ``KeyboardInterrupt``, so the run is still marked ``interrupted``)."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""
        self.signum = 0  # the signal's number, once one came
        self._previous: dict[int, object] = {}

    def __enter__(self) -> GracefulInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        self.signum = signum
