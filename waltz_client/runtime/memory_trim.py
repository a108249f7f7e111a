"""Give the memory a closed connection made a daemon hold back to the operating system.

A peer can make a daemon hold a few hundred MB (replies it never reads, up to the
per-connection limits of ``peer_limits``). When its connection closes, Python frees
those buffers, but glibc keeps large freed blocks in its heap arenas for reuse, so the
process's RSS can stay hundreds of MB above where it was. ``malloc_trim(0)`` hands the
free pages back.

Trimming costs in proportion to what it returns, about 0.1 ms per MB (measured: 35-110 ms
after freeing 512 MB of 8 MiB buffers, 19 ms for 184 MB in a server, well under 1 ms when
nothing is free). It runs as a loop callback: a thread would not spare the loop, because
malloc_trim holds each arena's lock while it works and the loop's own allocations (from
the main arena, where the daemons build their replies) wait on it (measured: the loop
stalled 47-71 ms while a thread trimmed 512 MB, 50 ms when the loop trimmed it). On a C
library without malloc_trim (musl, macOS) the trimmer does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import math
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


def find_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the symbols already loaded in this process
    except (OSError, AttributeError, TypeError):  # no such symbol; no dlopen(NULL) (Windows)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


MALLOC_TRIM = find_malloc_trim()  # looked up once per process


class MemoryTrimmer:
    """Trims the heap after connections close, at most once per ``min_interval``.

    ``soon()`` only schedules. The trim runs ``delay`` seconds after a close (or at the
    end of the interval since the previous trim), and once more ``min_interval`` later:
    work a closed connection had in flight (a read from storage, a read on a worker
    thread) frees its buffers after the close, and the second trim returns those too. A
    flood of connections costs one trim per interval at most.
    """

    def __init__(
        self,
        min_interval: float = 5.0,
        delay: float = 1.0,
        trim: Callable[[int], int] | None = MALLOC_TRIM,
    ) -> None:
        self.min_interval = min_interval
        self.delay = delay
        self._trim = trim
        self._pending: asyncio.TimerHandle | None = None
        self._closed_since_trim = False
        self._last = -math.inf  # loop time of the last trim

    def soon(self) -> None:
        """A connection closed: trim shortly, and once more a little later."""
        if self._trim is None:
            return
        self._closed_since_trim = True
        if self._pending is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside the daemon's loop: nothing to schedule on
            return
        wait = max(self.delay, self._last + self.min_interval - loop.time())
        self._pending = loop.call_later(wait, self._run, loop)

    def cancel(self) -> None:
        """Drop a pending trim (the daemon is stopping)."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        self._pending = None
        assert self._trim is not None
        started = time.perf_counter()
        self._trim(0)
        self._last = loop.time()
        log.debug("malloc_trim(0) took %.1f ms", (time.perf_counter() - started) * 1000)
        if self._closed_since_trim:  # the follow-up, for what in-flight work frees later
            self._closed_since_trim = False
            self._pending = loop.call_later(self.min_interval, self._run, loop)
