"""The server against real ZooKeeper, real storage processes and real sockets: quorum
commits, recovery, catch-up, the undecidable case and lock conflicts."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import urllib.error
import urllib.request

import pytest
from server_harness import PartitionClient, partition_metadata, replica_logs, wait_for

from waltz_client.cluster.metadata import UNRESOLVED
from waltz_client.wire.client_messages import (
    AppendRequest,
    HighWaterMarkRequest,
    HighWaterMarkResponse,
    MountRequest,
    MountStatus,
)
from waltz_client.wire.framing import HANDSHAKE_BYTES, Hello, Service
from waltz_client.wire.records import Record, ReqId
from waltz_client.wire.storage_client import StorageClient

pytestmark = pytest.mark.timeout(240)


def health(cluster, server: int = 0) -> dict:
    url = f"http://127.0.0.1:{cluster.servers[server].ready['http_port']}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        return json.load(e)


def assert_replicas_identical(cluster, partition: int, length: int) -> None:
    """Stop everything, then compare every replica's records byte for byte."""
    cluster.stop()
    logs = replica_logs(cluster, partition)
    for i, records in enumerate(logs):
        assert [r.transaction_id for r in records] == list(range(length)), f"storage-{i}"
        assert records == logs[0], f"storage-{i} differs from storage-0"


async def append_many(client: PartitionClient, n: int, tag: bytes) -> list[ReqId]:
    ids = [client.append(tag + b"-%d" % i) for i in range(n)]
    await client.flush()
    return ids


def test_commits_with_three_and_two_replicas_and_waits_without_a_quorum(make_cluster):
    cluster = make_cluster()

    async def scenario() -> int:
        client = PartitionClient(cluster, 0)
        await client.mount()
        ids = await append_many(client, 200, b"three")
        assert client.high_water_mark == 199 and set(ids) <= client.committed()

        cluster.storages[2].kill()
        ids = await append_many(client, 50, b"two")
        # Appends in flight when the replica died may be lost; later ones commit on two.
        ids = await append_many(client, 50, b"two-again")
        assert set(ids) <= client.committed()
        committed = client.high_water_mark

        cluster.storages[1].kill()
        pending = [client.append(b"one-%d" % i) for i in range(5)]
        await asyncio.sleep(3)
        assert client.high_water_mark == committed, "acknowledged without a quorum"
        assert not set(pending) & client.committed()

        cluster.storages[1].start()
        ids = await append_many(client, 20, b"resumed")
        assert set(ids) <= client.committed()
        cluster.storages[2].start()
        ids = await append_many(client, 20, b"all-back")
        assert set(ids) <= client.committed()
        reader = PartitionClient(cluster, 0)
        await reader.mount()
        await reader.wait_feed(client.high_water_mark)
        assert reader.feed == client.feed
        await client.close()
        await reader.close()
        return client.high_water_mark

    hwm = asyncio.run(scenario())
    # storage-2 rejoined last; wait for a session that includes it before comparing bytes.
    wait_for(
        lambda: len({r.session_id for r in partition_metadata(cluster, 0).replicas.values()}) == 1,
        30,
        "every replica in one session",
    )
    assert_replicas_identical(cluster, 0, hwm + 1)


async def _inject_tail(cluster, storage: int, start: int, count: int) -> list[Record]:
    """Records a dead owner wrote to one replica only, in its own (the current) session."""
    meta = partition_metadata(cluster, 0)
    port = cluster.storages[storage].ready["port"]
    params = cluster.created.params
    records = [
        Record(start + i, ReqId(99, 0, 0, i), 7, b"uncommitted-%d" % i) for i in range(count)
    ]
    async with await StorageClient.connect("127.0.0.1", port) as sc:
        await sc.open(params.key, params.num_partitions)
        await sc.append(meta.session_id, 0, records)
    return records


def test_recovery_truncates_an_uncommitted_tail(make_cluster):
    cluster = make_cluster()

    async def scenario() -> int:
        client = PartitionClient(cluster, 0)
        await client.mount()
        await append_many(client, 100, b"committed")
        await client.close()
        committed = client.high_water_mark
        cluster.servers[0].kill()
        tail = await _inject_tail(cluster, 0, committed + 1, 3)
        cluster.servers[0].start()
        client = PartitionClient(cluster, 0, client.client_id)
        await client.mount()
        assert await client.flush() == committed
        ids = await append_many(client, 10, b"after")
        assert client.feed[-1].transaction_id == committed + 10
        assert set(ids) <= client.committed()
        assert not {r.req_id for r in tail} & client.committed()
        await client.close()
        return committed + 10

    hwm = asyncio.run(scenario())
    assert_replicas_identical(cluster, 0, hwm + 1)
    assert all(b"uncommitted" not in r.data for r in replica_logs(cluster, 0)[0])


def test_a_replica_that_was_down_catches_up(make_cluster):
    cluster = make_cluster()

    async def scenario() -> int:
        client = PartitionClient(cluster, 0)
        await client.mount()
        await append_many(client, 10, b"before")
        cluster.storages[2].stop()
        await append_many(client, 300, b"while-down")
        cluster.storages[2].start()
        await append_many(client, 10, b"after")
        await client.close()
        return client.high_water_mark

    hwm = asyncio.run(scenario())

    def caught_up() -> bool:
        meta = partition_metadata(cluster, 0)
        return (
            all(
                r.session_id == meta.session_id and r.closing_high_water_mark == UNRESOLVED
                for r in meta.replicas.values()
            )
            and len(meta.replicas) == 3
        )

    wait_for(caught_up, 30, "storage-2 to join a session")
    assert_replicas_identical(cluster, 0, hwm + 1)


def test_an_undecidable_recovery_waits_instead_of_guessing(make_cluster):
    cluster = make_cluster()

    async def commit() -> int:
        client = PartitionClient(cluster, 0)
        await client.mount()
        await append_many(client, 20, b"committed")
        await client.close()
        return client.high_water_mark

    committed = asyncio.run(commit())
    cluster.servers[0].kill()
    asyncio.run(_inject_tail(cluster, 0, committed + 1, 2))
    cluster.storages[1].stop()
    cluster.storages[2].stop()
    cluster.servers[0].start()

    def waiting() -> str:
        status = health(cluster)["partitions"].get("0", {}).get("status", "")
        return status if "undecidable" in status else ""

    wait_for(waiting, 30, "the undecidable state")
    # With storage-1 back the tail has 1 vote and storage-2 might hold it: still undecidable.
    cluster.storages[1].start()
    for _ in range(3):
        asyncio.run(asyncio.sleep(1.5))
        assert health(cluster)["partitions"]["0"]["state"] == "recovering"
    cluster.storages[2].start()
    wait_for(lambda: health(cluster)["partitions"]["0"]["state"] == "active", 30, "recovery")

    async def check() -> None:
        client = PartitionClient(cluster, 0)
        await client.mount()
        assert await client.flush() == committed
        await client.close()

    asyncio.run(check())
    assert_replicas_identical(cluster, 0, committed + 1)


def test_lock_conflicts_are_rejected_with_the_conflicting_transaction(make_cluster):
    cluster = make_cluster()
    account_a, account_b = 0x1111, 0x2222

    async def scenario() -> None:
        client = PartitionClient(cluster, 0)
        await client.mount()
        await append_many(client, 3, b"warm-up")  # hwm 2
        first = client.append(b"debit a", write_locks=(account_a,))
        # Computed against the same state (hwm 2): conflicts with the first even in flight.
        second = client.append(b"debit a again", write_locks=(account_a,), client_high_water_mark=2)
        other = client.append(b"debit b", write_locks=(account_b,), client_high_water_mark=2)
        reader = client.append(b"read a", read_locks=(account_a,), client_high_water_mark=2)
        await client.flush()
        by_req = {h.req_id: h.transaction_id for h in client.feed}
        assert first in by_req and other in by_req
        assert client.lock_failures[second] == by_req[first]
        assert client.lock_failures[reader] == by_req[first]
        assert second not in by_req and reader not in by_req
        # Up to date with the feed, the same lock succeeds.
        retry = client.append(b"debit a, retried", write_locks=(account_a,))
        # An append lock is taken but never checked.
        blind = client.append(b"append a", append_locks=(account_a,), client_high_water_mark=-1)
        await client.flush()
        assert {retry, blind} <= client.committed()
        after_blind = client.append(
            b"late", write_locks=(account_a,), client_high_water_mark=by_req[first]
        )
        await client.flush()
        assert after_blind in client.lock_failures
        await client.close()

    asyncio.run(scenario())


def test_a_malformed_frame_closes_only_that_connection(make_cluster):
    cluster = make_cluster()
    port = cluster.servers[0].ready["port"]

    async def scenario() -> None:
        client = PartitionClient(cluster, 0)
        await client.mount()
        await append_many(client, 5, b"ok")
        with socket.create_connection(("127.0.0.1", port), timeout=5) as bad:
            bad.sendall(Hello(Service.SERVER, 1, 1).encode())
            assert len(bad.recv(HANDSHAKE_BYTES)) == HANDSHAKE_BYTES
            bad.sendall(struct.pack(">IB", 5, 2) + b"\x00\x00\x00\x01")  # a truncated Append
            assert bad.recv(100) == b""  # closed by the server
        with socket.create_connection(("127.0.0.1", port), timeout=5) as http:
            http.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert http.recv(100) == b""
        ids = await append_many(client, 5, b"still-ok")
        assert set(ids) <= client.committed()
        assert client.conn is not None
        q = client.req_id()
        answer = client._expect(q)
        client.conn.send(HighWaterMarkRequest(q))
        response = await asyncio.wait_for(answer, 10)
        assert isinstance(response, HighWaterMarkResponse)
        assert response.transaction_id == client.high_water_mark
        await client.close()

    asyncio.run(scenario())
    assert cluster.servers[0].running


def test_stale_generations_and_non_owners_are_refused(make_cluster):
    cluster = make_cluster(partitions=2, servers=2)

    async def scenario() -> None:
        client = PartitionClient(cluster, 0)
        await client.mount()
        assert client.conn is not None
        current = client.generation
        stale = ReqId(client.client_id, current - 1, 0, 999)
        client.conn.send(AppendRequest(stale, -1, (), (), (), 0, b"stale generation"))
        answer = client._expect(ReqId(client.client_id, current - 1, 0, 1000))
        client.conn.send(MountRequest(ReqId(client.client_id, current - 1, 0, 1000), -1, 99))
        assert (await asyncio.wait_for(answer, 10)).status == MountStatus.STALE_GENERATION
        client.append(b"current generation")
        assert await client.flush() == 0
        assert [h.req_id.generation for h in client.feed] == [current]
        assert stale not in client.lock_failures

        # The other partition's owner is the other server (two partitions, two servers).
        other = PartitionClient(cluster, 1)
        await other.mount()
        assert other.conn is not None and other.conn.endpoint != client.conn.endpoint
        q = ReqId(client.client_id, current, 1, 2000)
        answer = client._expect(q)
        client.conn.send(MountRequest(q, -1, 1))
        assert (await asyncio.wait_for(answer, 10)).status == MountStatus.NOT_OWNER
        await client.close()
        await other.close()

    asyncio.run(scenario())
