"""Fencing and truncation only from the rightful owner, against a real cluster.

Anyone who can read ZooKeeper knows the cluster key and a partition's current store
session. Such a stranger on a storage port must not be able to fence the owning server
out (by jumping to a huge session ID) nor cut committed transactions (by lowering the
low-water mark, or truncating under the current session). Each attack is refused with
a specific error, and the owner goes on committing with nothing lost.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from waltz_client import WaltzClient, WaltzClientConfig
from waltz_client.cluster.admin import read_params
from waltz_client.cluster.metadata import PartitionMetadata
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close, connect
from waltz_client.transaction import TransactionBuilder, TransactionContext
from waltz_client.wire.records import Record, ReqId
from waltz_client.wire.storage_client import StorageClient, StorageFailure
from waltz_client.wire.storage_messages import StorageError

pytestmark = pytest.mark.timeout(300)

PARTITION = 0


class Put(TransactionContext):
    def __init__(self, data: bytes) -> None:
        self.data = data

    def partition(self, num_partitions: int) -> int:
        return PARTITION

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(1)
        builder.set_data(self.data)
        return True


async def write(cluster, first: int, n: int) -> None:
    config = WaltzClientConfig(cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False)
    async with WaltzClient(config) as client:
        for i in range(first, first + n):
            assert await client.submit(Put(b"tx-%d" % i))


async def read_all(cluster) -> list[bytes]:
    config = WaltzClientConfig(cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False)
    async with WaltzClient(config) as reader:
        return [r.data async for r in reader.read(PARTITION)]


def public_metadata(cluster):
    """What any ZooKeeper reader learns: the cluster key and the current session."""
    zk = connect(cluster.zookeeper_connect)
    try:
        params = read_params(zk, cluster.layout.root)
        data, _ = zk.get(ClusterPaths.of(cluster.layout.root).partition(PARTITION))
        return params, PartitionMetadata.decode(data).session_id
    finally:
        close(zk)


async def refused(call, error: StorageError, fragment: str) -> None:
    with pytest.raises(StorageFailure) as excinfo:
        await call
    assert excinfo.value.error == error, excinfo.value
    assert fragment in str(excinfo.value)


def test_a_stranger_can_neither_fence_the_owner_nor_cut_committed_transactions(make_cluster):
    cluster = make_cluster(partitions=1)
    asyncio.run(write(cluster, 0, 30))
    # A restarted owner recovers in a new session: 0..29 are below the low-water mark.
    cluster.servers[0].restart()
    asyncio.run(write(cluster, 30, 10))
    params, session = public_metadata(cluster)

    async def attack(address: str) -> int:
        host, port = address.rsplit(":", 1)
        async with await StorageClient.connect(host, int(port)) as c:
            await c.open(params.key, params.num_partitions)
            for bogus in (2**63 - 1, session + 1):
                await refused(
                    c.max_transaction_id(bogus, PARTITION),
                    StorageError.SESSION_UNKNOWN,
                    f"session {bogus} is newer than the newest session the cluster metadata",
                )
            # Replaying the owner's own session: the committed prefix is out of reach.
            await refused(
                c.set_low_water_mark(session, PARTITION, -1),
                StorageError.TRUNCATE_REFUSED,
                "would lower the local low-water mark from 29 to -1",
            )
            await refused(
                c.truncate(session, PARTITION, -1),
                StorageError.TRUNCATE_REFUSED,
                "would drop transactions up to the local low-water mark 29",
            )
            # Above the mark are this session's own commits.
            await refused(
                c.truncate(session, PARTITION, 32),
                StorageError.TRUNCATE_REFUSED,
                f"session {session} may not truncate",
            )
            return await c.max_transaction_id(session, PARTITION)

    for address in cluster.layout.storage_addresses:
        assert asyncio.run(attack(address)) == 39, address
    # The owner was not fenced: it still commits in its session, and nothing was lost.
    asyncio.run(write(cluster, 40, 10))
    assert public_metadata(cluster)[1] == session
    assert asyncio.run(read_all(cluster)) == [b"tx-%d" % i for i in range(50)]


def test_a_replica_poisoned_under_the_current_session_is_left_out_not_waited_for(make_cluster):
    """Found by `waltz fuzz`: a peer replaying the current session (possible without
    mutual TLS) appends junk to one replica and raises its low-water mark over it. That
    replica then refuses every truncation; recovery must leave it out and go on with the
    other two, instead of failing every attempt and stalling the partition."""
    cluster = make_cluster(partitions=1)
    asyncio.run(write(cluster, 0, 1))
    params, session = public_metadata(cluster)
    address = cluster.layout.storage_addresses[0]

    async def poison() -> None:
        host, port = address.rsplit(":", 1)
        async with await StorageClient.connect(host, int(port)) as c:
            await c.open(params.key, params.num_partitions)
            junk = [Record(1 + i, ReqId(1, 1, PARTITION, 1 + i), 0, b"junk") for i in range(3)]
            await c.append(session, PARTITION, junk)
            await c.set_low_water_mark(session, PARTITION, 3)

    asyncio.run(poison())
    # The partition goes on committing on the two clean replicas, also after the
    # poisoned one is back in reach and the partition tries to take it in again.
    asyncio.run(asyncio.wait_for(write(cluster, 1, 10), 60))
    time.sleep(6)
    asyncio.run(asyncio.wait_for(write(cluster, 11, 10), 60))
    assert asyncio.run(read_all(cluster)) == [b"tx-%d" % i for i in range(21)]
    assert "truncating it to the decided high-water mark" in cluster.servers[0].log_tail(400)
