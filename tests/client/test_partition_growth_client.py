"""A running client follows the cluster's partitions as they grow: the count rises
through a ZooKeeper watch, a client that follows every partition mounts the new ones,
and the application hears of them (``partitions_added``)."""

from __future__ import annotations

import asyncio

import pytest

from waltz_client import Transaction, WaltzClient, WaltzClientCallbacks, WaltzClientConfig
from waltz_client.cluster import admin
from waltz_client.cluster.zk import close

pytestmark = pytest.mark.timeout(240)


class Told(WaltzClientCallbacks):
    def __init__(self) -> None:
        self.added: list[list[int]] = []

    def client_high_water_mark(self, partition_id: int) -> int:
        return -1

    def apply_transaction(self, t: Transaction) -> None:
        pass

    async def partitions_added(self, partition_ids: list[int]) -> None:
        self.added.append(partition_ids)


async def until(predicate, what: str, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def test_a_running_client_learns_the_new_partitions_and_says_so(make_cluster):
    cluster = make_cluster(partitions=2)
    config = WaltzClientConfig(cluster.zookeeper_connect, zk_root=cluster.layout.root)

    async def scenario() -> None:
        following, some = Told(), Told()
        async with (
            WaltzClient(config, following) as everything,
            WaltzClient(
                WaltzClientConfig(
                    cluster.zookeeper_connect, zk_root=cluster.layout.root, partitions={0}
                ),
                some,
            ) as partition_zero,
        ):
            assert everything.num_partitions == 2
            zk = cluster.zk_connect()
            try:
                await asyncio.to_thread(admin.add_partitions, zk, cluster.layout.root, 4)
            finally:
                close(zk)
            await until(lambda: following.added and some.added, "partitions_added")
            assert following.added == [[2, 3]] and some.added == [[2, 3]]
            assert everything.num_partitions == 4 and partition_zero.num_partitions == 4
            followed = everything.partition_stats()
            assert sorted(followed) == [0, 1, 2, 3]
            assert all(s.applies for s in followed.values())
            assert sorted(partition_zero.partition_stats()) == [0]  # it follows only 0

    asyncio.run(scenario())
