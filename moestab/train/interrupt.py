"""Deferred Ctrl-C and SIGTERM: the loop finishes the step in flight, saves, and exits cleanly."""

from __future__ import annotations

import signal
import threading
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class GracefulInterrupt:
    """Context manager turning the first SIGINT or SIGTERM into a flag; a second one interrupts at once
    (as ``KeyboardInterrupt``, so the run is still marked ``interrupted``)."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""
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
