"""Deferred Ctrl-C: the loop finishes the step in flight, saves, and exits cleanly."""

from __future__ import annotations

import signal
import threading
from types import FrameType


class GracefulInterrupt:
    """Context manager turning the first SIGINT into a flag; a second SIGINT interrupts at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def __enter__(self) -> GracefulInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
