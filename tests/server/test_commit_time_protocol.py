"""Commit times through the client protocol, on a real cluster: a client of version 3 sees
each transaction's commit time in its feed (``Transaction.timestamp``/``commit_time``) and
in range reads (format-2 records), the same time both ways, never decreasing; a client
capped at version 2 (as one built before commit times) reads and writes the same
transactions, and sees no time anywhere."""

from __future__ import annotations

import asyncio
import datetime
import time

import pytest
from server_harness import Put, until

from waltz_client import WaltzClient, WaltzClientCallbacks, WaltzClientConfig
from waltz_client.tools.local.cluster import LocalCluster
from waltz_client.transaction import Transaction
from waltz_client.wire.records import (
    FORMAT_1,
    FORMAT_2,
    NO_TIMESTAMP,
    RecordBatch,
    UncheckedRecords,
)

pytestmark = pytest.mark.timeout(240)

N = 60
MINUTE_MS = 60_000


class Recorder(WaltzClientCallbacks):
    """Applies nothing, keeps every transaction the feed delivers."""

    def __init__(self) -> None:
        self.seen: list[Transaction] = []

    async def client_high_water_mark(self, partition_id: int) -> int:
        return self.seen[-1].transaction_id if self.seen else -1

    async def apply_transaction(self, transaction: Transaction) -> None:
        self.seen.append(transaction)


def config(cluster: LocalCluster, version: int | None = None) -> WaltzClientConfig:
    return WaltzClientConfig(
        cluster.zookeeper_connect,
        zk_root=cluster.layout.root,
        partitions=frozenset({0}),
        _max_protocol_version=version,
    )


def versions(client: WaltzClient) -> set[int]:
    """The protocol versions the client's open connections settled on."""
    return {
        conn.protocol_version
        for link in client._links.values()
        for conn in (link.stream, link.rpc)
        if conn is not None
    }


async def read_back(client: WaltzClient, stop: int) -> tuple[list[RecordBatch], list]:
    checked = [b async for b in client.read_batches(0, 0, stop, batch_records=17)]
    unchecked = [b async for b in client.read_batches(0, 0, stop, batch_records=17, checked=False)]
    assert all(isinstance(b, RecordBatch) for b in checked)
    assert all(isinstance(b, UncheckedRecords) for b in unchecked)
    return checked, unchecked  # type: ignore[return-value]


def test_commit_times_reach_a_version_3_client_and_not_a_version_2_one(make_cluster) -> None:
    cluster = make_cluster()

    async def scenario() -> list[int | None]:
        before = time.time() * 1000
        new_feed, old_feed = Recorder(), Recorder()
        async with (
            WaltzClient(config(cluster), new_feed) as new,
            WaltzClient(config(cluster, 2), old_feed) as old,
        ):
            # Both write, both follow the feed: an older client's appends work as ever.
            results = await asyncio.gather(
                *(new.submit(Put(b"new-%d" % i, header=i)) for i in range(N // 2)),
                *(old.submit(Put(b"old-%d" % i, header=i)) for i in range(N // 2)),
            )
            assert all(r.committed for r in results), [r for r in results if not r.committed]
            await until(lambda: len(new_feed.seen) >= N and len(old_feed.seen) >= N, "the feeds")
            after = time.time() * 1000
            assert versions(new) == {3} and versions(old) == {2}

            # Version 3: every transaction has a time, never decreasing, about now.
            txids = [t.transaction_id for t in new_feed.seen]
            assert txids == list(range(N))
            times = [t.timestamp for t in new_feed.seen]
            assert all(isinstance(t, int) for t in times), times
            assert times == sorted(times), times  # type: ignore[type-var]
            for t in times:
                assert t is not None and before - MINUTE_MS < t < after + MINUTE_MS, (t, before)
            for t in new_feed.seen:
                assert t.commit_time == datetime.datetime.fromtimestamp(
                    t.timestamp / 1000,  # type: ignore[operator]
                    datetime.UTC,
                )
                assert t.commit_time is not None and t.commit_time.tzinfo is datetime.UTC

            # ...and its range reads carry the same times in format-2 records.
            checked, unchecked = await read_back(new, N - 1)
            assert {b.format.version for b in checked} == {FORMAT_2.version}
            assert [t for b in checked for t in b.timestamps()] == times
            records = [r async for r in new.read(0)]
            assert [r.timestamp for r in records] == times
            assert {u.format.version for u in unchecked} == {FORMAT_2.version}
            assert [t for u in unchecked for t in u.check().timestamps()] == times

            # Version 2: the same transactions, the same data, no times anywhere.
            assert [t.transaction_id for t in old_feed.seen] == txids
            assert [t.req_id for t in old_feed.seen] == [t.req_id for t in new_feed.seen]
            assert [t.header for t in old_feed.seen] == [t.header for t in new_feed.seen]
            assert all(t.timestamp is None and t.commit_time is None for t in old_feed.seen)
            old_checked, old_unchecked = await read_back(old, N - 1)
            # Checked batches are format 2 whatever the server sent (converted here).
            assert {b.format.version for b in old_checked} == {FORMAT_2.version}
            assert [t for b in old_checked for t in b.timestamps()] == [NO_TIMESTAMP] * N
            data = [r.data for b in checked for r in b.records()]
            assert [r.data for b in old_checked for r in b.records()] == data
            assert sorted(data) == sorted(
                [b"new-%d" % i for i in range(N // 2)] + [b"old-%d" % i for i in range(N // 2)]
            )
            # Unchecked ones are as the server sent them to a version 2 client: format 1.
            assert {u.format.version for u in old_unchecked} == {FORMAT_1.version}
            assert [r.data for u in old_unchecked for r in u.check().records()] == data
            assert [await old.transaction_data(0, i) for i in (0, N - 1)] == [data[0], data[-1]]
        return times

    times = asyncio.run(scenario())

    # A cold cache: the feeds come from storage, with the same times (or none).
    cluster.servers[0].restart()

    async def from_storage() -> None:
        new_feed, old_feed = Recorder(), Recorder()
        async with (
            WaltzClient(config(cluster), new_feed),
            WaltzClient(config(cluster, 2), old_feed),
        ):
            await until(lambda: len(new_feed.seen) >= N and len(old_feed.seen) >= N, "the feeds")
        assert [t.timestamp for t in new_feed.seen] == times
        assert [t.timestamp for t in old_feed.seen] == [None] * N

    asyncio.run(from_storage())
