"""Commit times on a real cluster: the owning server stamps each transaction as it gets its
ID, and the times never go back, not across a change of owner, not when the new owner's
clock is an hour behind (libfaketime), not when the clock steps back under a running owner.
"""

from __future__ import annotations

import asyncio
import glob
import os
import time
from dataclasses import replace

import pytest
from server_harness import owner_of, replica_logs, write_each

from waltz_client import WaltzClient, WaltzClientConfig
from waltz_client.errors import WaltzError
from waltz_client.tools.local.cluster import LocalCluster
from waltz_client.wire.records import NO_TIMESTAMP

FAKETIME = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
HOUR_MS = 3600 * 1000


def stored_times(cluster: LocalCluster) -> list[tuple[int, int]]:
    """(transaction ID, commit time) of every committed transaction, as a range read gives
    them to a client."""

    async def read() -> list[tuple[int, int]]:
        config = WaltzClientConfig(
            cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False
        )
        async with WaltzClient(config) as reader:
            return [(r.transaction_id, r.timestamp) async for r in reader.read(0)]

    return asyncio.run(read())


def assert_never_decreasing(times: list[tuple[int, int]]) -> None:
    assert [txid for txid, _ in times] == list(range(len(times)))
    assert all(t != NO_TIMESTAMP for _, t in times), "a transaction without a commit time"
    for (txid, t), (_, before) in zip(times[1:], times, strict=False):
        assert t >= before, f"transaction {txid} committed at {t}, after one at {before}"


def restart_owner(cluster: LocalCluster, env: dict[str, str] | None) -> None:
    """SIGKILL the only server and start it again (under ``env``): it owns the partition
    again once it has recovered it (the writes that follow wait for that)."""
    server = cluster.servers[0]
    server.kill()
    server.env = env
    server.start()
    owner_of(cluster, 0)


def test_times_are_stamped_at_commit_and_replicated(make_cluster) -> None:
    cluster = make_cluster(servers=1)
    before = time.time() * 1000
    asyncio.run(write_each(cluster, range(1), 30, b"t"))
    after = time.time() * 1000
    times = stored_times(cluster)
    assert len(times) == 30
    assert_never_decreasing(times)
    assert before - 1000 <= times[0][1] and times[-1][1] <= after + 1000
    # Every replica stored the same times (they are part of the record).
    for server in cluster.servers:
        server.stop()
    for storage in cluster.storages:
        storage.stop()
    logs = replica_logs(cluster, 0)
    for records in logs:
        assert [(r.transaction_id, r.timestamp) for r in records] == times


@pytest.mark.skipif(not FAKETIME, reason="libfaketime is not installed (make faketime-deps)")
def test_a_new_owner_with_a_clock_an_hour_behind_never_stamps_back(make_cluster) -> None:
    cluster = make_cluster(servers=1)
    asyncio.run(write_each(cluster, range(1), 20, b"a"))
    first = stored_times(cluster)
    floor = first[-1][1]

    behind = {
        **os.environ,
        "LD_PRELOAD": FAKETIME[0],
        "FAKETIME": f"-{HOUR_MS // 1000}",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",  # timers and timeouts run as usual
    }
    restart_owner(cluster, behind)
    asyncio.run(write_each(cluster, range(1), 20, b"b"))
    second = stored_times(cluster)
    assert_never_decreasing(second)
    # The new owner's clock is an hour behind the last commit: its times stay at it.
    assert [t for _, t in second[20:]] == [floor] * 20
    log_text = cluster.servers[0].log_tail(400)
    assert "ahead of this server's clock" in log_text, log_text

    restart_owner(cluster, None)  # the clock is right again: times follow it
    asyncio.run(write_each(cluster, range(1), 20, b"c"))
    third = stored_times(cluster)
    assert_never_decreasing(third)
    assert third[-1][1] >= time.time() * 1000 - 60_000
    assert third[-1][1] > floor


def test_find_time_gives_the_first_transaction_at_or_after_a_time(make_cluster) -> None:
    cluster = make_cluster(servers=1, storage_args=["--segment-bytes", "4096"])
    asyncio.run(write_each(cluster, range(1), 150, b"early"))
    time.sleep(0.05)
    asyncio.run(write_each(cluster, range(1), 150, b"late"))
    times = stored_times(cluster)
    assert_never_decreasing(times)

    def scan(time_ms: int) -> int:
        return next((txid for txid, t in times if t >= time_ms), len(times))

    probes = sorted({t for _, t in times} | {times[0][1] - 1, times[-1][1] + 1})
    probes += [t + 1 for t in probes]

    async def ask(cap: int | None = None) -> list[int]:
        config = WaltzClientConfig(
            cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False
        )
        if cap is not None:
            config = replace(config, _max_protocol_version=cap)
        async with WaltzClient(config) as client:
            return [await client.find_time(0, probe) for probe in probes]

    assert asyncio.run(ask()) == [scan(p) for p in probes]

    # A client of the protocol before commit times cannot ask, and is told why.
    with pytest.raises(WaltzError, match=r"speaks client protocol 2.*needs 3: upgrade the servers"):
        asyncio.run(ask(cap=2))
