"""`waltz bench --floor`: the table from known runs, its argument checks, and a real run
whose nodes wrote, and synced, every record."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time

import pytest

from waltz_client.tools.demo.floor import FloorRow, _get, floor_table, measure_floor

pytestmark = pytest.mark.timeout(300)


def row(fsync: bool, writes: int, relay_s: float = 0.1, nodes_s: float = 0.3) -> FloorRow:
    latencies = sorted(0.1 + i / 1000 for i in range(100))
    cpu = {"relay": (relay_s / 2, relay_s / 2), "nodes": (0.0, nodes_s), "client": (0.05, 0.0)}
    return FloorRow(fsync, writes, 1.0, latencies, cpu, [(writes, writes if fsync else 0)] * 3)


def test_the_table_shows_the_median_run_of_each_row() -> None:
    rows = [row(True, 1000), row(True, 3000), row(True, 2000), row(False, 10_000)]
    text = floor_table(rows)
    lines = text.splitlines()
    assert lines[0].startswith("| path (C=1, no logic) | writes/s | p50 ms |")
    assert lines[2].startswith("| client, relay, 3 nodes, quorum 2, fsync off | 10,000 |")
    # The median of three runs is the 2,000-write one: its CPU a write is 0.4 s / 2,000.
    assert lines[3] == (
        "| client, relay, 3 nodes, quorum 2, fdatasync | 2,000 | 0.150 | 0.199 "
        "| 200 us (175 us) | 50 us, 50 us, 25 us |"
    )


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "waltz_client.tools.cli", "bench", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--floor", "--compare"], "--compare and --floor are two separate measurements"),
        (["--floor", "--runs", "0"], "--runs and --size must be at least 1"),
        (["--floor", "--seconds", "0"], "--seconds above 0"),
        (["--floor", "--json", "x.json"], "--json only apply with --compare, not --floor"),
        (["--floor", "--no-zookeeper"], "--no-zookeeper only apply with --compare"),
    ],
)
def test_bad_floor_arguments_are_refused(args: list[str], message: str) -> None:
    result = bench(*args)
    assert result.returncode == 2
    assert "waltz bench: error: " in result.stdout and message in result.stdout


def test_every_node_writes_and_syncs_every_record(tmp_path) -> None:
    synced = measure_floor(str(tmp_path), 1024, 1.0, fsync=True)
    assert synced.writes > 0 and synced.percentile(0.5) > 0
    # Every round went to all three nodes, which wrote and synced each record before
    # the relay let the next round start (the third node may answer late, not skip).
    assert synced.node_work == [(synced.writes, synced.writes)] * 3
    assert set(synced.cpu) == {"relay", "nodes", "client"}
    assert synced.cluster_us > synced.cluster_kernel_us > 0
    unsynced = measure_floor(str(tmp_path), 1024, 1.0, fsync=False)
    assert unsynced.node_work == [(unsynced.writes, 0)] * 3
    assert list(tmp_path.iterdir()) == []  # the nodes' files are removed


def test_the_command_prints_both_rows(tmp_path) -> None:
    result = bench("--floor", "--seconds", "1", "--runs", "1", "--data-dir", str(tmp_path))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "| client, relay, 3 nodes, quorum 2, fsync off |" in result.stdout
    assert "| client, relay, 3 nodes, quorum 2, fdatasync |" in result.stdout


def test_a_process_that_dies_is_named_at_once_not_waited_for() -> None:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    dead = ctx.Process(target=os._exit, args=(3,), name="floor node 1")
    dead.start()
    dead.join()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="floor node 1 exited with code 3"):
        _get(queue, [dead], timeout=60)
    assert time.monotonic() - started < 30
