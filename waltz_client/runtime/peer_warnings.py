"""Warnings about misbehaving peers, rate-limited so a flood cannot flood the log.

A daemon facing a hostile or broken peer logs one line per incident (at WARNING, with
no traceback) up to ``burst`` lines per ``interval`` seconds; beyond that it counts
the lines it drops and reports the count with the next line it logs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class PeerWarnings:
    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = 20,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._burst = burst
        self._interval = interval
        self._clock = clock
        self._window_start = clock()
        self._logged = 0
        self.suppressed = 0

    def warning(self, message: str, *args: object) -> None:
        now = self._clock()
        if now - self._window_start >= self._interval:
            self._window_start = now
            self._logged = 0
        if self._logged >= self._burst:
            self.suppressed += 1
            return
        self._logged += 1
        if self.suppressed:
            message += " (%d similar warnings suppressed)"
            args = (*args, self.suppressed)
            self.suppressed = 0
        self._log.warning(message, *args)
