"""Bounds on what a client of a server can make it hold, against a real cluster.

Read Range replies that are never read stop the server reading that connection instead
of piling up; feeds and mounts are capped per connection (a flood of Feed or Mount
requests, with distinct client IDs, gets LIMIT_EXCEEDED); a connection that never
finishes its handshake is closed. Meanwhile a well-behaved client is served.
"""

from __future__ import annotations

import asyncio
import struct
import urllib.request

import pytest

from waltz_client import WaltzClient, WaltzClientConfig
from waltz_client.transaction import TransactionBuilder, TransactionContext
from waltz_client.wire.client_messages import (
    SERVER_PROTOCOL_VERSIONS,
    ErrorCode,
    ErrorResponse,
    FeedRequest,
    MountRequest,
    MountResponse,
    MountStatus,
    ReadRangeRequest,
    decode_server_response,
)
from waltz_client.wire.framing import (
    HANDSHAKE_BYTES,
    FrameDecoder,
    HandshakeStatus,
    Hello,
    HelloReply,
    Service,
)
from waltz_client.wire.records import ReqId

pytestmark = pytest.mark.timeout(300)

MiB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class Put(TransactionContext):
    def __init__(self, data: bytes) -> None:
        self.data = data

    def partition(self, num_partitions: int) -> int:
        return 0

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(0)
        builder.set_data(self.data)
        return True


def config(cluster) -> WaltzClientConfig:
    return WaltzClientConfig(cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False)


async def still_served(cluster, expect: int) -> None:
    """A well-behaved client appends one transaction and reads the partition's end."""
    async with WaltzClient(config(cluster)) as client:
        assert await client.submit(Put(b"still served"))
        assert await client.high_water_mark(0) == expect


async def raw_connect(cluster):
    port = cluster.servers[0].ready["port"]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    low, high = min(SERVER_PROTOCOL_VERSIONS), max(SERVER_PROTOCOL_VERSIONS)
    writer.write(Hello(Service.SERVER, low, high).encode())
    reply = HelloReply.decode(await reader.readexactly(HANDSHAKE_BYTES))
    assert reply.status == HandshakeStatus.OK
    return reader, writer


async def read_messages(reader, count: int, timeout: float = 60.0) -> list:
    decoder = FrameDecoder(64 * MiB)
    out: list = []
    async with asyncio.timeout(timeout):
        while len(out) < count:
            data = await reader.read(1 << 20)
            assert data, f"closed after {len(out)} messages"
            out += [decode_server_response(t, b, 64 * MiB) for t, b in decoder.feed(data)]
    return out


@pytest.fixture
def cluster(make_cluster):
    return make_cluster(partitions=1)


@pytest.mark.parametrize("writes", ["one write per request", "all in one write"])
def test_read_range_replies_never_read_do_not_pile_up(cluster, writes):
    """150 Read Ranges of 8 MiB whose replies are never read. Sent in one write, they
    reach the server in a few socket reads: it must not start all of them."""

    async def go() -> int:
        async with WaltzClient(config(cluster)) as client:
            for i in range(32):  # 32 MiB of data
                assert await client.submit(Put(bytes([i]) * MiB))
        pid = cluster.servers[0].pid
        before = rss_bytes(pid)
        _, writer = await raw_connect(cluster)
        generation = cluster.ownership()[0][1]
        frames = [
            ReadRangeRequest(ReqId(1, generation, 0, seq), 0, 1000, 8 * MiB).encode()
            for seq in range(150)
        ]
        if writes == "all in one write":
            writer.write(b"".join(frames))
        else:
            for frame in frames:
                writer.write(frame)
        await asyncio.sleep(5)
        await still_served(cluster, 32)
        grown = rss_bytes(pid) - before
        writer.close()
        return grown

    assert asyncio.run(go()) < 250 * MiB


def test_a_flood_of_feeds_or_mounts_on_one_connection_is_capped(cluster):
    async def go() -> None:
        generation = cluster.ownership()[0][1]
        reader, writer = await raw_connect(cluster)
        floods = 3000
        for seq in range(floods):
            # Distinct client IDs: each Mount is a new client of the partition.
            writer.write(MountRequest(ReqId(10_000 + seq, generation, 0, seq), -1, 0).encode())
        for seq in range(floods):
            writer.write(FeedRequest(ReqId(1, generation, 0, floods + seq), -1).encode())
        answers = [
            m
            for m in await read_messages(reader, 2 * floods)
            if isinstance(m, (MountResponse, ErrorResponse))
        ]
        limited = [a for a in answers if isinstance(a, ErrorResponse)]
        mounted = [a for a in answers if isinstance(a, MountResponse)]
        assert all(a.code == ErrorCode.LIMIT_EXCEEDED for a in limited)
        assert "max_feeds" in limited[0].message
        not_ready = [(m.req_id, m.status.name) for m in mounted if m.status != MountStatus.READY]
        assert not not_ready, f"{len(not_ready)} mounts not READY, e.g. {not_ready[:3]}"
        assert (len(mounted), len(limited)) == (1024, 2 * floods - 1024)
        await still_served(cluster, 0)
        assert mounted_clients(cluster) >= 1024
        writer.close()
        # Once their connection is gone, the partition forgets those clients' mounts.
        async with asyncio.timeout(30):
            while mounted_clients(cluster) > 0:
                await asyncio.sleep(0.1)

    asyncio.run(go())


def mounted_clients(cluster) -> float:
    url = f"http://127.0.0.1:{cluster.servers[0].ready['http_port']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith('waltz_server_partition_mounted_clients{partition="0"} '):
                return float(line.split()[-1])
    raise AssertionError("no waltz_server_partition_mounted_clients")


def test_a_connection_that_never_finishes_its_handshake_is_closed(cluster):
    async def go() -> None:
        port = cluster.servers[0].ready["port"]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(struct.pack(">4s", b"WLTZ"))  # 4 of the 16 bytes, then nothing
        async with asyncio.timeout(60):  # the default deadline is 10 s
            assert await reader.read() == b""
        writer.close()
        await still_served(cluster, 0)

    asyncio.run(go())
