"""A Flush settles appends only on the client's current mount.

The server rebuilds a partition's object when it loses its ZooKeeper session (or
ownership goes away and comes back) while client connections stay open. The rebuilt
object's recovery may commit appends the old object had in flight. A Flush the rebuilt
object answered outside a mount would tell the client those appends were lost, and the
client would send them again: a transaction committed twice. The server now refuses
such a Flush (NOT_MOUNTED); the client mounts again and the Mount's answer settles them.
"""

from __future__ import annotations

import asyncio

import pytest
from server_harness import PartitionClient, wait_for

from waltz_client.wire.client_messages import ErrorCode, ErrorResponse, FlushRequest, FlushResponse

pytestmark = pytest.mark.timeout(300)


async def _flush_at_the_new_partition_object(client: PartitionClient) -> asyncio.Future:
    """Send a Flush on the old connection until the rebuilt partition object queues it
    (before it exists the server answers NOT_OWNER)."""
    while True:
        assert client.conn is not None
        q = client.req_id()
        answer = client._expect(q)
        client.conn.send(FlushRequest(q))
        try:
            response = await asyncio.wait_for(asyncio.shield(answer), 2.0)
        except TimeoutError:
            return answer  # queued: the partition is recovering
        if not (isinstance(response, ErrorResponse) and response.code == ErrorCode.NOT_OWNER):
            return answer
        await asyncio.sleep(0.2)


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
            # The owner loses its ZooKeeper session (paused past the session timeout):
            # it stops the partition, registers again, and serves it with a new partition
            # object, while this connection stays open.
            cluster.servers[0].pause()
            await asyncio.sleep(8.0)
            cluster.servers[0].resume()
            await asyncio.to_thread(
                wait_for, lambda: client.suspended, 60, "the old partition object's feed to end"
            )
            answer = await _flush_at_the_new_partition_object(client)
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
