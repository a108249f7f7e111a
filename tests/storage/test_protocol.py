"""The storage protocol against a real ``waltz-storage`` process over real sockets.

Open (cluster key, partition count), partitions not held, session fencing
(also across restarts), append/read round trips, contiguity, pipelining,
back pressure, and malformed input of every kind: the bad connection is told
why and closed while the process and its other connections carry on.
"""

from __future__ import annotations

import asyncio
import random
import signal
import struct
import uuid
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from waltz_client.cluster.metadata import key_fingerprint
from waltz_client.wire.framing import (
    HANDSHAKE_BYTES,
    FrameDecoder,
    HandshakeStatus,
    Hello,
    HelloReply,
    Service,
    encode_frame,
)
from waltz_client.wire.records import FORMAT_1, Record, RecordBatch, ReqId
from waltz_client.wire.storage_client import (
    StorageClient,
    StorageConnectionClosed,
    StorageFailure,
)
from waltz_client.wire.storage_messages import (
    MESSAGE_HEADER,
    STORAGE_PROTOCOL_VERSIONS,
    AppendRequest,
    FailureResponse,
    MaxTransactionIdRequest,
    StorageError,
    StorageMessageType,
    SuccessResponse,
    decode_response,
)

T = TypeVar("T")
SESSION = 1


def run(coro: Awaitable[T], timeout: float = 30.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def make_records(first: int, count: int, rng: random.Random, partition: int = 0) -> list[Record]:
    return [
        Record(
            txid,
            ReqId(rng.randrange(2**31), rng.randrange(2**31), partition, txid),
            rng.randrange(-(2**31), 2**31),
            rng.randbytes(rng.randrange(0, 3000)),
        )
        for txid in range(first, first + count)
    ]


async def read_all(client: StorageClient, session: int, partition: int, first: int, last: int):
    """Records first..last, following lists cut short by the response size limit."""
    out: list[Record] = []
    txid = first
    while txid <= last:
        batch = await client.records(session, partition, txid, last - txid + 1)
        assert len(batch) > 0, f"no records returned from transaction {txid}"
        out += batch.records()
        txid = out[-1].transaction_id + 1
    return out


async def expect_failure(awaitable: Awaitable[object], error: StorageError) -> StorageFailure:
    with pytest.raises(StorageFailure) as info:
        await awaitable
    assert info.value.error == error, info.value
    return info.value


async def check_serves(node, client: StorageClient, partition: int = 0) -> None:
    """An append to ``partition`` and a read of it back succeed on ``client``."""
    nxt = await client.max_transaction_id(SESSION, partition) + 1
    rec = Record(nxt, ReqId(9, 9, partition, nxt), 7, b"still serving %d" % nxt)
    await client.append(SESSION, partition, [rec])
    assert await client.record(SESSION, partition, nxt) == rec
    assert node.alive()


# --- Open ---------------------------------------------------------------------------------


def test_open_with_right_key_succeeds_and_requests_are_served(storage_node):
    async def go():
        async with await storage_node.client() as c:
            assert c.version in STORAGE_PROTOCOL_VERSIONS
            assert await c.max_transaction_id(SESSION, 0) == -1
            info = await c.last_session_info(SESSION, 3)
            assert (info.last_session_id, info.low_water_mark) == (-1, -1)

    run(go())


def test_wrong_cluster_key_is_refused_echoing_no_key_and_connection_stays_unopened(
    storage_node,
):
    wrong = uuid.uuid4()

    async def go():
        async with await storage_node.client(open_=False) as c:
            failure = await expect_failure(
                c.open(wrong, storage_node.num_partitions), StorageError.CLUSTER_KEY_MISMATCH
            )
            # The node's key is not a secret to leak, even in part, nor a hint.
            assert str(storage_node.key)[:8] not in failure.message
            assert str(storage_node.key.hex)[:8] not in failure.message
            assert key_fingerprint(storage_node.key) not in failure.message
            # Nothing on this connection may touch a partition.
            await expect_failure(c.max_transaction_id(SESSION, 0), StorageError.NOT_OPEN)
            rec = Record(0, ReqId(1, 1, 0, 0), 0, b"x")
            await expect_failure(c.append(SESSION, 0, [rec]), StorageError.NOT_OPEN)
            # The connection is still usable: a correct Open then works.
            await c.open(storage_node.key, storage_node.num_partitions)
            assert await c.max_transaction_id(SESSION, 0) == -1

    run(go())


def test_partition_request_before_open_is_not_open(storage_node):
    async def go():
        async with await storage_node.client(open_=False) as c:
            await expect_failure(c.max_transaction_id(SESSION, 0), StorageError.NOT_OPEN)

    run(go())


def test_wrong_partition_count_is_refused(storage_node):
    async def go():
        async with await storage_node.client(open_=False) as c:
            failure = await expect_failure(
                c.open(storage_node.key, storage_node.num_partitions + 1),
                StorageError.PARTITION_COUNT_MISMATCH,
            )
            assert str(storage_node.num_partitions) in failure.message
            await expect_failure(c.max_transaction_id(SESSION, 0), StorageError.NOT_OPEN)

    run(go())


def test_partition_not_held_is_partition_not_found(storage_factory):
    node = storage_factory(partitions="0,2")

    async def go():
        async with await node.client() as c:
            assert await c.max_transaction_id(SESSION, 2) == -1
            for p in (1, 3, 4, -1, 1000):
                failure = await expect_failure(
                    c.max_transaction_id(SESSION, p), StorageError.PARTITION_NOT_FOUND
                )
                assert f"partition {p}" in failure.message
            await expect_failure(
                c.append(SESSION, 1, [Record(0, ReqId(1, 1, 1, 0), 0, b"x")]),
                StorageError.PARTITION_NOT_FOUND,
            )

    run(go())


# --- session fencing ----------------------------------------------------------------------


def test_session_fencing_refuses_older_and_adopts_newer(storage_node):
    rng = random.Random(5)

    async def go():
        async with await storage_node.client() as c:
            await c.append(5, 0, make_records(0, 1, rng))
            failure = await expect_failure(c.max_transaction_id(3, 0), StorageError.SESSION_FENCED)
            assert "3" in failure.message and "5" in failure.message
            # An older session cannot append either, and nothing is written.
            await expect_failure(
                c.append(3, 0, make_records(1, 1, rng)), StorageError.SESSION_FENCED
            )
            assert await c.max_transaction_id(5, 0) == 0
            # A newer session is adopted: afterwards 5 is the old one.
            await c.append(7, 0, make_records(1, 1, rng))
            await expect_failure(c.max_transaction_id(5, 0), StorageError.SESSION_FENCED)
            await expect_failure(c.truncate(6, 0, 0), StorageError.SESSION_FENCED)
            assert await c.max_transaction_id(7, 0) == 1
            # Fencing is per partition: partition 1 never saw session 7.
            assert await c.max_transaction_id(3, 1) == -1
        # Fencing is per node, not per connection.
        async with await storage_node.client() as c2:
            await expect_failure(c2.max_transaction_id(6, 0), StorageError.SESSION_FENCED)

    run(go())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_session_fencing_survives_restart(storage_node, sig):
    rng = random.Random(int(sig))

    async def before():
        async with await storage_node.client() as c:
            await c.append(5, 0, make_records(0, 3, rng))
            # A request that is not an append also raises the fence, durably.
            assert await c.max_transaction_id(9, 1) == -1

    async def after():
        async with await storage_node.client() as c:
            await expect_failure(c.max_transaction_id(3, 0), StorageError.SESSION_FENCED)
            await expect_failure(c.max_transaction_id(4, 0), StorageError.SESSION_FENCED)
            await expect_failure(c.max_transaction_id(8, 1), StorageError.SESSION_FENCED)
            assert await c.max_transaction_id(5, 0) == 2
            assert await c.max_transaction_id(9, 1) == -1
            await c.append(12, 0, make_records(3, 1, rng))

    async def after_second():
        async with await storage_node.client() as c:
            await expect_failure(c.max_transaction_id(11, 0), StorageError.SESSION_FENCED)
            assert await c.max_transaction_id(12, 0) == 3

    run(before())
    storage_node.restart(sig)
    run(after())
    storage_node.restart(sig)
    run(after_second())


# --- appends and reads --------------------------------------------------------------------


def test_append_and_read_round_trip_of_random_records(storage_node):
    rng = random.Random(1234)
    written: dict[int, list[Record]] = {0: [], 3: []}

    async def go():
        async with await storage_node.client() as c:
            for partition in written:
                nxt = 0
                while nxt < 400:
                    batch = make_records(nxt, rng.randrange(1, 40), rng, partition)
                    await c.append(SESSION, partition, batch)
                    written[partition] += batch
                    nxt += len(batch)
            for partition, records in written.items():
                last = records[-1].transaction_id
                assert await c.max_transaction_id(SESSION, partition) == last
                assert await read_all(c, SESSION, partition, 0, last) == records
                # Single reads and header reads from the middle.
                for txid in rng.sample(range(last + 1), 10):
                    assert await c.record(SESSION, partition, txid) == records[txid]
                    header = await c.record_header(SESSION, partition, txid)
                    assert header.transaction_id == txid
                    assert header.req_id == records[txid].req_id
                    assert header.header == records[txid].header
                headers = await c.record_headers(SESSION, partition, 100, 50)
                assert [h.transaction_id for h in headers] == list(range(100, 150))
                assert [h.req_id for h in headers] == [r.req_id for r in records[100:150]]
                # Past the end: an empty list, and a not-found single read.
                assert len(await c.records(SESSION, partition, last + 1, 10)) == 0
                await expect_failure(
                    c.record(SESSION, partition, last + 1), StorageError.TRANSACTION_NOT_FOUND
                )
            # Partitions do not mix.
            assert await c.max_transaction_id(SESSION, 1) == -1

    run(go(), timeout=60)


def test_records_survive_a_clean_restart(storage_node):
    rng = random.Random(77)
    records = make_records(0, 200, rng)

    async def write():
        async with await storage_node.client() as c:
            for i in range(0, 200, 20):
                await c.append(SESSION, 0, records[i : i + 20])

    async def read():
        async with await storage_node.client() as c:
            assert await c.max_transaction_id(SESSION, 0) == 199
            assert await read_all(c, SESSION, 0, 0, 199) == records

    run(write())
    storage_node.restart()
    run(read())


def test_non_contiguous_append_is_refused(storage_node):
    rng = random.Random(3)

    async def go():
        async with await storage_node.client() as c:
            await c.append(SESSION, 0, make_records(0, 5, rng))
            for first in (6, 100, 4, 0):  # a gap, a far gap, a repeat, the start again
                failure = await expect_failure(
                    c.append(SESSION, 0, make_records(first, 2, rng)), StorageError.NON_CONTIGUOUS
                )
                assert "5" in failure.message, failure.message
            # Within one batch the IDs must be consecutive too.
            gap = make_records(5, 1, rng) + make_records(7, 1, rng)
            await expect_failure(c.append(SESSION, 0, gap), StorageError.NON_CONTIGUOUS)
            assert await c.max_transaction_id(SESSION, 0) == 4
            await c.append(SESSION, 0, make_records(5, 1, rng))
            assert await c.max_transaction_id(SESSION, 0) == 5

    run(go())


def _pipeline(client: StorageClient, requests: list[AppendRequest]):
    """Submit every request before awaiting any; returns (futures, completion order)."""
    order: list[int] = []
    futures = []
    for request in requests:
        future = client.submit(request)
        future.add_done_callback(lambda f, seq=request.seq: order.append(seq))
        futures.append(future)
    return futures, order


def test_pipelined_appends_all_succeed_in_order(storage_node):
    rng = random.Random(42)

    async def go():
        async with await storage_node.client() as c:
            requests = []
            written = []
            nxt = 0
            for _ in range(300):
                batch = make_records(nxt, rng.randrange(1, 5), rng)
                written += batch
                nxt += len(batch)
                requests.append(c.append_request(SESSION, 0, batch))
            futures, order = _pipeline(c, requests)
            responses = await asyncio.gather(*futures)
            assert all(isinstance(r, SuccessResponse) for r in responses), [
                r for r in responses if not isinstance(r, SuccessResponse)
            ][:3]
            assert order == [r.seq for r in requests]
            assert [r.seq for r in responses] == [r.seq for r in requests]
            assert await c.max_transaction_id(SESSION, 0) == nxt - 1
            assert await read_all(c, SESSION, 0, 0, nxt - 1) == written

    run(go(), timeout=20)


def test_answers_by_call_arrive_in_order_and_fail_when_the_connection_closes(storage_node):
    """``send_parts``, as a store session sends its batches: each ``on_answer`` gets its
    response, in request order; requests still unanswered when the connection closes
    get the error instead, each exactly once."""
    rng = random.Random(7)

    async def go():
        answers: list[tuple[int, object]] = []

        def on_answer(seq: int):
            return lambda response, error: answers.append((seq, response or error))

        async with await storage_node.client() as c:
            seqs, nxt = [], 0
            for _ in range(50):
                request = c.append_request(SESSION, 0, make_records(nxt, 2, rng))
                nxt += 2
                c.send_parts(request.seq, [request.encode()], on_answer(request.seq))
                seqs.append(request.seq)
            assert await c.max_transaction_id(SESSION, 0) == nxt - 1  # answered in order
            assert [seq for seq, _ in answers] == seqs
            assert all(isinstance(r, SuccessResponse) and r.seq == q for q, r in answers)
            answers.clear()
            # Sent, then the connection dropped before any answer could be read.
            request = c.append_request(SESSION, 0, make_records(nxt, 1, rng))
            c.send_parts(request.seq, [request.encode()], on_answer(request.seq))
            c._writer.transport.abort()
            for _ in range(100):
                if answers:
                    break
                await asyncio.sleep(0.01)
            assert len(answers) == 1
            seq, error = answers[0]
            assert seq == request.seq and isinstance(error, StorageConnectionClosed)
            with pytest.raises(StorageConnectionClosed):
                c.send_parts(request.seq + 1, [request.encode()], on_answer(0))
        assert len(answers) == 1

    run(go(), timeout=20)


def test_back_pressure_with_a_tiny_queue_does_not_deadlock(storage_factory):
    node = storage_factory(extra=["--queue-max-requests", "4"])
    rng = random.Random(8)

    async def go():
        async with await node.client() as c:
            requests = []
            written: dict[int, list[Record]] = {0: [], 1: []}
            for i in range(200):
                partition = i % 2
                first = len(written[partition])
                batch = make_records(first, 1, rng, partition)
                written[partition] += batch
                requests.append(c.append_request(SESSION, partition, batch))
            futures, order = _pipeline(c, requests)
            responses = await asyncio.gather(*futures)
            assert all(isinstance(r, SuccessResponse) for r in responses)
            for partition in (0, 1):
                seqs = [r.seq for r in requests if r.partition_id == partition]
                assert [s for s in order if s in set(seqs)] == seqs
                assert await c.max_transaction_id(SESSION, partition) == 99
                assert await read_all(c, SESSION, partition, 0, 99) == written[partition]
            # A second round on the same connection: reading resumed after the pause.
            more = [c.append_request(SESSION, 0, make_records(100 + i, 1, rng)) for i in range(50)]
            futures, _ = _pipeline(c, more)
            assert all(isinstance(r, SuccessResponse) for r in await asyncio.gather(*futures))
            assert await c.max_transaction_id(SESSION, 0) == 149
        assert node.alive()

    run(go(), timeout=20)


# --- malformed input ----------------------------------------------------------------------


async def raw_connect(node, hello: bytes | None = None):
    """A raw socket; with the default hello it completes the handshake (reply checked)."""
    reader, writer = await asyncio.open_connection(node.host, node.port)
    if hello is None:
        writer.write(Hello(Service.STORAGE, 1, 1).encode())
        reply = HelloReply.decode(await reader.readexactly(HANDSHAKE_BYTES))
        assert reply.status == HandshakeStatus.OK
    else:
        writer.write(hello)
    return reader, writer


async def read_until_closed(reader: asyncio.StreamReader, timeout: float = 10.0) -> bytes:
    """Everything the server sends until it closes the connection (fails if it never does)."""
    chunks = []
    async with asyncio.timeout(timeout):
        while True:
            try:
                data = await reader.read(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks)


# The frames below go to ``raw_connect``'s connections, of protocol version 1: records
# of format 1.


def _append_with_bad_crc() -> bytes:
    rec = Record(0, ReqId(1, 2, 0, 3), 0, b"payload of the corrupted record")
    good = AppendRequest(SESSION, 77, 0, RecordBatch.from_records([rec], FORMAT_1)).encode()
    bad = bytearray(good)
    bad[-1] ^= 0xFF  # the record's data CRC-32 is the frame's last 4 bytes
    return bytes(bad)


def _truncated_append() -> bytes:
    rec = Record(0, ReqId(1, 2, 0, 3), 0, b"z" * 500)
    frame = AppendRequest(SESSION, 78, 0, RecordBatch.from_records([rec], FORMAT_1)).encode()
    return frame[: len(frame) // 2]


_garbage_rng = random.Random(99)
MALFORMED = {
    # name: (bytes sent after the handshake, half-close afterwards, words the reason names)
    "oversized_length": (struct.pack(">IB", 2**32 - 1, 6) + b"\x00" * 64, False, ["length"]),
    "just_over_max_length": (struct.pack(">IB", 64 * 1024 * 1024 + 1, 6), False, ["length"]),
    "zero_length": (b"\x00\x00\x00\x00" + b"\x00" * 16, False, ["length 0"]),
    "unknown_type": (encode_frame(99, MESSAGE_HEADER.pack(1, 1, 0)), False, ["type 99"]),
    "response_type_as_request": (
        encode_frame(StorageMessageType.SUCCESS_RESPONSE, MESSAGE_HEADER.pack(1, 1, 0)),
        False,
        ["type 7"],
    ),
    "short_body": (
        encode_frame(StorageMessageType.MAX_TRANSACTION_ID_REQUEST, b"\x00" * 5),
        False,
        [],
    ),
    "trailing_bytes": (
        encode_frame(
            StorageMessageType.MAX_TRANSACTION_ID_REQUEST, MESSAGE_HEADER.pack(1, 1, 0) + b"xx"
        ),
        False,
        [],
    ),
    "truncated_body_then_close": (_truncated_append(), True, ["truncat"]),
    "append_bad_data_crc": (_append_with_bad_crc(), False, ["CRC", "transaction 0"]),
    "garbage_text": (b"GARBAGE!" * 8, False, []),
    "garbage_plausible_length": (
        struct.pack(">IB", 41, StorageMessageType.APPEND_REQUEST) + _garbage_rng.randbytes(40),
        False,
        [],
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_frame_closes_only_that_connection(storage_node, case):
    payload, half_close, words = MALFORMED[case]

    async def go():
        async with await storage_node.client() as other:
            await check_serves(storage_node, other)
            reader, writer = await raw_connect(storage_node)
            try:
                # A valid request first: the connection works until the bad frame.
                writer.write(MaxTransactionIdRequest(-1, 1, 0).encode())
                first = await reader.readexactly(4)
                first += await reader.readexactly(struct.unpack(">I", first)[0])
                writer.write(payload)
                if half_close:
                    writer.write_eof()
                received = first + await read_until_closed(reader)
            finally:
                writer.close()
            # The process and the other connection carry on.
            await check_serves(storage_node, other)
            async with await storage_node.client() as fresh:
                await check_serves(storage_node, fresh, partition=1)
            return received

    received = run(go())
    assert storage_node.alive()
    frames = FrameDecoder().feed(received)
    messages = [decode_response(t, body) for t, body in frames]
    # The request before the bad frame was answered (not open yet: NOT_OPEN), then the reason.
    assert messages, f"{case}: the server closed without saying why"
    assert isinstance(messages[0], FailureResponse) and messages[0].seq == 1
    assert messages[0].error == StorageError.NOT_OPEN
    assert len(messages) == 2, f"{case}: expected one Failure for the bad frame, got {messages}"
    failure = messages[1]
    assert isinstance(failure, FailureResponse)
    assert failure.error == StorageError.MALFORMED_REQUEST
    assert (failure.partition_id, failure.seq, failure.session_id) == (-1, -1, -1)
    for word in words:
        assert word.lower() in failure.message.lower(), failure.message


HANDSHAKES = {
    "bad_magic": (b"NOPE" + Hello(Service.STORAGE, 1, 1).encode()[4:], None),
    "wrong_service": (Hello(Service.SERVER, 1, 1).encode(), HandshakeStatus.WRONG_SERVICE),
    "unsupported_version": (
        Hello(Service.STORAGE, 50, 60).encode(),
        HandshakeStatus.UNSUPPORTED_VERSION,
    ),
    "empty_version_range": (struct.pack(">4sBBHHH", b"WLTZ", 1, 0, 3, 1, 0), None),
    "unknown_service": (struct.pack(">4sBBHHH", b"WLTZ", 9, 0, 1, 1, 0), None),
    "http_request": (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", None),
}


@pytest.mark.parametrize("case", list(HANDSHAKES))
def test_bad_handshake_is_refused_and_process_carries_on(storage_node, case):
    hello, status = HANDSHAKES[case]

    async def go():
        async with await storage_node.client() as other:
            reader, writer = await raw_connect(storage_node, hello)
            received = await read_until_closed(reader)
            writer.close()
            await check_serves(storage_node, other)
            return received

    received = run(go())
    if status is None:
        assert received == b"", f"{case}: expected a close without a reply, got {received!r}"
    else:
        assert len(received) == HANDSHAKE_BYTES, received
        reply = HelloReply.decode(received)
        assert reply.status == status
    assert storage_node.alive()
