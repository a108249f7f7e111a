"""Commit times over the storage protocol, against a real ``waltz-storage`` process: a
server of protocol version 2 (before commit times) and one of version 3 on the same node.

A version-2 peer sends and takes records in format 1: the node reads its Appends as such
and answers it in format 1 (no times), whatever it stores; a version-3 peer gets format 2
with the times. Checked on the frames' bytes (a raw connection of each version) and
through ``StorageClient.connect(versions=...)``, which decodes each version's format and
fails on any other: Append, Record List, Record, Record Header and Record Header List.
Then the upgrade itself: a directory of format-1 segments an older node left, served to
both.
"""

from __future__ import annotations

import asyncio
import random
import struct
from collections.abc import Awaitable
from typing import TypeVar

from waltz_client.wire.framing import HANDSHAKE_BYTES, HandshakeStatus, Hello, HelloReply, Service
from waltz_client.wire.records import (
    FORMAT_1,
    FORMAT_2,
    NO_TIMESTAMP,
    Record,
    RecordBatch,
    RecordFormat,
    RecordHeader,
    ReqId,
)
from waltz_client.wire.storage_client import StorageClient
from waltz_client.wire.storage_messages import (
    AppendRequest,
    OpenRequest,
    RecordHeaderListRequest,
    RecordHeaderListResponse,
    RecordHeaderRequest,
    RecordHeaderResponse,
    RecordListRequest,
    RecordListResponse,
    RecordRequest,
    RecordResponse,
    StorageMessage,
    SuccessResponse,
)
from waltz_storage.segment import Segment

T = TypeVar("T")
SESSION = 3
TIME = 1_767_225_600_000  # 2026-01-01 UTC
OLDER = range(1, 3)  # what a server before commit times offers


def run(coro: Awaitable[T], timeout: float = 60.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def make_records(first: int, n: int, partition: int, *, timed: bool) -> list[Record]:
    rng = random.Random(f"versions:{partition}:{first}")
    return [
        Record(
            t,
            ReqId(rng.randrange(1 << 20), 1, partition, t),
            rng.randrange(-(2**31), 2**31),
            rng.randbytes(rng.randrange(200)),
            TIME + 11 * t if timed else NO_TIMESTAMP,
        )
        for t in range(first, first + n)
    ]


def untimed(recs: list[Record]) -> list[Record]:
    return [Record(r.transaction_id, r.req_id, r.header, r.data) for r in recs]


def headers(recs: list[Record]) -> list[RecordHeader]:
    return [RecordHeader(r.transaction_id, r.req_id, r.header, r.timestamp) for r in recs]


async def connect(node, versions: range = range(1, 4)) -> StorageClient:
    client = await StorageClient.connect(node.host, node.port, versions=versions)
    await client.open(node.key, node.num_partitions)
    return client


class RawPeer:
    """A raw connection of one protocol version: frames sent and received as bytes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.seq = 0

    @classmethod
    async def connect(cls, node, version: int) -> RawPeer:
        reader, writer = await asyncio.open_connection(node.host, node.port)
        writer.write(Hello(Service.STORAGE, 1, version).encode())
        reply = HelloReply.decode(await reader.readexactly(HANDSHAKE_BYTES))
        assert (reply.status, reply.version) == (HandshakeStatus.OK, version)
        peer = cls(reader, writer)
        opened = await peer.exchange(OpenRequest(-1, 0, -1, node.key, node.num_partitions))
        assert opened == SuccessResponse(-1, 0, -1).encode()
        return peer

    async def exchange(self, request: StorageMessage) -> bytes:
        """Send ``request``'s frame; the response's frame as it came."""
        self.writer.write(request.encode())
        head = await self.reader.readexactly(4)
        return head + await self.reader.readexactly(struct.unpack(">I", head)[0])

    def close(self) -> None:
        self.writer.close()


async def expect_frames(node, version: int, p: int, recs: list[Record]) -> None:
    """Every read of ``recs`` (partition ``p``, from transaction 0) on a raw connection
    of ``version`` answers exactly the frames of ``recs`` in that version's format."""
    fmt: RecordFormat = FORMAT_2 if version >= 3 else FORMAT_1
    shown = recs if fmt is FORMAT_2 else untimed(recs)  # what format 1 can carry
    peer = await RawPeer.connect(node, version)
    try:
        n = len(recs)
        frame = await peer.exchange(RecordListRequest(SESSION, 1, p, 0, n))
        batch = RecordBatch.from_records(shown, fmt)
        assert frame == RecordListResponse(SESSION, 1, p, batch).encode()
        frame = await peer.exchange(RecordRequest(SESSION, 2, p, n - 1))
        assert frame == RecordResponse(SESSION, 2, p, shown[-1], fmt).encode()
        frame = await peer.exchange(RecordHeaderRequest(SESSION, 3, p, 1))
        assert frame == RecordHeaderResponse(SESSION, 3, p, headers(shown)[1], fmt).encode()
        frame = await peer.exchange(RecordHeaderListRequest(SESSION, 4, p, 0, n))
        expected = RecordHeaderListResponse(SESSION, 4, p, tuple(headers(shown)), fmt)
        assert frame == expected.encode()
    finally:
        peer.close()


async def expect_reads(client: StorageClient, p: int, recs: list[Record]) -> None:
    """Every read of ``client`` returns ``recs`` (partition ``p``, from transaction 0)."""
    n = len(recs)
    assert list((await client.records(SESSION, p, 0, n)).records()) == recs
    assert await client.record(SESSION, p, n - 1) == recs[-1]
    assert await client.record_header(SESSION, p, 0) == headers(recs)[0]
    assert await client.record_headers(SESSION, p, 0, n) == headers(recs)
    raw = await client.records_unchecked(SESSION, p, 0, n)  # as the node sent them
    fmt = FORMAT_2 if client.speaks_commit_time else FORMAT_1
    assert raw.format == fmt
    assert bytes(raw.buf) == RecordBatch.from_records(recs, fmt).buf


# --- both versions on one node ----------------------------------------------------------------


def test_an_older_servers_records_and_a_newer_ones_are_served_to_both(storage_node):
    node = storage_node

    async def go() -> None:
        v2, v3 = await connect(node, OLDER), await connect(node)
        try:
            assert (v2.version, v2.speaks_commit_time) == (2, False)
            assert (v3.version, v3.speaks_commit_time) == (3, True)
            # An older server appends to partition 0: format 1 on the wire, no times.
            old = make_records(0, 12, 0, timed=False)
            await v2.append(SESSION, 0, old[:5])
            await v2.append(SESSION, 0, RecordBatch.from_records(old[5:], FORMAT_1))
            await expect_reads(v2, 0, old)
            await expect_reads(v3, 0, old)  # times it never had: NO_TIMESTAMP
            # A newer one appends to partition 1 with times: the older reads them without.
            new = make_records(0, 9, 1, timed=True)
            await v3.append(SESSION, 1, new)
            await expect_reads(v3, 1, new)
            await expect_reads(v2, 1, untimed(new))
            # Both on partition 2, one after the other.
            mixed = make_records(0, 6, 2, timed=True)
            await v3.append(SESSION, 2, mixed[:3])
            await v2.append(SESSION, 2, mixed[3:])  # its times are dropped on the way
            kept = mixed[:3] + untimed(mixed[3:])
            await expect_reads(v3, 2, kept)
            await expect_reads(v2, 2, untimed(mixed))
        finally:
            await v2.close()
            await v3.close()
        for version in (1, 2, 3):
            await expect_frames(node, version, 0, old)
            await expect_frames(node, version, 1, new)
            await expect_frames(node, version, 2, kept)

    run(go())
    node.restart()  # durable, and served the same after a restart
    run(expect_frames(node, 2, 1, make_records(0, 9, 1, timed=True)))
    run(expect_frames(node, 3, 1, make_records(0, 9, 1, timed=True)))


def test_an_older_servers_append_is_read_in_format_1_on_the_wire(storage_node):
    """The Append frame of a version-2 connection is format 1: the node reads it so (read
    as format 2 it would fail its CRCs) and stores the records without times."""
    node = storage_node
    recs = make_records(0, 4, 3, timed=True)

    async def go() -> None:
        peer = await RawPeer.connect(node, 2)
        try:
            batch = RecordBatch.from_records(recs, FORMAT_1)
            frame = await peer.exchange(AppendRequest(SESSION, 1, 3, batch))
            assert frame == SuccessResponse(SESSION, 1, 3).encode()
        finally:
            peer.close()
        await expect_frames(node, 3, 3, untimed(recs))

    run(go())


# --- the upgrade: an older node's files, older and newer servers ------------------------------


def test_an_older_nodes_segments_are_served_to_both_and_appended_after(storage_factory):
    node = storage_factory(partitions="0-1")
    node.stop()
    # Partition 0 as a node before commit times left it: two format-1 segments.
    part = node.directory / "0"
    for name in list(part.iterdir()):
        name.unlink()
    old = make_records(0, 20, 0, timed=False)
    for first, end in ((0, 12), (12, 20)):
        seg = Segment.create(str(part), 0, node.key, first, fmt=FORMAT_1)
        seg.write_batch(RecordBatch.from_records(old[first:end], FORMAT_1), 0, end - first)
        seg.seal()
        seg.close()
    before = {p.name: p.read_bytes() for p in part.iterdir()}
    node.start()
    later = make_records(20, 5, 0, timed=True)

    async def go() -> None:
        v2, v3 = await connect(node, OLDER), await connect(node)
        try:
            await expect_reads(v2, 0, old)
            await expect_reads(v3, 0, old)
            await v2.append(SESSION, 0, later[:2])  # the first append: a format-2 segment
            await v3.append(SESSION, 0, later[2:])
            await expect_reads(v3, 0, old + untimed(later[:2]) + later[2:])
            await expect_reads(v2, 0, old + untimed(later))
        finally:
            await v2.close()
            await v3.close()

    run(go())
    node.stop()
    after = {p.name: p.read_bytes() for p in part.iterdir() if p.name in before}
    assert after == before  # the old segments, never rewritten
    versions = {
        p.name: struct.unpack_from(">i", p.read_bytes())[0] for p in sorted(part.glob("*.seg"))
    }
    assert versions == {
        "0000000000000000000.seg": 1,
        "0000000000000000012.seg": 1,
        "0000000000000000020.seg": 2,
    }
    node.start()
    run(expect_frames(node, 2, 0, old + untimed(later)))
    run(expect_frames(node, 3, 0, old + untimed(later[:2]) + later[2:]))
