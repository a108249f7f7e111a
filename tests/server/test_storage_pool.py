"""A server's shared storage connections (storage_pool.py), against real storage processes:
one connection a node whatever the number of sessions, closed by the last release or when
it fails; one partition's error answer leaves it to the others; and the server itself
uses one connection a node for all its partitions."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
import uuid

import pytest
from server_harness import Put, partition_metadata, wait_for, write_each

from waltz_client import WaltzClient, WaltzClientConfig
from waltz_client.wire.records import CRC, FORMAT_2, crc32
from waltz_client.wire.storage_client import StorageClient, StorageFailure
from waltz_client.wire.storage_messages import StorageError
from waltz_server.storage_pool import PoolKey, StoragePool
from waltz_server.store_session import Member, StoreSession

pytestmark = pytest.mark.timeout(240)


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.split()[-1])
    raise AssertionError(f"no metric {name}")


def accepted(cluster, storage: int) -> float:
    return metric(cluster.storages[storage].ready["http_port"], "waltz_storage_connections_total")


async def answers(client: StorageClient) -> None:
    """A request over ``client`` is answered (a Failure answer proves it as well)."""
    with contextlib.suppress(StorageFailure):
        await client.max_transaction_id(-1, 0)


def keys(cluster) -> list[PoolKey]:
    params = cluster.created.params
    return [
        PoolKey(f"127.0.0.1:{s.ready['port']}", params.key, params.num_partitions)
        for s in cluster.storages
    ]


def test_one_connection_a_node_closed_by_the_last_release(make_cluster):
    cluster = make_cluster()
    cluster.servers[0].kill()  # only the test's pool connects
    key = keys(cluster)[0]

    async def scenario() -> None:
        pool = StoragePool()
        before = accepted(cluster, 0)
        # Two sessions ask at once: one dial, one connection.
        a, b = await asyncio.gather(pool.acquire(key, 5.0), pool.acquire(key, 5.0))
        assert a is b and len(pool) == 1
        assert accepted(cluster, 0) == before + 1
        await pool.release(key, a)
        assert not b.closed  # the other session still uses it
        await answers(b)
        await pool.release(key, b)
        assert b.closed and len(pool) == 0
        c = await pool.acquire(key, 5.0)  # the next session dials again
        assert c is not a and accepted(cluster, 0) == before + 2
        await pool.close()
        assert c.closed

    asyncio.run(scenario())


def test_a_held_connection_is_dialled_ahead_and_stays_open_unused(make_cluster):
    cluster = make_cluster()
    cluster.servers[0].kill()  # only the test's pool connects
    key, other = keys(cluster)[:2]

    async def scenario() -> None:
        pool = StoragePool()
        before = accepted(cluster, 0)
        await pool.warm({key}, 5.0, 5.0)
        assert len(pool) == 1 and accepted(cluster, 0) == before + 1  # dialled ahead
        a = await pool.acquire(key, 5.0)
        assert accepted(cluster, 0) == before + 1  # no dial of its own
        await pool.release(key, a)
        assert not a.closed and len(pool) == 1  # held: open with nobody on it
        await answers(a)
        pool.hold({other}, 5.0)  # no longer held: closes, unused
        await wait_for_async(lambda: a.closed)
        await wait_for_async(lambda: len(pool) == 1)  # the other one, dialled
        b = await pool.acquire(key, 5.0)  # dials afresh, and closes with its last user
        assert b is not a and accepted(cluster, 0) == before + 2
        await pool.release(key, b)
        assert b.closed
        await pool.close()
        assert len(pool) == 0

    asyncio.run(scenario())


def test_partitions_recovering_at_once_share_a_connection_to_each_node(make_cluster):
    """A restarted server recovers its 8 partitions over the connections it opened
    before registering, one a node for appends and one for recoveries: not one (with
    TLS, a handshake) a partition and node."""
    cluster = make_cluster(partitions=8)
    server = cluster.servers[0]
    server.stop()
    before = [accepted(cluster, i) for i in range(3)]
    server.start()  # returns once it is ready (registered)
    asyncio.run(write_each(cluster, range(8), 1, b"after"))
    assert [accepted(cluster, i) - before[i] for i in range(3)] == [2, 2, 2]


def test_a_discarded_connection_closes_and_the_next_acquire_dials_afresh(make_cluster):
    cluster = make_cluster()
    cluster.servers[0].kill()  # only the test's pool connects
    key = keys(cluster)[1]

    async def scenario() -> None:
        pool = StoragePool()
        a = await pool.acquire(key, 5.0)
        b = await pool.acquire(key, 5.0)
        pool.discard(key, a, "silent for over 5 s")
        pending = asyncio.ensure_future(answers(b))
        await asyncio.sleep(0)
        await wait_for_async(lambda: a.closed)
        # Every session on it hears: its requests fail instead of waiting forever.
        with pytest.raises(ConnectionError):
            await pending
        c = await pool.acquire(key, 5.0)
        assert c is not a and not c.closed
        await answers(c)
        # The discarded one's late releases close nothing of the new one.
        await pool.release(key, a)
        await pool.release(key, b)
        assert not c.closed and len(pool) == 1
        await pool.close()

    asyncio.run(scenario())


def test_a_wrong_cluster_key_is_refused_and_nothing_is_pooled(make_cluster):
    cluster = make_cluster()
    cluster.servers[0].kill()  # only the test's pool connects
    right = keys(cluster)[0]
    wrong = PoolKey(right.address, uuid.uuid4(), right.num_partitions)

    async def scenario() -> None:
        pool = StoragePool()
        with pytest.raises(StorageFailure) as e:
            await pool.acquire(wrong, 5.0)
        assert e.value.error == StorageError.CLUSTER_KEY_MISMATCH
        assert len(pool) == 0
        await pool.close()

    asyncio.run(scenario())


def record(txid: int, data: bytes) -> bytes:
    head = FORMAT_2.head.pack(txid, 9, 1, 0, txid, 0, len(data), 1_800_000_000_000 + txid)
    return head + data + CRC.pack(crc32(data))


def test_one_partitions_error_answer_leaves_the_connection_to_the_others(make_cluster):
    """Two store sessions, partitions 0 and 1, over the same shared connections. An
    Append of partition 1 that skips a transaction ID is answered NON_CONTIGUOUS and its
    session ends, while partition 0's goes on committing over the same connections."""
    cluster = make_cluster(partitions=2)
    cluster.servers[0].kill()  # the test's sessions write; the server must not fence them
    pool_keys = keys(cluster)
    metas = [partition_metadata(cluster, p) for p in (0, 1)]

    async def scenario() -> None:
        pool = StoragePool()
        commits: dict[int, list[int]] = {0: [], 1: []}
        sessions = []
        for p, meta in enumerate(metas):
            members = {}
            for key in pool_keys:
                client = await pool.acquire(key, 5.0)
                members[key.address] = Member(key.address, client, shared=key)
            hwm = await client.max_transaction_id(meta.session_id, p)
            session = StoreSession(
                p,
                meta.session_id,  # the server's last, which the nodes hold: accepted
                members,
                3,
                hwm,
                lambda batch, started, p=p: commits[p].append(batch.last_txid),
                pool=pool,
            )
            sessions.append((session, hwm))

        assert len(pool) == 3

        async def append(p: int, n: int) -> None:
            session, _ = sessions[p]
            start = session.high_water_mark + 1
            for txid in range(start, start + n):
                session.append(txid, record(txid, b"p%d-%d" % (p, txid)), 6)
            await session.drain(30.0)

        await append(0, 5)
        await append(1, 5)
        assert commits[0] and commits[1]

        session1 = sessions[1][0]
        skipped = session1.high_water_mark + 2
        session1.append(skipped, record(skipped, b"x"), 1)
        await wait_for_async(lambda: session1.failed)
        assert "NON_CONTIGUOUS" in str(session1.ended.exception())
        # Closed twice (a stopping partition and its loop both close it): released once,
        # or the connections would close under partition 0's session.
        await asyncio.gather(session1.close(), session1.close())
        await session1.close()

        # Partition 0's session commits on, over the very same connections.
        done = len(commits[0])
        await append(0, 5)
        assert len(commits[0]) > done and not sessions[0][0].failed
        assert len(pool) == 3
        await sessions[0][0].close()
        assert len(pool) == 0  # the last release closed them
        await pool.close()

    asyncio.run(scenario())


async def wait_for_async(condition, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "a-connection-a-partition"])
def test_the_servers_partitions_share_a_connection_to_each_node(make_cluster, shared):
    cluster = make_cluster(
        partitions=4, server_args=["--shared-storage-connections", str(shared).lower()]
    )
    config = WaltzClientConfig(cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False)

    async def append_to_every_partition() -> None:
        async with WaltzClient(config) as client:
            for p in range(4):
                assert await client.submit(Put(b"p%d" % p, partition=p))

    asyncio.run(append_to_every_partition())
    port = cluster.servers[0].ready["http_port"]
    wait_for(
        lambda: metric(port, "waltz_server_storage_connections") == (3 if shared else 0),
        what="the shared connections",
    )
