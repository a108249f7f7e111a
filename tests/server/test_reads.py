"""Reading committed transactions: lazy data fetch (cached and from storage), the bulk
range read, a read-only feed request, and the errors for what is not committed."""

from __future__ import annotations

import asyncio
import socket
import urllib.request

import pytest
from server_harness import PartitionClient

from waltz_client.wire.client_messages import (
    ErrorResponse,
    FeedData,
    FeedRequest,
    ReadRangeRequest,
    ReadRangeResponse,
    TransactionDataRequest,
    TransactionDataResponse,
)
from waltz_client.wire.framing import HANDSHAKE_BYTES, Hello, Service
from waltz_client.wire.records import ReqId

pytestmark = pytest.mark.timeout(240)


def payload(i: int) -> bytes:
    return b"%05d:" % i + bytes([i % 251]) * (i % 700)


async def ask(client: PartitionClient, message_type, *fields):
    assert client.conn is not None
    q = client.req_id()
    answer = client._expect(q)
    client.conn.send(message_type(q, *fields))
    return await asyncio.wait_for(answer, 20)


def test_reads_from_the_cache_and_from_storage(make_cluster):
    cluster = make_cluster()
    n = 500

    async def write() -> None:
        client = PartitionClient(cluster, 0)
        await client.mount()
        for i in range(n):
            client.append(payload(i), header=i)
        assert await client.flush() == n - 1
        hot = await ask(client, TransactionDataRequest, 7)
        assert isinstance(hot, TransactionDataResponse) and hot.data == payload(7)
        await client.close()

    asyncio.run(write())
    cluster.servers[0].restart()  # a cold cache: every read below goes to storage

    async def read() -> None:
        client = PartitionClient(cluster, 0)
        await client.mount()
        for txid in (0, 3, 250, n - 1):
            r = await ask(client, TransactionDataRequest, txid)
            assert isinstance(r, TransactionDataResponse) and r.data == payload(txid), txid
        missing = await ask(client, TransactionDataRequest, n)
        assert isinstance(missing, TransactionDataResponse) and missing.data is None
        assert "not committed" in missing.error

        got, start = [], 0
        while True:
            r = await ask(client, ReadRangeRequest, start, 64, 20_000)
            assert isinstance(r, ReadRangeResponse) and r.high_water_mark == n - 1
            records = list(r.records.records())
            if not records:
                break
            assert len(records) <= 64
            assert sum(len(x.data) for x in records) <= 20_000 or len(records) == 1
            got += records
            start = records[-1].transaction_id + 1
        assert [x.transaction_id for x in got] == list(range(n))
        assert [x.data for x in got] == [payload(i) for i in range(n)]
        assert [x.header for x in got] == list(range(n))
        await client.close()

    asyncio.run(read())


def test_a_feed_request_streams_from_the_given_high_water_mark(make_cluster):
    cluster = make_cluster()

    async def scenario() -> None:
        writer = PartitionClient(cluster, 0)
        await writer.mount()
        for i in range(50):
            writer.append(payload(i))
        await writer.flush()

        reader = PartitionClient(cluster, 0)
        await reader.mount()  # only to connect; its own feed is not used below
        seen: list = []
        original = reader._on_message

        def on_message(m) -> None:
            if isinstance(m, FeedData) and m.req_id.seq == 10_000:
                seen.extend(m.headers)
            elif not isinstance(m, ErrorResponse):
                original(m)

        assert reader.conn is not None
        reader.conn._on_message = on_message
        q = reader.req_id()
        reader.conn.send(FeedRequest(q.__class__(q.client_id, q.generation, 0, 10_000), 19))
        for i in range(50, 80):
            writer.append(payload(i))
        await writer.flush()
        for _ in range(100):
            if len(seen) >= 60:
                break
            await asyncio.sleep(0.1)
        assert [h.transaction_id for h in seen] == list(range(20, 80))
        assert [h.req_id for h in seen] == [h.req_id for h in writer.feed[20:80]]
        await writer.close()
        await reader.close()

    asyncio.run(scenario())


def test_a_reader_that_stops_reading_stalls_nobody_else(make_cluster):
    cluster = make_cluster(server_args=["--client-write-buffer-bytes", "4096"])
    port = cluster.servers[0].ready["port"]

    async def scenario() -> None:
        writer = PartitionClient(cluster, 0)
        await writer.mount()
        # A subscriber that never reads: its socket buffers fill, its feed must wait alone.
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        stuck_reader, stuck_writer = await asyncio.open_connection(sock=sock)
        stuck_writer.write(Hello(Service.SERVER, 1, 1).encode())
        await stuck_reader.readexactly(HANDSHAKE_BYTES)
        q = writer.req_id()
        feeds = 40  # each pushes the whole log: far more than any socket buffer holds
        for k in range(feeds):
            stuck_writer.write(FeedRequest(ReqId(q.client_id + 1, q.generation, 0, k), -1).encode())
        await stuck_writer.drain()
        n = 50_000
        for i in range(n):
            writer.append(b"%06d" % i)
        assert await writer.flush(timeout=120) == n - 1
        await writer.wait_feed(n - 1)
        sent = metric(cluster, "waltz_server_partition_feed_sent_total")
        stuck = sent - n
        assert 0 <= stuck < feeds * n - 1_000_000, f"the stuck reader was sent {stuck} headers"
        stuck_writer.close()
        await writer.close()

    asyncio.run(scenario())


def metric(cluster, name: str) -> float:
    url = f"http://127.0.0.1:{cluster.servers[0].ready['http_port']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + '{partition="0"} '):
                return float(line.split()[-1])
    raise AssertionError(f"no {name}")
