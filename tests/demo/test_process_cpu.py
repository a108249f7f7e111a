"""The benchmarks' CPU accounting of other processes (waltz_client/runtime/process_cpu.py)."""

from __future__ import annotations

import subprocess
import sys
import time

from waltz_client.runtime.process_cpu import cpu_seconds, process_cpu_seconds


def test_a_busy_child_s_cpu_is_counted_to_well_under_a_tick() -> None:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        first = process_cpu_seconds(child.pid)
        time.sleep(0.3)
        second = process_cpu_seconds(child.pid)
        # It spins: it used CPU, and more of it later. Not whole 10 ms ticks: the clock
        # is the kernel's nanosecond one.
        assert 0 < first < second
        assert round(second * 100) != second * 100 or round(first * 100) != first * 100
        assert cpu_seconds([child.pid, child.pid]) >= 2 * second
    finally:
        child.kill()
        child.wait()


def test_this_process_matches_its_own_clock_and_a_gone_one_counts_nothing() -> None:
    import os

    mine = process_cpu_seconds(os.getpid())
    assert abs(mine - time.process_time()) < 0.05
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert process_cpu_seconds(gone.pid) == 0.0
