"""Commit times as the client hands them over: ``Transaction.timestamp`` and
``commit_time`` from the feed's rows (None where a row has none), the connection decoding
with the version its handshake settled on, and the cap on the version a client offers.

The peers here are tiny asyncio servers that speak the handshake and send fixed frames:
a server of protocol version 2 (no commit times) or one that breaks the negotiation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime

import pytest

from waltz_client import WaltzClient, WaltzClientCallbacks, WaltzClientConfig
from waltz_client.client import _Partition
from waltz_client.client_partition import ClientPartition
from waltz_client.config import WaltzConfigError
from waltz_client.transaction import Transaction
from waltz_client.wire.client_messages import (
    FeedData,
    FeedRows,
    HighWaterMarkRequest,
    ReadRangeResponse,
    record_format,
)
from waltz_client.wire.errors import HandshakeError
from waltz_client.wire.framing import (
    HANDSHAKE_BYTES,
    HandshakeStatus,
    Hello,
    HelloReply,
)
from waltz_client.wire.records import (
    FORMAT_1,
    NO_TIMESTAMP,
    Record,
    RecordBatch,
    RecordHeader,
    ReqId,
    UncheckedRecords,
)
from waltz_client.wire.server_connection import ServerConnection

CLIENT = 7
MOUNT = ReqId(CLIENT, 1, 0, 1)
T0 = 1_700_000_000_123  # 2023-11-14 22:13:20.123 UTC


# --- Transaction ------------------------------------------------------------------------


def transaction(timestamp: int | None) -> Transaction:
    async def fetch() -> bytes:
        return b""

    return Transaction(3, 0, 0, MOUNT, fetch, lambda: b"", timestamp)


def test_commit_time_is_the_timestamp_as_an_aware_utc_datetime() -> None:
    t = transaction(T0)
    assert t.timestamp == T0
    assert t.commit_time == datetime.datetime(2023, 11, 14, 22, 13, 20, 123000, datetime.UTC)
    assert t.commit_time is not None and t.commit_time.utcoffset() == datetime.timedelta(0)
    # Exact to the millisecond, far from the epoch too (no float rounding).
    late = transaction(253_402_300_799_999).commit_time  # 9999-12-31 23:59:59.999
    assert late == datetime.datetime(9999, 12, 31, 23, 59, 59, 999000, datetime.UTC)
    assert transaction(0).commit_time == datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def test_no_timestamp_means_no_commit_time() -> None:
    t = transaction(None)
    assert t.timestamp is None and t.commit_time is None


def test_a_transaction_made_without_a_time_has_none() -> None:
    """Applications and tests build transactions with the six fields they always had."""

    async def fetch() -> bytes:
        return b""

    t = Transaction(1, 0, 0, MOUNT, fetch, lambda: b"")
    assert t.timestamp is None and t.commit_time is None
    assert "timestamp=None" in repr(t)


# --- the feed to apply_transaction --------------------------------------------------------


class Recorder(WaltzClientCallbacks):
    def __init__(self) -> None:
        self.applied: list[Transaction] = []

    async def client_high_water_mark(self, partition_id: int) -> int:
        return -1

    async def apply_transaction(self, transaction: Transaction) -> None:
        self.applied.append(transaction)


def applying_client() -> tuple[Recorder, _Partition]:
    callbacks = Recorder()
    client = WaltzClient(WaltzClientConfig("127.0.0.1:1"), callbacks)
    client.view.client_id = CLIENT
    state = _Partition(ClientPartition(0, True, 0.05), asyncio.Semaphore(8), client._driver_context)
    state.core.mount_req = MOUNT
    return callbacks, state


def test_each_applied_transaction_carries_its_rows_commit_time() -> None:
    async def go() -> None:
        callbacks, state = applying_client()
        rows = (
            (0, 9, 1, 0, 10, 5, T0),
            (1, 9, 1, 0, 11, 6, T0 + 1),
            (2, 9, 1, 0, 12, 7, NO_TIMESTAMP),  # a transaction written before commit times
        )
        await state._handle(FeedRows(MOUNT, rows))
        got = [(t.transaction_id, t.header, t.timestamp) for t in callbacks.applied]
        assert got == [(0, 5, T0), (1, 6, T0 + 1), (2, 7, None)]
        times = [t.commit_time for t in callbacks.applied]
        assert times[1] - times[0] == datetime.timedelta(milliseconds=1)
        assert times[2] is None

    asyncio.run(go())


# --- the connection: the version it settled on decides the layout --------------------------


class FakeServer:
    """Answers a hello with ``version`` (whatever was offered) and, once the client sends
    a request (a server sends nothing unasked), ``frames``; keeps the hellos it got."""

    def __init__(self, version: int, frames: list[bytes]) -> None:
        self.version = version
        self.frames = frames
        self.hellos: list[Hello] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.hellos.append(Hello.decode(await reader.readexactly(HANDSHAKE_BYTES)))
        writer.write(HelloReply(HandshakeStatus.OK, self.version).encode())
        await reader.read(1)
        for frame in self.frames:
            writer.write(frame)
        await writer.drain()
        await reader.read()  # until the client closes
        writer.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


def test_against_a_version_2_server_every_time_is_none() -> None:
    """A server older than commit times: its feed rows and range-read records are read in
    its layout, and nothing has a time."""
    headers = (RecordHeader(0, MOUNT, 1, T0), RecordHeader(1, MOUNT, 2, T0 + 5))
    records = [Record(0, MOUNT, 1, b"a", T0), Record(1, MOUNT, 2, b"bc", T0 + 5)]
    frames = [
        FeedData(MOUNT, headers, FORMAT_1).encode(),  # as a version 2 server sends it
        ReadRangeResponse(MOUNT, 1, RecordBatch.from_records(records, FORMAT_1)).encode(),
    ]

    async def go() -> None:
        server = FakeServer(2, frames)
        port = await server.start()
        for feed_rows, check_records in ((True, False), (False, True)):
            conn = await ServerConnection.connect(
                "127.0.0.1", port, feed_rows=feed_rows, check_records=check_records
            )
            try:
                assert conn.protocol_version == 2
                conn.send(HighWaterMarkRequest(MOUNT))  # whatever it is, the server answers
                feed = await asyncio.wait_for(conn.messages.get(), 30)
                read = await asyncio.wait_for(conn.messages.get(), 30)
            finally:
                await conn.close()
            if feed_rows:
                assert isinstance(feed, FeedRows)
                assert [row[6] for row in feed.rows] == [NO_TIMESTAMP, NO_TIMESTAMP]
            assert [(h.transaction_id, h.header, h.timestamp) for h in feed.headers] == [
                (0, 1, NO_TIMESTAMP),
                (1, 2, NO_TIMESTAMP),
            ]
            assert isinstance(read, ReadRangeResponse)
            batch = read.records
            assert batch.format is FORMAT_1
            if isinstance(batch, UncheckedRecords):
                batch = batch.check()
            assert [r.data for r in batch.records()] == [b"a", b"bc"]
            assert batch.timestamps() == [NO_TIMESTAMP, NO_TIMESTAMP]
        assert [(h.min_version, h.max_version) for h in server.hellos] == [(1, 3), (1, 3)]
        await server.stop()

    asyncio.run(go())


def test_a_capped_client_offers_at_most_its_cap() -> None:
    async def go() -> None:
        server = FakeServer(2, [])
        port = await server.start()
        conn = await ServerConnection.connect("127.0.0.1", port, max_version=2)
        await conn.close()
        assert [(h.min_version, h.max_version) for h in server.hellos] == [(1, 2)]
        await server.stop()

    asyncio.run(go())


def test_a_server_choosing_a_version_not_offered_is_refused() -> None:
    async def go() -> None:
        server = FakeServer(3, [])
        port = await server.start()
        with pytest.raises(
            HandshakeError,
            match=r"^server 127\.0\.0\.1:\d+ chose protocol version 3, outside the 1\.\.2 offered$",
        ):
            await ServerConnection.connect("127.0.0.1", port, max_version=2)
        await server.stop()

    asyncio.run(go())


@pytest.mark.parametrize("cap", [0, 4, -1])
def test_a_cap_this_build_does_not_speak_is_refused(cap: int) -> None:
    async def go() -> None:
        with pytest.raises(
            ValueError, match=rf"^max_version {cap}: this build speaks protocol versions 1\.\.3$"
        ):
            await ServerConnection.connect("127.0.0.1", 1, max_version=cap)

    asyncio.run(go())


@pytest.mark.parametrize("cap", [0, 4, "2", True, 2.0])
def test_the_configs_cap_is_checked(cap: object) -> None:
    with pytest.raises(
        WaltzConfigError,
        match=r"^WaltzClientConfig\._max_protocol_version: expected None or 1\.\.3, got ",
    ):
        WaltzClientConfig("127.0.0.1:1", _max_protocol_version=cap)  # type: ignore[arg-type]


def test_the_configs_cap_defaults_to_none_and_keeps_a_version() -> None:
    assert WaltzClientConfig("127.0.0.1:1")._max_protocol_version is None
    config = WaltzClientConfig("127.0.0.1:1", _max_protocol_version=2)
    assert config._max_protocol_version == 2
    assert dataclasses.replace(config, _max_protocol_version=None) == WaltzClientConfig(
        "127.0.0.1:1"
    )
    assert record_format(2) is FORMAT_1
