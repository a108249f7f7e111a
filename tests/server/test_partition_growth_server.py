"""Servers follow the cluster's partitions as they grow: the assigner places the new
partitions among the live servers, and the old ones stay where they are."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
from server_harness import read_all, replica_logs, wait_for, write_each

from waltz_client import (
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClient,
    WaltzClientCallbacks,
    WaltzClientConfig,
)
from waltz_client.cluster import admin
from waltz_client.cluster.zk import close

pytestmark = pytest.mark.timeout(240)


def test_the_servers_take_the_new_partitions_and_keep_the_old(make_cluster):
    cluster = make_cluster(partitions=2, servers=2)
    zk = cluster.zk_connect()
    try:
        before = admin.read_cluster(zk, cluster.layout.root).ownership.partitions
        assert all(owner is not None for owner, _ in before.values())
        admin.add_partitions(zk, cluster.layout.root, 6)
        deadline = time.monotonic() + 60
        while True:
            owners = admin.read_cluster(zk, cluster.layout.root).ownership.partitions
            if len(owners) == 6 and all(owner is not None for owner, _ in owners.values()):
                break
            assert time.monotonic() < deadline, f"new partitions still unowned: {owners}"
            time.sleep(0.1)
        assert {p: owners[p] for p in (0, 1)} == before  # no move, no new generation
        servers = sorted({owner for owner, _ in owners.values()})
        assert len(servers) == 2
        assert sorted(sum(1 for o, _ in owners.values() if o == s) for s in servers) == [3, 3]
    finally:
        close(zk)


def test_growth_under_load_loses_nothing_and_every_partition_serves(make_cluster):
    """A producer writes to every partition it knows while `waltz cluster add-partitions`
    grows the cluster from 2 to 4; a consumer following every partition applies all of it:
    each committed transaction exactly once, in the partition it was written to."""
    cluster = make_cluster(partitions=2, servers=2)
    config = WaltzClientConfig(cluster.zookeeper_connect, zk_root=cluster.layout.root)

    class Keep(WaltzClientCallbacks):
        def __init__(self) -> None:
            self.applied: dict[int, list[bytes]] = {}
            self.added: list[list[int]] = []

        def client_high_water_mark(self, partition_id: int) -> int:
            return len(self.applied.get(partition_id, [])) - 1

        async def apply_transaction(self, t: Transaction) -> None:
            self.applied.setdefault(t.partition_id, []).append(await t.data())

        def partitions_added(self, partition_ids: list[int]) -> None:
            self.added.append(partition_ids)

    class Spread(TransactionContext):
        def __init__(self, i: int) -> None:
            self.i = i
            self.partition = -1

        def partition_id(self, num_partitions: int) -> int:
            self.partition = self.i % num_partitions
            return self.partition

        def execute(self, builder: TransactionBuilder) -> bool:
            builder.set_data(b"tx-%d" % self.i)
            return True

    async def scenario() -> None:
        keep = Keep()
        committed: dict[int, list[bytes]] = {}
        async with (
            WaltzClient(config, keep) as consumer,
            WaltzClient(
                WaltzClientConfig(
                    cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False
                )
            ) as producer,
        ):
            grown = asyncio.Event()

            async def produce() -> None:
                i = 0
                while not grown.is_set() or len(committed) < 4 or i < 400:
                    batch = [Spread(i + k) for k in range(20)]
                    results = await asyncio.gather(*(producer.submit(c) for c in batch))
                    for c, r in zip(batch, results, strict=True):
                        assert r.committed, r
                        committed.setdefault(c.partition, []).append(b"tx-%d" % c.i)
                    i += 20
                    assert i < 20_000, "the new partitions never committed"

            load = asyncio.ensure_future(produce())
            await asyncio.sleep(0.5)
            grow = await asyncio.to_thread(
                subprocess.run,
                [
                    sys.executable, "-m", "waltz_client.tools.cli", "cluster", "add-partitions",
                    "--zookeeper", cluster.zookeeper_connect, "--root", cluster.layout.root,
                    "--to", "4",
                ],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert grow.returncode == 0, grow.stdout + grow.stderr
            assert "grew from 2 to 4 partitions" in grow.stdout
            grown.set()
            await load
            assert sorted(committed) == [0, 1, 2, 3]
            deadline = time.monotonic() + 120
            while any(len(keep.applied.get(p, [])) < len(committed[p]) for p in committed):
                assert time.monotonic() < deadline, "the consumer did not catch up"
                await asyncio.sleep(0.1)
            assert consumer.num_partitions == 4 and keep.added == [[2, 3]]
        for p, written in committed.items():
            # In commit order each partition's feed is what the producer saw committed
            # (concurrent submissions may commit in any order: compare as sets, and count).
            assert sorted(keep.applied[p]) == sorted(written), p
            assert len(set(keep.applied[p])) == len(keep.applied[p])  # exactly once

    asyncio.run(scenario())


def data_of(cluster, partition: int) -> list[list[bytes]]:
    return [[r.data for r in log] for log in replica_logs(cluster, partition)]


def test_a_storage_node_down_during_growth_grows_when_it_returns_and_catches_up(make_cluster):
    cluster = make_cluster(partitions=2)
    asyncio.run(write_each(cluster, range(2), 10, b"before"))
    cluster.storages[2].kill()
    zk = cluster.zk_connect()
    try:
        admin.add_partitions(zk, cluster.layout.root, 4)
    finally:
        close(zk)
    # Two of three replicas live: every partition, old and new, commits.
    asyncio.run(write_each(cluster, range(4), 10, b"during"))
    cluster.storages[2].start()  # grows its control file at start, then catches up
    asyncio.run(write_each(cluster, range(4), 10, b"after"))

    def identical() -> bool:
        for p in range(4):
            logs = data_of(cluster, p)
            expected = 30 if p < 2 else 20
            if any(len(log) != expected for log in logs) or not logs[0] == logs[1] == logs[2]:
                return False
        return True

    wait_for(identical, 120, "the returned node to hold every partition like the others")


def test_the_assigner_killed_as_the_cluster_grows_leaves_no_partition_unserved(make_cluster):
    cluster = make_cluster(partitions=2, servers=2)
    asyncio.run(write_each(cluster, range(2), 10, b"before"))
    zk = cluster.zk_connect()
    try:
        admin.add_partitions(zk, cluster.layout.root, 6)
        cluster.servers[0].kill()  # the lowest ID: the assigner, at once
        wait_for(
            lambda: list(admin.read_cluster(zk, cluster.layout.root).servers) == ["server-1"],
            60,
            "the killed server's registration to expire",
        )

        def all_owned_by_the_survivor() -> bool:
            owners = admin.read_cluster(zk, cluster.layout.root).ownership.partitions
            return len(owners) == 6 and all(o == "server-1" for o, _ in owners.values())

        wait_for(all_owned_by_the_survivor, 60, "the survivor to own all six partitions")
    finally:
        close(zk)
    asyncio.run(write_each(cluster, range(6), 10, b"after"))
    # Nothing committed before the growth is lost, and every partition serves reads.
    for p in range(6):
        records = read_all(cluster, p)
        before = [b"before-%d-%d" % (p, i) for i in range(10)] if p < 2 else []
        assert sorted(records) == sorted(before + [b"after-%d-%d" % (p, i) for i in range(10)])
