"""Bounds on what a peer of a storage node can make it hold, over real sockets.

Before Open has checked the cluster key a connection may send only small frames; reads
whose replies are never collected stop being read instead of piling up replies; a
connection that never opens, or starts a frame and never finishes it, is closed; the
node caps its connections; and the frames partly received on all connections together
stay within a budget, without starving any of them. Meanwhile, a well-behaved client
is served.
"""

from __future__ import annotations

import asyncio
import os
import struct
import threading
import uuid
from pathlib import Path

import pytest
from test_protocol import SESSION, check_serves, raw_connect, read_until_closed, run

from waltz_client.runtime.peer_limits import PeerLimits
from waltz_client.wire.framing import FrameDecoder, Hello, Service
from waltz_client.wire.records import FORMAT_1, Record, RecordBatch, ReqId
from waltz_client.wire.storage_client import StorageClient
from waltz_client.wire.storage_messages import (
    AppendRequest,
    FailureResponse,
    OpenRequest,
    RecordListRequest,
    StorageError,
    SuccessResponse,
    decode_response,
)
from waltz_storage.server import ServerSettings, StorageServer
from waltz_storage.service import StorageNode

MiB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def records(first: int, n: int, size: int) -> list[Record]:
    return [Record(t, ReqId(1, 1, 0, t), 0, os.urandom(size)) for t in range(first, first + n)]


def test_unopened_connections_cannot_make_the_node_buffer_large_frames(storage_node):
    """16 connections each announcing a 64 MiB frame (the opened limit) and sending
    part of it: without the key they get MALFORMED_REQUEST at once."""

    async def go() -> list[bytes]:
        async with await storage_node.client() as good:
            before = rss_bytes(storage_node.pid)
            conns = [await raw_connect(storage_node) for _ in range(16)]
            for _, writer in conns:
                writer.write(struct.pack(">IB", 64 * MiB, 6) + bytes(1024))
            replies = [await read_until_closed(reader) for reader, _ in conns]
            for _, writer in conns:
                writer.close()
            await check_serves(storage_node, good)
            assert rss_bytes(storage_node.pid) - before < 32 * MiB
            return replies

    for received in run(go()):
        ((message_type, body),) = FrameDecoder().feed(received)
        failure = decode_response(message_type, body)
        assert isinstance(failure, FailureResponse)
        assert failure.error == StorageError.MALFORMED_REQUEST
        assert "exceeds the maximum of 65536 bytes" in failure.message


@pytest.mark.parametrize("writes", ["one write per request", "all in one write"])
def test_reads_whose_replies_are_never_read_stop_being_read(storage_node, writes):
    """120 reads of ~8 MiB each on a connection that reads nothing back: the node stops
    reading that connection instead of holding ~1 GB of replies. Sent in one write, the
    requests reach the node in a few socket reads: it must not answer all of them."""

    async def go() -> int:
        async with await storage_node.client() as good:
            for first in range(0, 64, 8):  # 64 records of 256 KiB: 16 MiB
                await good.append(SESSION, 0, records(first, 8, 256 * 1024))
            before = rss_bytes(storage_node.pid)
            _, writer = await raw_connect(storage_node)
            frames = [OpenRequest(-1, 0, -1, storage_node.key, 4).encode()]
            frames += [RecordListRequest(SESSION, seq, 0, 0, 64).encode() for seq in range(1, 121)]
            if writes == "all in one write":
                writer.write(b"".join(frames))
            else:
                for frame in frames:
                    writer.write(frame)
            await asyncio.sleep(3)  # the node works through what it can
            # Still answered meanwhile: another connection, the same partition.
            await check_serves(storage_node, good)
            grown = rss_bytes(storage_node.pid) - before
            writer.close()
            return grown

    assert run(go(), timeout=60) < 200 * MiB


# --- in-process, with short deadlines and small limits -------------------------------


@pytest.fixture
def serve(tmp_path: Path):
    """A StorageServer in this process (a real node, real sockets) with the given
    settings: ``async with serve(handshake_timeout=1.0) as node``."""
    key = uuid.uuid4()

    class Served:
        def __init__(self, **settings) -> None:
            self.settings = ServerSettings(**settings)

        async def __aenter__(self):
            self.node = StorageNode.open(str(tmp_path / "data"), key, 3, {0, 1, 2})
            self.server = StorageServer(self.node, self.settings)
            self.port = await self.server.start("127.0.0.1", 0)
            self.host = "127.0.0.1"
            self.key = key
            return self

        async def __aexit__(self, *exc) -> None:
            await self.server.close()
            self.node.close()

        async def client(self) -> StorageClient:
            c = await StorageClient.connect(self.host, self.port)
            await c.open(key, 3)
            return c

        def alive(self) -> bool:  # check_serves asks; this process is the node
            return True

    return Served


def test_a_connection_that_never_opens_or_never_finishes_a_frame_is_closed(serve):
    async def go() -> None:
        limits = PeerLimits(handshake_timeout=1.0, partial_frame_timeout=1.5)
        async with serve(peer=limits) as node:
            # Slow-loris on the handshake: one byte, then nothing.
            r1, w1 = await asyncio.open_connection(node.host, node.port)
            w1.write(Hello(Service.STORAGE, 1, 1).encode()[:1])
            # Handshake done, never opens.
            r2, w2 = await raw_connect(node)
            # Opens, then starts a frame and stops.
            r3, w3 = await raw_connect(node)
            w3.write(OpenRequest(-1, 0, -1, node.key, 3).encode())
            w3.write(struct.pack(">IB", 1000, 6) + b"x" * 10)
            for reader in (r1, r2, r3):
                await read_until_closed(reader, timeout=15)
            # Meanwhile and after, a good client is served.
            async with await node.client() as good:
                await check_serves(node, good)
            for w in (w1, w2, w3):
                w.close()
            errors = node.node.metrics.errors.labels("TIMEOUT")._value.get()
            assert errors == 3

    run(go())


def test_the_node_caps_its_connections(serve):
    async def go() -> None:
        async with serve(peer=PeerLimits(max_connections=3)) as node:
            held = [await node.client() for _ in range(3)]
            reader, writer = await asyncio.open_connection(node.host, node.port)
            writer.write(Hello(Service.STORAGE, 1, 1).encode())
            assert await read_until_closed(reader) == b""  # dropped unanswered
            writer.close()
            await held[0].close()
            await asyncio.sleep(0.2)
            async with await node.client() as again:  # room again
                await check_serves(node, again)
            for c in held[1:]:
                await c.close()

    run(go())


def test_partial_frames_share_a_budget_and_all_of_them_finish(serve):
    """Three connections each send a 3 MiB append in slices; the budget (2 MiB) is
    smaller than their partial frames together, so some wait, but every one finishes."""

    async def go() -> None:
        async with serve(peer=PeerLimits(partial_frames_max_bytes=2 * MiB)) as node:
            conns = []
            for _ in range(3):
                reader, writer = await raw_connect(node)
                writer.write(OpenRequest(-1, 0, -1, node.key, 3).encode())
                reply = await reader.readexactly(4)
                await reader.readexactly(struct.unpack(">I", reply)[0])
                conns.append((reader, writer))
            frames = []
            for partition in range(3):
                # Format 1: what the raw connection's protocol version 1 carries.
                batch = RecordBatch.from_records(records(0, 3, MiB), FORMAT_1)
                frames.append(AppendRequest(SESSION, 1, partition, batch).encode())
            peak = 0
            for offset in range(0, len(frames[0]), 256 * 1024):
                for (_, writer), frame in zip(conns, frames, strict=True):
                    writer.write(frame[offset : offset + 256 * 1024])
                await asyncio.sleep(0.01)
                peak = max(peak, node.server.guard.partial_bytes)
            answers = []
            for reader, _ in conns:
                head = await reader.readexactly(4)
                body = await reader.readexactly(struct.unpack(">I", head)[0])
                answers.append(decode_response(body[0], body[1:]))
            for _, writer in conns:
                writer.close()
            assert answers == [SuccessResponse(SESSION, 1, p) for p in range(3)]
            assert node.server.guard.partial_bytes == 0
            # The budget, plus the one frame let through to finish, plus a read each.
            assert peak <= 2 * MiB + len(frames[0]) + 3 * 256 * 1024

    run(go(), timeout=60)


def test_reads_queued_on_all_connections_share_a_node_budget(serve):
    """A slow disk (an fsync that blocks) holds the node's worker while four
    connections queue reads behind it, each counted as an 8 MiB reply. Each connection
    alone stays within its own limit (64 MiB); together they would queue 320 MiB. The node
    stops reading them at its budget (48 MiB), and answers everything once the disk is
    back."""

    async def go() -> None:
        # Groups on the I/O thread: the loop (this test's too) stays free to queue the
        # reads. (On the loop's thread, a slow group moves the next ones there anyway.)
        async with serve(node_queue_max_bytes=48 * MiB, inline_group_max_seconds=0) as node:
            async with await node.client() as good:
                await good.append(SESSION, 0, records(0, 4, 1024))
            log_ = node.node.partitions[0].log
            disk_back = threading.Event()
            real_sync = log_.sync
            log_.sync = lambda *a: (disk_back.wait(30), real_sync(*a))[1]
            slow = await node.client()
            stuck = asyncio.ensure_future(slow.append(SESSION, 0, records(4, 1, 1024)))
            conns = []
            for _ in range(4):
                reader, writer = await raw_connect(node)
                writer.write(OpenRequest(-1, 0, -1, node.key, 3).encode())
                reply = await reader.readexactly(4)
                await reader.readexactly(struct.unpack(">I", reply)[0])
                conns.append((reader, writer))
            for seq in range(1, 11):
                for _, writer in conns:
                    writer.write(RecordListRequest(SESSION, seq, 0, 0, 4).encode())
            await asyncio.sleep(1.0)
            queued = node.server.queued_bytes
            assert 48 * MiB <= queued <= 48 * MiB + 8 * MiB * 4, queued
            assert len(node.server.waiting) == 4
            disk_back.set()
            await stuck
            for reader, _ in conns:
                for _ in range(10):
                    head = await reader.readexactly(4)
                    await reader.readexactly(struct.unpack(">I", head)[0])
            assert node.server.queued_bytes == 0 and not node.server.waiting
            for _, writer in conns:
                writer.close()
            await slow.close()

    run(go())


def test_the_limits_are_settings_of_the_daemon(storage_factory):
    """--max-connections and --handshake-timeout reach a real waltz-storage process."""
    node = storage_factory(extra=["--max-connections", "2", "--handshake-timeout", "1"])

    async def go() -> None:
        async with await node.client() as first:
            # A second connection that never opens: closed after its 1 s deadline.
            reader, writer = await raw_connect(node)
            assert await read_until_closed(reader, timeout=15) == b""
            writer.close()
            async with await node.client() as second:
                # A third is over the cap: dropped unanswered.
                r3, w3 = await asyncio.open_connection(node.host, node.port)
                w3.write(Hello(Service.STORAGE, 1, 1).encode())
                assert await read_until_closed(r3) == b""
                w3.close()
                await check_serves(node, second)
            await check_serves(node, first)

    run(go(), timeout=60)


def test_the_http_port_can_serve_https(storage_factory, tmp_path):
    """http_tls: metrics and probes over HTTPS with the node's certificate (no client
    certificate asked, as kubelet probes and most scrapers have none)."""
    import ssl
    import urllib.request

    from waltz_client.tools.local.certs import local_pki

    files = local_pki(str(tmp_path / "pki"), {"waltz-storage-0": ["127.0.0.1"]})["waltz-storage-0"]
    node = storage_factory(
        extra=[
            "--tls-cert",
            str(files.cert),
            "--tls-key",
            str(files.key),
            "--tls-ca",
            str(files.ca),
            "--http-tls",
            "true",
        ]
    )
    context = ssl.create_default_context(cafile=files.ca)
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    with opener.open(f"https://127.0.0.1:{node.http_port}/healthz", timeout=10) as r:
        assert r.status == 200
    with pytest.raises(OSError):  # plain HTTP on an HTTPS port gets no answer it can read
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            f"http://127.0.0.1:{node.http_port}/healthz", timeout=10
        ).read()
