"""A Flush settles appends only on the client's current mount.

The server rebuilds a partition's object when its replica set changes (also on a
ZooKeeper session loss, or ownership going away and coming back) while client
connections stay open. The rebuilt object's recovery may commit appends the old object
had in flight. A Flush the rebuilt object answered outside a mount would tell the client
those appends were lost, and the client would send them again: a transaction committed
twice. The server now refuses such a Flush (NOT_MOUNTED); the client mounts again and
the Mount's answer settles them.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
from conftest import PartitionClient, wait_for

from waltz_client.cluster.admin import add_storage
from waltz_client.cluster.zk import close, connect
from waltz_client.wire.client_messages import ErrorCode, ErrorResponse, FlushRequest, FlushResponse

pytestmark = pytest.mark.timeout(300)


def _unused_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _add_replica(cluster, partition: int) -> None:
    zk = connect(cluster.zookeeper_connect)
    try:
        add_storage(zk, cluster.layout.root, _unused_address(), partitions={partition})
    finally:
        close(zk)


def test_a_flush_to_a_rebuilt_partition_never_makes_a_client_append_twice(make_cluster):
    cluster = make_cluster(storages=3)

    async def scenario() -> None:
        client = PartitionClient(cluster, 0)
        await client.mount()
        for i in range(5):
            client.append(b"before-%d" % i)
        assert await client.flush() == 4

        # An append in flight: one replica of three acknowledges it, no quorum yet.
        cluster.storages[1].pause()
        cluster.storages[2].pause()
        try:
            original = client.append(b"transfer")
            await asyncio.sleep(1.0)  # the owner has handed it to its store session
            assert original not in client.committed()
            # The replica set changes: the server rebuilds the partition object while
            # this connection stays open, and suspends the old object's feeds.
            await asyncio.to_thread(_add_replica, cluster, 0)
            await asyncio.to_thread(
                wait_for, lambda: client.suspended, 60, "the old partition object's feed to end"
            )
            assert client.conn is not None
            q = client.req_id()
            answer = client._expect(q)
            client.conn.send(FlushRequest(q))  # queued in the rebuilt object
        finally:
            cluster.storages[1].resume()
            cluster.storages[2].resume()
        response = await asyncio.wait_for(answer, 120)

        # What a client does with the answer: a Flush Response says every append sent
        # before it that has not appeared on the feed is lost, to be sent again.
        believed_lost = isinstance(response, FlushResponse) and original not in client.committed()
        if not believed_lost:
            assert isinstance(response, ErrorResponse), response
            assert response.code == ErrorCode.NOT_MOUNTED, response
        client.suspended.clear()
        await client.mount()  # the Mount's answer settles the original append
        retried = None
        if believed_lost or original not in client.committed():
            retried = client.append(b"transfer")
        hwm = await client.flush()
        await client.wait_feed(hwm)
        copies = [h for h in client.feed if h.req_id in {original, retried}]
        assert len(copies) == 1, f"the transfer committed {len(copies)} times: {copies}"
        await client.close()

    asyncio.run(scenario())
