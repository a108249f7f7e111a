"""A lagging replica is copied in the background while the partition keeps committing.

A replica added to a partition that already holds many transactions (or one back after
a long absence) is left out of the store session, copied from a member at a limited
rate, and joins at a planned session boundary once close: writes never stop for the
copy. The test slows the copy down (a low rate) and shows transactions committing in the
same store session while it runs, then the replica joining and holding exactly the log.
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from server_harness import (
    PartitionClient,
    cluster_admin,
    partition_metadata,
    replica_logs,
    wait_for,
)

from waltz_client.cluster.admin import assign_partitions, read_assignment
from waltz_client.cluster.metadata import UNRESOLVED

pytestmark = pytest.mark.timeout(300)


def _log(cluster) -> str:
    with open(cluster.servers[0].log_path) as f:
        return f.read()


def _recoveries(cluster) -> int:
    """Store sessions recovered so far (each logs one line)."""
    return len(re.findall(r"session \d+ recovered", _log(cluster)))


def _is_member(cluster, address: str) -> bool:
    meta = partition_metadata(cluster, 0)
    state = meta.replicas.get(address)
    return (
        state is not None
        and state.session_id == max(r.session_id for r in meta.replicas.values())
        and state.closing_high_water_mark == UNRESOLVED
    )


def test_a_new_replica_is_copied_in_the_background_and_joins(make_cluster):
    cluster = make_cluster(
        storages=4,
        server_args=["--catch-up-inline-records", "100", "--catch-up-rate", "400KiB"],
    )
    holders = cluster_admin(cluster, read_assignment)[0].replicas_of(0)
    (new,) = [a for a in cluster.layout.storage_addresses if a not in holders]

    async def scenario() -> None:
        client = PartitionClient(cluster, 0)
        await client.mount()
        for i in range(3000):
            client.append(b"%05d" % i + b"x" * 500)  # ~1.5 MB: several seconds at 400 KiB/s
        assert await client.flush(timeout=120) == 2999

        cluster_admin(cluster, assign_partitions, new, {0})
        await asyncio.to_thread(
            wait_for, lambda: f"catching up replica {new}" in _log(cluster), 60, "the copy"
        )
        recovered = _recoveries(cluster)
        # Writes go on while the replica is copied, in the running store session.
        during = 0
        while f"replica {new} caught up" not in _log(cluster):
            client.append(b"during-%d" % during)
            during += 1
            await client.flush(timeout=60)
            await asyncio.sleep(0.05)
        assert during >= 10, f"only {during} transactions committed during the copy"
        log = _log(cluster)
        copy = log[log.index(f"catching up replica {new}") : log.index(f"replica {new} caught up")]
        assert "recovered" not in copy, "a store session started during the copy"

        await asyncio.to_thread(wait_for, lambda: _is_member(cluster, new), 60, "it joins")
        # One planned boundary: the session that makes it a member. Its recovery is
        # logged after the membership is written, a moment later on a busy machine.
        await asyncio.to_thread(
            wait_for, lambda: _recoveries(cluster) > recovered, 60, "the new member's session"
        )
        assert not client.suspended, "the session boundary suspended the feed"
        for i in range(100):
            client.append(b"after-%d" % i)
        hwm = await client.flush(timeout=60)
        await client.wait_feed(hwm)
        await client.close()
        assert _recoveries(cluster) == recovered + 1, "more than one session boundary"

    started = time.monotonic()
    asyncio.run(scenario())
    print(f"scenario took {time.monotonic() - started:.1f} s")
    cluster.stop()
    logs = replica_logs(cluster, 0)
    lengths = [len(records) for records in logs]
    assert lengths.count(max(lengths)) == 4, lengths  # every replica holds the whole log
    for records in logs[1:]:
        assert records == logs[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--load", "2"], "--load must be in [0, 1], got 2.0"),
        (["--transactions", "0"], "--transactions must be at least 1, got 0"),
        (["--size", "-1"], "--size must be at least 0, got -1"),
    ],
)
def test_the_benchmark_names_a_bad_argument(args, message):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "waltz_client.tools.cli", "server", "bench-catch-up", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout.strip() == f"waltz server bench-catch-up: error: {message}"
