"""Memory a peer made a daemon hold goes back to the operating system once it leaves.

glibc keeps large freed buffers in its heap for reuse, so a daemon's RSS could stay near
the peak a connection made it reach long after the connection closed (150 unread Read
Range requests: 221 -> 821 MB, not returned). The daemons now call malloc_trim(0),
through ``waltz_client.runtime.memory_trim``, shortly after a connection closes.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from waltz_client import WaltzClient, WaltzClientConfig
from waltz_client.runtime.memory_trim import MALLOC_TRIM, MemoryTrimmer
from waltz_client.tools.local.processes import DaemonProcess
from waltz_client.transaction import TransactionBuilder, TransactionContext
from waltz_client.wire.client_messages import SERVER_PROTOCOL_VERSIONS, ReadRangeRequest
from waltz_client.wire.framing import HANDSHAKE_BYTES, HandshakeStatus, Hello, HelloReply, Service
from waltz_client.wire.records import Record, ReqId
from waltz_client.wire.storage_client import StorageClient
from waltz_client.wire.storage_messages import OpenRequest, RecordListRequest

pytestmark = pytest.mark.timeout(180)

MiB = 1024 * 1024
# What may stay above the baseline once the peer has gone. Measured on the server test:
# +14 MB with the trim, +41 MB or (usually) far more without it.
MARGIN = 28 * MiB

Flood = Callable[[], Awaitable[list[asyncio.StreamWriter]]]


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def hold_and_release(pid: int, flood: Flood, grow: int) -> str:
    """Let the daemon settle and take its RSS; run ``flood`` (connections whose replies
    are never read) until the daemon holds ``grow`` bytes more, close them, and wait up
    to 30 s for RSS to fall back within MARGIN. Returns what went wrong, or ""."""
    await asyncio.sleep(2.0)  # the trim after the set-up's own connection has run
    base = rss_bytes(pid)
    writers = await flood()
    peak = base
    async with asyncio.timeout(30):  # polled: a busy machine may take its time
        while peak - base < grow:
            await asyncio.sleep(0.2)
            peak = max(peak, rss_bytes(pid))
    for writer in writers:
        writer.close()
    deadline = time.monotonic() + 30
    now = rss_bytes(pid)
    while now - base > MARGIN and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = rss_bytes(pid)
    if now - base <= MARGIN:
        return ""
    return (
        f"RSS {base // MiB} MB -> {peak // MiB} MB with the unread replies, "
        f"still {now // MiB} MB 30 s after the connections closed"
    )


# --- the server -----------------------------------------------------------------------


class Put(TransactionContext):
    def __init__(self, data: bytes) -> None:
        self.data = data

    def partition(self, num_partitions: int) -> int:
        return 0

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(0)
        builder.set_data(self.data)
        return True


def test_a_server_returns_the_memory_of_read_ranges_never_read(make_cluster):
    """Four connections, each sending 150 Read Range requests and reading no reply, make
    the server hold a few hundred MB; once they close, it gives the memory back. (A
    small data cache: what stays is then the allocator's, not the cache's.)"""
    cluster = make_cluster(partitions=1, server_args=["--data-cache-bytes", "4MiB"])
    server = cluster.servers[0]
    pid, port = server.pid, server.ready["port"]
    assert pid is not None

    async def flood() -> list[asyncio.StreamWriter]:
        generation = cluster.ownership()[0][1]
        low, high = min(SERVER_PROTOCOL_VERSIONS), max(SERVER_PROTOCOL_VERSIONS)
        writers = []
        for _ in range(4):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(Hello(Service.SERVER, low, high).encode())
            reply = HelloReply.decode(await reader.readexactly(HANDSHAKE_BYTES))
            assert reply.status == HandshakeStatus.OK
            for seq in range(150):
                request = ReadRangeRequest(ReqId(1, generation, 0, seq), 0, 1000, 8 * MiB)
                writer.write(request.encode())
            writers.append(writer)
        return writers

    async def go() -> str:
        config = WaltzClientConfig(
            cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False
        )
        async with WaltzClient(config) as client:
            for i in range(32):  # 32 MiB of data to read, again and again
                assert await client.submit(Put(bytes([i]) * MiB))
        return await hold_and_release(pid, flood, grow=200 * MiB)

    problem = asyncio.run(go())
    assert not problem, problem


# --- a storage node -------------------------------------------------------------------


def test_a_storage_node_returns_the_memory_of_reads_never_read(tmp_path: Path):
    """Four connections, each sending 120 reads (of 2 to 8 MiB) and reading no reply, make
    a storage node hold a few hundred MB; once they close, it gives the memory back.
    (Here a storage node mostly does so even without the trim: its replies are freed
    whole, from the top of the heap.)"""
    key = uuid.uuid4()
    ready = str(tmp_path / "ready")
    node = DaemonProcess(
        "storage",
        [
            *(sys.executable, "-m", "waltz_storage.main"),
            *("--directory", str(tmp_path / "data"), "--cluster-key", str(key)),
            *("--num-partitions", "1", "--partitions", "0", "--host", "127.0.0.1"),
            *("--port", "0", "--http-port", "0", "--ready-file", ready),
        ],
        ready,
        str(tmp_path / "storage.log"),
    )
    node.start()
    pid, port = node.pid, node.ready["port"]
    assert pid is not None

    async def flood() -> list[asyncio.StreamWriter]:
        writers = []
        for _ in range(4):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(Hello(Service.STORAGE, 1, 1).encode())
            await reader.readexactly(HANDSHAKE_BYTES)
            writer.write(OpenRequest(-1, 0, -1, key, 1).encode())
            for seq in range(1, 121):  # replies of varied sizes, as real reads have
                writer.write(RecordListRequest(1, seq, 0, seq % 32, 8 + seq % 24).encode())
            writers.append(writer)
        return writers

    async def go() -> str:
        async with await StorageClient.connect("127.0.0.1", port) as client:
            await client.open(key, 1)
            for first in range(0, 64, 8):  # 64 records of 256 KiB: 16 MiB
                batch = [
                    Record(t, ReqId(1, 1, 0, t), 0, os.urandom(256 * 1024))
                    for t in range(first, first + 8)
                ]
                await client.append(1, 0, batch)
        return await hold_and_release(pid, flood, grow=120 * MiB)

    try:
        problem = asyncio.run(go())
    finally:
        node.stop()
    assert not problem, problem


# --- the trimmer itself ---------------------------------------------------------------


def test_the_trimmer_trims_after_closes_and_once_more_at_most_once_per_interval():
    async def go() -> None:
        loop = asyncio.get_running_loop()
        calls: list[float] = []

        def trim(pad: int) -> int:
            calls.append(loop.time())
            return 1

        async def until(n: int) -> None:
            async with asyncio.timeout(10):
                while len(calls) < n:
                    await asyncio.sleep(0.01)

        trimmer = MemoryTrimmer(min_interval=0.5, delay=0.1, trim=trim)
        start = loop.time()
        for _ in range(100):  # a burst of closes: one trim after the delay...
            trimmer.soon()
        await until(1)
        assert calls[0] - start >= 0.1
        await until(2)  # ...and the follow-up an interval later
        assert calls[1] - calls[0] >= 0.5
        await asyncio.sleep(0.7)  # then nothing, until connections close again
        assert len(calls) == 2
        trimmer.soon()
        await until(3)
        trimmer.soon()  # right after a trim: no sooner than an interval after it
        await until(4)
        assert calls[3] - calls[2] >= 0.5
        trimmer.cancel()  # the daemon stops: the follow-up never runs
        await asyncio.sleep(0.7)
        assert len(calls) == 4

    asyncio.run(go())


def test_without_malloc_trim_the_trimmer_does_nothing():
    async def go() -> None:
        trimmer = MemoryTrimmer(trim=None)  # musl, macOS: no malloc_trim
        trimmer.soon()
        assert trimmer._pending is None

    asyncio.run(go())
    MemoryTrimmer().soon()  # outside a loop: not an error, nothing scheduled
    assert MALLOC_TRIM is None or MALLOC_TRIM(0) in (0, 1)  # glibc: 1 if it gave any back
