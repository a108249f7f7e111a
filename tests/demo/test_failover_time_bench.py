"""`waltz bench --scale failover`: the gaps from known commit times, the tables, and a
small run on a real two-server cluster (4 partitions: a kill, then a rolling restart)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from waltz_client.tools.demo.failover_time import (
    KillCell,
    RollCell,
    Step,
    gap_across,
    kill_table,
    longest_gap,
    outage_across,
    per_partition,
    roll_table,
)

pytestmark = pytest.mark.timeout(300)


def test_the_gap_across_an_event() -> None:
    times = [1.0, 2.0, 3.0, 7.5, 8.0]
    # The kill at 3.5: the last commit before it at 3.0, the first after at 7.5.
    assert gap_across(times, 3.5) == (4.5, 4.0)
    assert gap_across(times, 3.0) == (4.5, 4.5)  # a commit at the instant is before it
    assert gap_across(times, 0.5) == (0.5, 0.5)  # nothing before: from the event
    assert gap_across(times, 9.0) is None  # nothing after
    # For a partition the kill stopped, answers read just after it (sent before it) do
    # not hide the outage after them.
    outage = [1.0, 2.0, 3.0, 3.6, 3.7, 9.0, 9.1]
    assert gap_across(outage, 3.5) == pytest.approx((0.6, 0.1))
    assert outage_across(outage, 3.5) == pytest.approx((5.3, 5.5))
    assert outage_across([2.0, 2.5], 0.5) == (1.5, 1.5)
    assert outage_across(times, 9.0) is None


def test_the_longest_gap_within_a_window() -> None:
    times = [1.0, 2.0, 2.1, 4.0, 4.2, 9.0]
    # From the last commit before the window (2.1) on: 2.1 -> 4.0 is the longest.
    assert longest_gap(times, 3.0, 5.0) == pytest.approx(1.9)
    # A gap still open at the end counts up to the end.
    assert longest_gap(times, 4.1, 8.0) == pytest.approx(3.8)
    assert longest_gap([], 1.0, 2.5) == pytest.approx(1.5)


def test_writes_in_flight_are_spread_over_the_partitions() -> None:
    assert [per_partition(256, p) for p in (4, 64, 256, 512)] == [64, 4, 1, 1]


def kill(gaps: list[float | None], back: list[float | None], moved: list[int]) -> KillCell:
    return KillCell(len(gaps), 2, 4.0, True, "server-0", moved, gaps, back, 64.0, 1000, 4.5)


def test_a_kill_is_summed_up_over_the_partitions_that_moved() -> None:
    cell = kill([5.0, 0.01, 5.4, 0.02], [4.9, 0.0, 5.3, 0.0], [0, 2])
    assert (cell.moved_max_s, cell.moved_median_s, cell.others_max_s) == (5.4, 5.2, 0.02)
    assert (cell.all_back_s, cell.goal_s) == (5.3, 6.0)
    lines = kill_table([cell]).splitlines()
    assert lines[0].startswith("| partitions | in flight each | session timeout s | moved |")
    assert lines[2] == "| 4 | 2 | 4 | 2 of 4 | 5.40 | 5.20 | 0.02 | 4.50 | 5.30 | 6 |"
    # A partition that never came back within the wait says so.
    lost = kill([5.0, 0.01, None, 0.02], [4.9, 0.0, None, 0.0], [0, 2])
    assert lost.moved_max_s is None and lost.all_back_s is None
    assert lost.moved_median_s is None  # half of them never came back
    assert "| 2 of 4 | none | none | 0.02 | 4.50 | none | 6 |" in kill_table([lost])


def test_a_rolling_restart_reports_each_step() -> None:
    steps = [
        Step("SIGTERM server-0", 0.0, 1.0, True, 0.25),
        Step("server-0 back", 1.0, 4.0, True, 0.3),
        Step("SIGTERM server-1", 4.0, 5.0, False, 2.0),
    ]
    cell = RollCell(4, 2, 10.0, False, steps, [0.3, 0.25, 2.0, 0.01])
    assert (cell.max_s, cell.median_s) == pytest.approx((2.0, 0.275))
    lines = roll_table([cell]).splitlines()
    assert lines[0] == (
        "| partitions | in flight each | longest gap ms: max | median | SIGTERM server-0 ms "
        "| server-0 back ms | SIGTERM server-1 ms |"
    )
    assert lines[2] == "| 4 | 2 | 2,000 | 275 | 250 | 300 | 2,000 (not all back) |"


def test_failover_on_a_real_cluster(tmp_path, zookeeper_available) -> None:
    out = tmp_path / "cells.json"
    result = subprocess.run(
        [
            sys.executable, "-m", "waltz_client.tools.cli", "bench", "--scale", "failover",
            "--scale-partitions", "4", "--scale-concurrency", "8",
            "--scale-session-timeout", "2", "--seconds", "1", "--runs", "1",
            "--data-dir", str(tmp_path / "data"), "--json", str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "ZooKeeper session timeout 2 s" in result.stdout
    cells = {c["scenario"]: c for c in json.loads(out.read_text())["cells"]}
    killed = cells["kill"]
    # Two servers share 4 partitions: the killed one owned 2, and they came back (a
    # dead owner's partitions move only once its session has expired).
    assert killed["partitions"] == 4 and killed["each"] == 2 and len(killed["moved"]) == 2
    assert killed["all_back_s"] is not None and killed["all_back_s"] > 1.0
    assert killed["ownership_moved_s"] is not None and killed["ownership_moved_s"] > 1.0
    assert killed["moved_max_s"] >= killed["moved_median_s"] > 0
    assert all(g is not None for g in killed["gaps_s"])
    rolled = cells["rolling restart"]
    assert [s["what"] for s in rolled["steps"]] == [
        "SIGTERM server-0", "server-0 back", "SIGTERM server-1", "server-1 back",
    ]  # fmt: skip
    assert all(s["complete"] for s in rolled["steps"])
    assert len(rolled["longest_gap_s"]) == 4 and rolled["max_s"] > 0
    assert "| 4 | 2 | 2 | 2 of 4 | " in result.stdout
