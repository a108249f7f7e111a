"""CPU time that other processes have used, for the benchmarks.

Read from Linux's per-process CPU clock (``clock_gettime`` of
MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)): every thread of the process, user and
system, to the nanosecond. ``/proc/<pid>/stat`` counts in scheduler ticks (10 ms here),
too coarse for a one-second benchmark row; it is the fallback where the clock is refused.
A process that has exited counts 0.
"""

from __future__ import annotations

import os
import time

_TICKS = os.sysconf("SC_CLK_TCK")
_CPUCLOCK_SCHED = 2


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) so far."""
    try:
        return time.clock_gettime((~pid << 3) | _CPUCLOCK_SCHED)
    except (OSError, OverflowError):
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime
    except (OSError, IndexError, ValueError):
        return 0.0


def cpu_seconds(pids: list[int]) -> float:
    """The CPU seconds of all of ``pids`` so far."""
    return sum(process_cpu_seconds(pid) for pid in pids)
