"""Client <-> server messages: layouts, round trips through the frame decoder, validation."""

from __future__ import annotations

import contextlib
import random
import re
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from waltz_client.wire.buffers import Reader
from waltz_client.wire.client_messages import (
    CLIENT_REQUESTS,
    COMMIT_TIME_VERSION,
    MAX_ERROR_MESSAGE_BYTES,
    MAX_FEED_BATCH,
    MAX_LOCKS,
    PROTOCOL_VERSION,
    SERVER_PROTOCOL_VERSIONS,
    SERVER_RESPONSES,
    AllocateClientIdRequest,
    AppendRequest,
    ClientIdAllocated,
    ClientMessage,
    ClientMessageType,
    ErrorCode,
    ErrorResponse,
    FeedData,
    FeedRequest,
    FeedRows,
    FeedSuspended,
    FindTimeRequest,
    FindTimeResponse,
    FlushRequest,
    FlushResponse,
    HighWaterMarkRequest,
    HighWaterMarkResponse,
    LockFailure,
    MountRequest,
    MountResponse,
    MountStatus,
    ReadRangeRequest,
    ReadRangeResponse,
    TransactionDataRequest,
    TransactionDataResponse,
    decode_client_request,
    decode_server_response,
    encode_feed_data,
    record_format,
    records_in,
)
from waltz_client.wire.errors import (
    ChecksumMismatch,
    FrameTooLarge,
    MalformedMessage,
    ProtocolError,
    UnknownMessageType,
)
from waltz_client.wire.framing import FrameDecoder, encode_frame
from waltz_client.wire.records import (
    DEFAULT_MAX_DATA_BYTES,
    FORMAT_1,
    FORMAT_2,
    NO_TIMESTAMP,
    RECORD_HEADER,
    TIMED_HEADER,
    Record,
    RecordBatch,
    RecordHeader,
    ReqId,
    UncheckedRecords,
)

I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
HWM = st.integers(-1, 2**63 - 1)  # a client high-water mark: -1 or a transaction ID
# Transaction data up to ~2 KiB; large payloads come from a seeded PRNG so that
# lists of them do not exhaust hypothesis' entropy buffer.
DATA = st.one_of(
    st.binary(max_size=64),
    st.builds(lambda n, seed: random.Random(seed).randbytes(n), st.integers(0, 2048), I64),
)
REQ_IDS = st.builds(ReqId, I32, I32, I32, I32)
LOCKS = st.lists(I32, max_size=40).map(tuple)
HEADERS = st.builds(RecordHeader, I64, REQ_IDS, I32, I64)  # with a commit time
RECORDS = st.builds(Record, I64, REQ_IDS, I32, DATA, I64)
BATCHES = st.lists(RECORDS, max_size=20).map(RecordBatch.from_records)
# Up to 1000 characters of at most 4 UTF-8 bytes each: always under the 4096-byte cap.
TEXT = st.text(max_size=1000)

MESSAGE_STRATEGIES: dict[type[ClientMessage], st.SearchStrategy[ClientMessage]] = {
    MountRequest: st.builds(MountRequest, REQ_IDS, HWM, I32),
    AppendRequest: st.builds(AppendRequest, REQ_IDS, HWM, LOCKS, LOCKS, LOCKS, I32, DATA),
    FeedRequest: st.builds(FeedRequest, REQ_IDS, HWM),
    TransactionDataRequest: st.builds(TransactionDataRequest, REQ_IDS, I64),
    FlushRequest: st.builds(FlushRequest, REQ_IDS),
    HighWaterMarkRequest: st.builds(HighWaterMarkRequest, REQ_IDS),
    FindTimeRequest: st.builds(FindTimeRequest, REQ_IDS, I64),
    AllocateClientIdRequest: st.builds(AllocateClientIdRequest, REQ_IDS),
    ReadRangeRequest: st.builds(
        ReadRangeRequest,
        REQ_IDS,
        st.integers(0, 2**63 - 1),
        st.integers(1, 2**31 - 1),
        st.integers(1, 2**31 - 1),
    ),
    MountResponse: st.builds(MountResponse, REQ_IDS, st.sampled_from(MountStatus)),
    FeedData: st.builds(FeedData, REQ_IDS, st.lists(HEADERS, max_size=30).map(tuple)),
    FeedSuspended: st.builds(FeedSuspended, REQ_IDS, TEXT),
    TransactionDataResponse: st.one_of(
        st.builds(TransactionDataResponse, REQ_IDS, I64, DATA),
        st.builds(TransactionDataResponse, REQ_IDS, I64, st.none(), TEXT),
    ),
    FlushResponse: st.builds(FlushResponse, REQ_IDS, I64),
    LockFailure: st.builds(LockFailure, REQ_IDS, I64),
    HighWaterMarkResponse: st.builds(HighWaterMarkResponse, REQ_IDS, I64),
    FindTimeResponse: st.builds(FindTimeResponse, REQ_IDS, I64, I64),
    ReadRangeResponse: st.builds(ReadRangeResponse, REQ_IDS, I64, BATCHES),
    ErrorResponse: st.builds(ErrorResponse, REQ_IDS, st.sampled_from(ErrorCode), TEXT),
    ClientIdAllocated: st.builds(ClientIdAllocated, REQ_IDS, st.integers(0, 2**31 - 1)),
}
REQUEST_CLASSES = sorted(CLIENT_REQUESTS.values(), key=lambda c: c.TYPE)
RESPONSE_CLASSES = sorted(SERVER_RESPONSES.values(), key=lambda c: c.TYPE)
ALL_CLASSES = REQUEST_CLASSES + RESPONSE_CLASSES
ANY_MESSAGE = st.one_of(*MESSAGE_STRATEGIES.values())
CHUNK_SIZES = st.sampled_from([1, 2, 3, 5, 13, 100, 4096, 1 << 20])

REQ = ReqId(1, 2, 3, 4)
REQ_BYTES = bytes.fromhex("00000001 00000002 00000003 00000004")


def decoder_for(cls):
    return decode_client_request if cls in REQUEST_CLASSES else decode_server_response


def other_decoder_for(cls):
    return decode_server_response if cls in REQUEST_CLASSES else decode_client_request


def decode(message_type: int, body: bytes, max_data_bytes: int = DEFAULT_MAX_DATA_BYTES):
    if message_type in CLIENT_REQUESTS:
        return decode_client_request(message_type, body, max_data_bytes)
    return decode_server_response(message_type, body, max_data_bytes)


def split(stream: bytes, rnd, max_chunk: int) -> list[bytes]:
    chunks = []
    pos = 0
    while pos < len(stream):
        n = rnd.randint(1, max_chunk)
        chunks.append(stream[pos : pos + n])
        pos += n
    return chunks


def one_frame(message: ClientMessage) -> tuple[int, bytes]:
    (frame,) = FrameDecoder().feed(message.encode())
    return frame


def body_of(message: ClientMessage) -> bytes:
    return one_frame(message)[1]


def hashes(*values: int) -> bytes:
    return struct.pack(f">i{len(values)}i", len(values), *values)


def crc(data: bytes) -> bytes:
    return struct.pack(">I", zlib.crc32(data))


def append_body(
    data: bytes = b"abc",
    *,
    req: tuple[int, int, int, int] = (1, 2, 3, 4),
    hwm: int = 9,
    write=(),
    read=(),
    append=(),
    header: int = 0,
    length: int | None = None,
    checksum: int | None = None,
) -> bytes:
    """An Append body built by hand, independently of the encoder."""
    return (
        struct.pack(">iiii", *req)
        + struct.pack(">q", hwm)
        + hashes(*write)
        + hashes(*read)
        + hashes(*append)
        + struct.pack(">ii", header, len(data) if length is None else length)
        + data
        + (crc(data) if checksum is None else struct.pack(">I", checksum))
    )


def data_response_body(
    data: bytes = b"abc", *, txid: int = 44, length: int | None = None, checksum=None
) -> bytes:
    return (
        REQ_BYTES
        + struct.pack(">qBi", txid, 1, len(data) if length is None else length)
        + data
        + (crc(data) if checksum is None else struct.pack(">I", checksum))
    )


def wire_record(
    txid, data, *, req=(0, 0, 0, 0), header=0, length=None, checksum=None, time=None
) -> bytes:
    """A record built by hand: format 2 (``time`` after the length; -1 unless given), or
    format 1 with ``time=False``."""
    size = len(data) if length is None else length
    if time is False:
        head = struct.pack(">qiiiiii", txid, *req, header, size)
    else:
        head = struct.pack(">qiiiiiiq", txid, *req, header, size, -1 if time is None else time)
    return head + data + (crc(data) if checksum is None else struct.pack(">I", checksum))


# --- type codes, tables and constants ---------------------------------------------------------


def test_every_message_class_has_a_strategy():
    assert set(MESSAGE_STRATEGIES) == set(ALL_CLASSES)
    assert len(CLIENT_REQUESTS) == 9 and len(SERVER_RESPONSES) == 11
    assert not set(CLIENT_REQUESTS) & set(SERVER_RESPONSES)


def test_type_codes():
    assert {t.name: t.value for t in ClientMessageType} == {
        "MOUNT_REQUEST": 0,
        "MOUNT_RESPONSE": 1,
        "APPEND_REQUEST": 2,
        "FEED_REQUEST": 3,
        "FEED_DATA": 4,
        "FEED_SUSPENDED": 5,
        "TRANSACTION_DATA_REQUEST": 6,
        "TRANSACTION_DATA_RESPONSE": 7,
        "FLUSH_REQUEST": 8,
        "FLUSH_RESPONSE": 9,
        "LOCK_FAILURE": 10,
        "HIGH_WATER_MARK_REQUEST": 11,
        "HIGH_WATER_MARK_RESPONSE": 12,
        "READ_RANGE_REQUEST": 13,
        "READ_RANGE_RESPONSE": 14,
        "ERROR_RESPONSE": 15,
        "ALLOCATE_CLIENT_ID_REQUEST": 16,
        "CLIENT_ID_ALLOCATED": 17,
        "FIND_TIME_REQUEST": 18,
        "FIND_TIME_RESPONSE": 19,
    }
    assert {c.__name__: c.TYPE for c in REQUEST_CLASSES} == {
        "MountRequest": 0,
        "AppendRequest": 2,
        "FeedRequest": 3,
        "TransactionDataRequest": 6,
        "FlushRequest": 8,
        "HighWaterMarkRequest": 11,
        "ReadRangeRequest": 13,
        "AllocateClientIdRequest": 16,
        "FindTimeRequest": 18,
    }
    assert {c.__name__: c.TYPE for c in RESPONSE_CLASSES} == {
        "MountResponse": 1,
        "FeedData": 4,
        "FeedSuspended": 5,
        "TransactionDataResponse": 7,
        "FlushResponse": 9,
        "LockFailure": 10,
        "HighWaterMarkResponse": 12,
        "ReadRangeResponse": 14,
        "ErrorResponse": 15,
        "ClientIdAllocated": 17,
        "FindTimeResponse": 19,
    }


def test_status_and_error_codes():
    assert {s.name: s.value for s in MountStatus} == {
        "READY": 0,
        "NOT_OWNER": 1,
        "STALE_GENERATION": 2,
        "STALE_CONNECTION": 3,
    }
    assert {e.name: e.value for e in ErrorCode} == {
        "NOT_OWNER": 1,
        "NOT_READY": 2,
        "NOT_FOUND": 3,
        "STORAGE_UNAVAILABLE": 4,
        "BAD_REQUEST": 5,
        "NOT_MOUNTED": 6,
        "LIMIT_EXCEEDED": 7,
        "UNAUTHORIZED": 8,
        "FORBIDDEN": 9,
        "TRUNCATED": 10,
    }


def test_constants():
    assert range(1, 4) == SERVER_PROTOCOL_VERSIONS
    assert COMMIT_TIME_VERSION == PROTOCOL_VERSION == 3
    assert MAX_LOCKS == 1024
    assert MAX_FEED_BATCH == 65_536
    assert MAX_ERROR_MESSAGE_BYTES == 4096


# --- partition_id, partition_ready, defaults --------------------------------------------------


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_partition_id_is_the_req_ids(cls):
    message = cls(ReqId(7, 8, 42, 9))
    assert message.partition_id == 42
    assert message.req_id == ReqId(7, 8, 42, 9)


@given(ANY_MESSAGE)
def test_partition_id_survives_the_round_trip(message):
    decoded = decode(*one_frame(message))
    assert decoded.partition_id == message.partition_id == message.req_id.partition_id


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_default_fields_round_trip(cls):
    message = cls(REQ)
    assert decoder_for(cls)(*one_frame(message)) == message


@pytest.mark.parametrize("status", list(MountStatus), ids=lambda s: s.name)
def test_mount_response_partition_ready(status):
    response = MountResponse(REQ, status)
    assert response.partition_ready is (status is MountStatus.READY)
    decoded = decode_server_response(*one_frame(response))
    assert decoded.partition_ready is response.partition_ready
    assert decoded.status is status


def test_mount_response_defaults_to_ready():
    assert MountResponse(REQ).partition_ready is True


# --- byte layouts (independent of the encoder) -------------------------------------------------


def test_mount_request_bytes():
    assert MountRequest(ReqId(1, 2, 3, 4), 5, 6).encode() == bytes.fromhex(
        "0000001d 00"  # length 29 = type byte + 16-byte ReqId + i64 + i32
        "00000001 00000002 00000003 00000004"
        "0000000000000005 00000006"
    )


def test_mount_request_negative_fields_bytes():
    assert MountRequest(ReqId(-1, -2, 0x7FFFFFFF, -(2**31)), -1, -1).encode() == bytes.fromhex(
        "0000001d 00"  # length, type
        "ffffffff fffffffe 7fffffff 80000000"  # ReqId
        "ffffffffffffffff ffffffff"  # high-water mark, connection seq
    )


def test_append_request_bytes():
    message = AppendRequest(ReqId(1, 2, 3, 4), 9, (10, -1), (), (7,), 0x55, b"abc")
    assert message.encode() == bytes.fromhex(
        "00000040 02"  # length 64
        "00000001 00000002 00000003 00000004"  # ReqId
        "0000000000000009"  # client high-water mark
        "00000002 0000000a ffffffff"  # write locks
        "00000000"  # read locks
        "00000001 00000007"  # append locks
        "00000055"  # header
        "00000003 616263"  # data
        "352441c2"  # CRC-32 of b"abc"
    )


def test_append_request_bytes_built_with_struct():
    write = tuple(range(-3, 5))
    read = (2**31 - 1, -(2**31))
    append = (0,)
    data = bytes(range(256)) * 3
    message = AppendRequest(ReqId(-5, 6, 7, 8), -1, write, read, append, -77, data)
    body = append_body(
        data, req=(-5, 6, 7, 8), hwm=-1, write=write, read=read, append=append, header=-77
    )
    assert message.encode() == struct.pack(">IB", len(body) + 1, 2) + body
    assert decode_client_request(2, body) == message


def test_feed_data_bytes():
    """Version 3: each row is the header, then its commit time."""
    headers = (
        RecordHeader(100, ReqId(5, 6, 7, 8), 9, 0x0000018C0A1B2C3D),
        RecordHeader(101, ReqId(5, 6, 7, 10), -1),  # no time: -1
    )
    message = FeedData(ReqId(1, 2, 3, 4), headers)
    assert message.encode() == bytes.fromhex(
        "0000005d 04"  # length 93 = 1 + 16 + 4 + 2 * 36
        "00000001 00000002 00000003 00000004"
        "00000002"
        "0000000000000064 00000005 00000006 00000007 00000008 00000009 0000018c0a1b2c3d"
        "0000000000000065 00000005 00000006 00000007 0000000a ffffffff ffffffffffffffff"
    )


def test_feed_data_bytes_of_version_2():
    """Versions 1 and 2: each row is the header alone (its time is not sent)."""
    headers = (
        RecordHeader(100, ReqId(5, 6, 7, 8), 9, 0x0000018C0A1B2C3D),
        RecordHeader(101, ReqId(5, 6, 7, 10), -1),
    )
    message = FeedData(ReqId(1, 2, 3, 4), headers, FORMAT_1)
    assert message.encode() == bytes.fromhex(
        "0000004d 04"  # length 77 = 1 + 16 + 4 + 2 * 28
        "00000001 00000002 00000003 00000004"
        "00000002"
        "0000000000000064 00000005 00000006 00000007 00000008 00000009"
        "0000000000000065 00000005 00000006 00000007 0000000a ffffffff"
    )


def test_empty_feed_data_bytes():
    assert FeedData(REQ).encode() == bytes.fromhex("00000015 04") + REQ_BYTES + bytes(4)


LAYOUT_CASES = [
    (MountRequest(REQ, -1, 0), struct.pack(">qi", -1, 0)),
    (AppendRequest(REQ), struct.pack(">qiiiii", -1, 0, 0, 0, 0, 0) + crc(b"")),
    (FeedRequest(REQ, 77), struct.pack(">q", 77)),
    (TransactionDataRequest(REQ, 78), struct.pack(">q", 78)),
    (FlushRequest(REQ), b""),
    (HighWaterMarkRequest(REQ), b""),
    (FindTimeRequest(REQ, 1_800_000_000_123), struct.pack(">q", 1_800_000_000_123)),
    (ReadRangeRequest(REQ, 5, 6, 7), struct.pack(">qii", 5, 6, 7)),
    (MountResponse(REQ, MountStatus.STALE_CONNECTION), b"\x03"),
    (
        FeedData(REQ, (RecordHeader(1, ReqId(2, 3, 4, 5), 6, 1_700_000_000_123),)),
        struct.pack(">i", 1) + struct.pack(">qiiiiiq", 1, 2, 3, 4, 5, 6, 1_700_000_000_123),
    ),
    (FeedSuspended(REQ, "moved"), b"\x00\x05moved"),
    (FeedSuspended(REQ, "né"), b"\x00\x03n\xc3\xa9"),
    (
        TransactionDataResponse(REQ, 44, b"abc"),
        struct.pack(">qBi", 44, 1, 3) + b"abc" + bytes.fromhex("352441c2"),
    ),
    (TransactionDataResponse(REQ, 44, b""), struct.pack(">qBi", 44, 1, 0) + bytes(4)),
    (
        TransactionDataResponse(REQ, 44, None, "gone"),
        struct.pack(">qBH", 44, 0, 4) + b"gone",
    ),
    (FlushResponse(REQ, 10), struct.pack(">q", 10)),
    (LockFailure(REQ, 11), struct.pack(">q", 11)),
    (HighWaterMarkResponse(REQ, 12), struct.pack(">q", 12)),
    (FindTimeResponse(REQ, 40, 99), struct.pack(">qq", 40, 99)),
    (ReadRangeResponse(REQ), struct.pack(">qi", -1, 0)),
    (
        ReadRangeResponse(
            REQ,
            20,
            RecordBatch.from_records(
                [
                    Record(10, ReqId(1, 2, 3, 4), 7, b"xy", 1_700_000_000_000),
                    Record(11, ReqId(1, 2, 3, 5), 8, b""),
                ]
            ),
        ),
        struct.pack(">qi", 20, 2)
        + wire_record(10, b"xy", req=(1, 2, 3, 4), header=7, time=1_700_000_000_000)
        + wire_record(11, b"", req=(1, 2, 3, 5), header=8),
    ),
    (ErrorResponse(REQ, ErrorCode.NOT_FOUND, "no"), b"\x03\x00\x02no"),
    (ErrorResponse(REQ), b"\x05\x00\x00"),
]


@pytest.mark.parametrize(
    ("message", "fields"), LAYOUT_CASES, ids=[type(m).__name__ for m, _ in LAYOUT_CASES]
)
def test_layout(message, fields):
    body = REQ_BYTES + fields
    assert message.encode() == struct.pack(">IB", len(body) + 1, message.TYPE) + body
    assert decoder_for(type(message))(message.TYPE, body) == message


# --- encode_feed_data ---------------------------------------------------------------------------


@given(REQ_IDS, st.lists(HEADERS, max_size=50))
def test_encode_feed_data_matches_the_message_encoder(req_id, headers):
    packed = [TIMED_HEADER.pack(*_fields(h)) for h in headers]
    assert packed == [h.encode(FORMAT_2) for h in headers]  # the feed cache's entries
    encoded = encode_feed_data(req_id, packed, 3)
    assert encoded == FeedData(req_id, tuple(headers)).encode()
    decoded = decode_server_response(*one_frame(FeedData(req_id, tuple(headers))))
    assert decoded == FeedData(req_id, tuple(headers))


def _fields(h: RecordHeader) -> tuple[int, ...]:
    q = h.req_id
    return (
        h.transaction_id,
        q.client_id,
        q.generation,
        q.partition_id,
        q.seq,
        h.header,
        h.timestamp,
    )


@pytest.mark.parametrize("version", [1, 2])
@given(req_id=REQ_IDS, headers=st.lists(HEADERS, max_size=50))
def test_encode_feed_data_for_an_older_client_leaves_the_times_out(version, req_id, headers):
    """The same cache entries (TIMED_HEADER) to a version 1 or 2 client: each row's first
    28 bytes, as that version's FeedData lays them out; decoded, no row has a time."""
    encoded = encode_feed_data(req_id, [h.encode(FORMAT_2) for h in headers], version)
    assert encoded == FeedData(req_id, tuple(headers), FORMAT_1).encode()
    assert encoded == encode_frame(
        ClientMessageType.FEED_DATA,
        req_id.encode()
        + struct.pack(">i", len(headers))
        + b"".join(RECORD_HEADER.pack(*_fields(h)[:6]) for h in headers),
    )
    decoded = decode_server_response(*one_frame_of(encoded), version=version)
    untimed = tuple(RecordHeader(h.transaction_id, h.req_id, h.header) for h in headers)
    assert decoded == FeedData(req_id, untimed, FORMAT_1)
    assert all(h.timestamp == NO_TIMESTAMP for h in decoded.headers)


def one_frame_of(encoded: bytes) -> tuple[int, bytes]:
    (frame,) = FrameDecoder().feed(encoded)
    return frame


@pytest.mark.parametrize("version", [1, 2, 3])
def test_encode_feed_data_refuses_rows_that_are_not_timed_headers(version):
    """A wrongly packed cache entry (28 bytes: no time) never reaches a version 3 client
    as a frame it cannot read."""
    short = [RECORD_HEADER.pack(1, 2, 3, 4, 5, 6), RECORD_HEADER.pack(2, 2, 3, 4, 6, 6)]
    if version < 3:  # their first 28 bytes are all an older client gets
        decoded = decode_server_response(
            *one_frame_of(encode_feed_data(REQ, short, version)), version=version
        )
        assert [h.transaction_id for h in decoded.headers] == [1, 2]
        return
    with pytest.raises(
        ValueError,
        match=r"^FeedData: 2 headers packed in 56 bytes; each must be a TIMED_HEADER of 36 bytes$",
    ):
        encode_feed_data(REQ, short, version)


@given(REQ_IDS, st.lists(HEADERS, max_size=50))
def test_a_feed_decoded_as_rows_is_the_same_feed(req_id, headers):
    """A client's stream decodes feeds as rows (``feed_rows``): the same headers, the same
    frame when encoded again."""
    message = FeedData(req_id, tuple(headers))
    rows = decode_server_response(*one_frame(message), feed_rows=True)
    assert type(rows) is FeedRows and rows.req_id == req_id
    assert rows.headers == message.headers
    assert rows.encode() == message.encode()
    # Anything but a feed is decoded as ever.
    other = FlushResponse(req_id, 7)
    assert decode_server_response(*one_frame(other), feed_rows=True) == other


def test_encode_feed_data_from_struct_packed_headers():
    packed = [TIMED_HEADER.pack(i, 1, 2, 3, i, -i, 1000 + i) for i in range(5)]
    encoded = encode_feed_data(REQ, packed, 3)
    headers = tuple(RecordHeader(i, ReqId(1, 2, 3, i), -i, 1000 + i) for i in range(5))
    assert encoded == FeedData(REQ, headers).encode()
    assert encoded == struct.pack(">IB", 1 + 16 + 4 + 5 * 36, 4) + REQ_BYTES + struct.pack(
        ">i", 5
    ) + b"".join(packed)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_encode_feed_data_with_no_headers(version):
    assert encode_feed_data(REQ, [], version) == FeedData(REQ).encode()


# --- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), max_chunk=CHUNK_SIZES, rnd=st.randoms())
def test_round_trip_through_the_frame_decoder(cls, data, max_chunk, rnd):
    message = data.draw(MESSAGE_STRATEGIES[cls], label="message")
    encoded = message.encode()
    decoder = FrameDecoder()
    frames = []
    for chunk in split(encoded, rnd, max_chunk):
        frames.extend(decoder.feed(chunk))
    assert decoder.buffered == 0
    assert len(frames) == 1
    message_type, body = frames[0]
    assert message_type == cls.TYPE
    assert body[:16] == message.req_id.encode()
    decoded = decoder_for(cls)(message_type, body)
    assert type(decoded) is cls
    assert decoded == message
    assert decoded.encode() == encoded
    # The other direction's table does not accept it.
    direction = "response" if cls in REQUEST_CLASSES else "request"
    with pytest.raises(
        UnknownMessageType, match=rf"^message type {cls.TYPE} is not a client {direction}$"
    ):
        other_decoder_for(cls)(message_type, body)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ANY_MESSAGE, max_size=8), CHUNK_SIZES, st.randoms())
def test_a_stream_of_messages_round_trips(messages, max_chunk, rnd):
    stream = b"".join(m.encode() for m in messages)
    decoder = FrameDecoder()
    decoded = []
    for chunk in split(stream, rnd, max_chunk):
        decoded.extend(decode(t, body) for t, body in decoder.feed(chunk))
    assert decoded == messages
    assert decoder.buffered == 0


@given(
    req_id=st.builds(ReqId, *[st.integers(-(2**31), 2**31 - 1)] * 4),
    hwm=st.integers(-1, 2**63 - 1),
    header=st.integers(-(2**31), 2**31 - 1),
    data=st.binary(max_size=300),
)
def test_a_lock_free_append_encodes_as_the_general_frame_does(req_id, hwm, header, data):
    """Its one-pack encoding is byte for byte the frame of the general layout."""
    message = AppendRequest(req_id, hwm, (), (), (), header, data)
    assert message.encode() == encode_frame(message.TYPE, req_id.encode() + message._body())
    assert message.encode() == encode_frame(
        message.TYPE,
        append_body(
            data,
            req=(req_id.client_id, req_id.generation, req_id.partition_id, req_id.seq),
            hwm=hwm,
            header=header,
        ),
    )


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(REQ_IDS, HWM, LOCKS, LOCKS, LOCKS, I32, DATA)
def test_append_fields_survive_the_round_trip(req_id, hwm, write, read, append, header, data):
    message = AppendRequest(req_id, hwm, write, read, append, header, data)
    decoded = decode_client_request(*one_frame(message))
    assert isinstance(decoded, AppendRequest)
    assert decoded.req_id == req_id
    assert decoded.client_high_water_mark == hwm
    assert (decoded.write_locks, decoded.read_locks, decoded.append_locks) == (
        write,
        read,
        append,
    )
    assert isinstance(decoded.write_locks, tuple)
    assert decoded.header == header
    assert decoded.data == data


def test_append_with_max_locks_of_each_kind_round_trips():
    locks = tuple(range(-512, 512))
    assert len(locks) == MAX_LOCKS
    message = AppendRequest(REQ, 5, locks, locks[::-1], locks, 1, b"x")
    assert decode_client_request(*one_frame(message)) == message


def test_feed_data_with_max_feed_batch_headers_round_trips():
    headers = tuple(RecordHeader(i, ReqId(1, 2, 3, i), i % 7) for i in range(MAX_FEED_BATCH))
    message = FeedData(REQ, headers)
    decoded = decode_server_response(*one_frame(message))
    assert decoded == message
    assert len(decoded.headers) == MAX_FEED_BATCH


@given(REQ_IDS, I64, st.one_of(st.none(), DATA), TEXT)
def test_transaction_data_response_carries_data_or_an_error(req_id, txid, data, error):
    message = TransactionDataResponse(req_id, txid, data, error if data is None else "")
    decoded = decode_server_response(*one_frame(message))
    assert decoded == message
    assert decoded.data == data
    assert decoded.error == (error if data is None else "")


def test_transaction_data_response_empty_data_is_not_an_error():
    decoded = decode_server_response(*one_frame(TransactionDataResponse(REQ, 3, b"")))
    assert decoded.data == b""
    assert decoded.data is not None


def test_read_range_response_carries_several_records():
    records = [
        Record(100, ReqId(1, 2, 3, 1), 0, b"first"),
        Record(101, ReqId(1, 2, 3, 2), -5, b""),
        Record(102, ReqId(9, 2, 3, 7), 2**31 - 1, bytes(range(256))),
        Record(103, ReqId(1, 2, 3, 3), 1, b"last"),
    ]
    message = ReadRangeResponse(REQ, 150, RecordBatch.from_records(records))
    decoded = decode_server_response(*one_frame(message))
    assert isinstance(decoded, ReadRangeResponse)
    assert decoded == message
    assert decoded.high_water_mark == 150
    assert len(decoded.records) == 4
    assert list(decoded.records.records()) == records
    assert decoded.records.spans == message.records.spans
    assert (decoded.records.first_txid, decoded.records.last_txid) == (100, 103)
    assert decoded.records.data_bytes == 5 + 0 + 256 + 4
    assert list(decoded.records.headers()) == [
        RecordHeader(r.transaction_id, r.req_id, r.header) for r in records
    ]


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(REQ_IDS, I64, st.lists(RECORDS, max_size=20))
def test_read_range_records_survive_the_round_trip(req_id, hwm, records):
    message = ReadRangeResponse(req_id, hwm, RecordBatch.from_records(records))
    decoded = decode_server_response(*one_frame(message))
    assert decoded.high_water_mark == hwm
    assert list(decoded.records.records()) == records


@given(REQ_IDS, st.integers(0, 2**63 - 1), st.integers(1, 2**31 - 1), st.integers(1, 2**31 - 1))
def test_read_range_request_fields(req_id, start, count, size):
    decoded = decode_client_request(*one_frame(ReadRangeRequest(req_id, start, count, size)))
    assert (decoded.from_transaction_id, decoded.max_records, decoded.max_bytes) == (
        start,
        count,
        size,
    )


@pytest.mark.parametrize("cls", [FeedSuspended, ErrorResponse], ids=lambda c: c.__name__)
@given(text=st.text())
def test_unicode_text_round_trips(cls, text):
    message = cls(REQ, text) if cls is FeedSuspended else cls(REQ, ErrorCode.NOT_READY, text)
    decoded = decode_server_response(*one_frame(message))
    got = decoded.reason if cls is FeedSuspended else decoded.message
    if len(text.encode("utf-8")) <= MAX_ERROR_MESSAGE_BYTES:
        assert got == text
    else:
        assert text.startswith(got)


TEXT_FIELDS = [
    (FeedSuspended, lambda t: FeedSuspended(REQ, t), lambda m: m.reason),
    (ErrorResponse, lambda t: ErrorResponse(REQ, ErrorCode.NOT_OWNER, t), lambda m: m.message),
    (
        TransactionDataResponse,
        lambda t: TransactionDataResponse(REQ, 1, None, t),
        lambda m: m.error,
    ),
]


@pytest.mark.parametrize(
    ("cls", "build", "get"), TEXT_FIELDS, ids=[c.__name__ for c, _, _ in TEXT_FIELDS]
)
@pytest.mark.parametrize(
    ("text", "expected_bytes"),
    [
        ("a" * 4096, 4096),
        ("a" * 4097, 4096),
        ("a" * 4095 + "é", 4095),  # é is 2 bytes: it would end at 4097
        ("a" * 4094 + "€", 4094),  # € is 3 bytes
        ("a" * 4093 + "😀", 4093),  # a 4-byte character straddling the cut
        ("😀" * 2000, 4096),
    ],
)
def test_text_is_cut_to_4096_bytes_on_a_character_boundary(cls, build, get, text, expected_bytes):
    decoded = decode_server_response(*one_frame(build(text)))
    assert len(get(decoded).encode("utf-8")) == expected_bytes
    assert text.startswith(get(decoded))


def test_lone_surrogate_in_text_still_encodes():
    decoded = decode_server_response(*one_frame(FeedSuspended(REQ, "lost /zk/\udcff")))
    assert decoded.reason == "lost /zk/\\udcff"


# --- truncation: every cut point names the field ------------------------------------------------

REQ_ID_FIELDS = [
    ("ReqId.client_id", 4),
    ("ReqId.generation", 4),
    ("ReqId.partition_id", 4),
    ("ReqId.seq", 4),
]

# (message, the fields its body holds in order: Reader name, bytes)
FIELD_LAYOUTS = [
    (
        MountRequest(REQ, 5, 6),
        [("Mount.client_high_water_mark", 8), ("Mount.connection_seq", 4)],
    ),
    (
        AppendRequest(REQ, 9, (1, 2), (3,), (4, 5, 6), 7, b"data"),
        [
            ("Append.client_high_water_mark", 8),
            ("Append.write_locks", 4),
            ("Append.write_locks", 8),
            ("Append.read_locks", 4),
            ("Append.read_locks", 4),
            ("Append.append_locks", 4),
            ("Append.append_locks", 12),
            ("Append.header", 4),
            ("Append.data length", 4),
            ("Append.data", 4),
            ("Append.checksum", 4),
        ],
    ),
    (
        # No locks: the decoder's one-unpack path, whose cuts must name the same fields.
        AppendRequest(REQ, 9, (), (), (), 7, b"data"),
        [
            ("Append.client_high_water_mark", 8),
            ("Append.write_locks", 4),
            ("Append.read_locks", 4),
            ("Append.append_locks", 4),
            ("Append.header", 4),
            ("Append.data length", 4),
            ("Append.data", 4),
            ("Append.checksum", 4),
        ],
    ),
    (FeedRequest(REQ, 1), [("Feed.client_high_water_mark", 8)]),
    (TransactionDataRequest(REQ, 1), [("TransactionData.transaction_id", 8)]),
    (FlushRequest(REQ), []),
    (HighWaterMarkRequest(REQ), []),
    (FindTimeRequest(REQ, 5), [("FindTime.timestamp", 8)]),
    (AllocateClientIdRequest(REQ), []),
    (
        ReadRangeRequest(REQ, 1, 2, 3),
        [
            ("ReadRange.from_transaction_id", 8),
            ("ReadRange.max_records", 4),
            ("ReadRange.max_bytes", 4),
        ],
    ),
    (MountResponse(REQ, MountStatus.NOT_OWNER), [("MountResponse.status", 1)]),
    (
        FeedData(REQ, (RecordHeader(1, REQ, 2), RecordHeader(2, REQ, 3))),
        [("FeedData.count", 4), ("FeedData.headers", 72)],
    ),
    (
        FeedSuspended(REQ, "moved"),
        [("FeedSuspended.reason", 2), ("FeedSuspended.reason", 5)],
    ),
    (
        TransactionDataResponse(REQ, 44, b"abc"),
        [
            ("TransactionDataResponse.transaction_id", 8),
            ("TransactionDataResponse.success", 1),
            ("TransactionDataResponse.data length", 4),
            ("TransactionDataResponse.data", 3),
            ("TransactionDataResponse.checksum", 4),
        ],
    ),
    (
        TransactionDataResponse(REQ, 44, None, "gone"),
        [
            ("TransactionDataResponse.transaction_id", 8),
            ("TransactionDataResponse.success", 1),
            ("TransactionDataResponse.error", 2),
            ("TransactionDataResponse.error", 4),
        ],
    ),
    (FlushResponse(REQ, 1), [("FlushResponse.transaction_id", 8)]),
    (LockFailure(REQ, 1), [("LockFailure.transaction_id", 8)]),
    (HighWaterMarkResponse(REQ, 1), [("HighWaterMarkResponse.transaction_id", 8)]),
    (
        FindTimeResponse(REQ, 1, 2),
        [("FindTimeResponse.transaction_id", 8), ("FindTimeResponse.high_water_mark", 8)],
    ),
    (
        ReadRangeResponse(REQ, 1),
        [("ReadRangeResponse.high_water_mark", 8), ("ReadRangeResponse.count", 4)],
    ),
    (
        ErrorResponse(REQ, ErrorCode.NOT_READY, "later"),
        [("ErrorResponse.code", 1), ("ErrorResponse.message", 2), ("ErrorResponse.message", 5)],
    ),
    (ClientIdAllocated(REQ, 7), [("ClientIdAllocated.client_id", 4)]),
]


def expected_truncation(fields: list[tuple[str, int]], cut: int) -> str:
    """The exact error for a body cut at ``cut``: the field the cut falls in is named."""
    start = 0
    for name, size in REQ_ID_FIELDS + fields:
        if start <= cut < start + size:
            return (
                rf"^{re.escape(name)}: needs {size} bytes at offset {start}, "
                rf"only {cut - start} left$"
            )
        start += size
    raise AssertionError(f"cut {cut} is past the body")


def test_field_layouts_cover_every_class():
    assert {type(m) for m, _ in FIELD_LAYOUTS} == set(ALL_CLASSES)
    for message, fields in FIELD_LAYOUTS:
        assert len(body_of(message)) == 16 + sum(size for _, size in fields), message


@pytest.mark.parametrize(
    ("message", "fields"),
    FIELD_LAYOUTS,
    ids=[f"{type(m).__name__}-{i}" for i, (m, _) in enumerate(FIELD_LAYOUTS)],
)
def test_every_cut_point_names_the_missing_field(message, fields):
    body = body_of(message)
    decoder = decoder_for(type(message))
    for cut in range(len(body)):
        with pytest.raises(MalformedMessage, match=expected_truncation(fields, cut)):
            decoder(message.TYPE, body[:cut])
    assert decoder(message.TYPE, body) == message


def test_every_cut_point_of_read_range_records():
    records = [Record(7, REQ, 1, b"abc"), Record(8, REQ, 2, b"")]
    message = ReadRangeResponse(REQ, 9, RecordBatch.from_records(records))
    body = body_of(message)
    first = 16 + 12  # ReqId, high-water mark, count
    second = first + 40 + 3 + 4  # format 2: a 40-byte head
    assert len(body) == second + 40 + 4
    for cut in range(first, len(body)):
        if first <= cut < first + 40:
            expected = r"^record 0 of 2: truncated head at offset 0$"
        elif cut < second:
            expected = r"^record 0 \(transaction 7\): data length 3 runs past the frame$"
        elif cut < second + 40:
            expected = rf"^record 1 of 2: truncated head at offset {second - first}$"
        else:
            expected = r"^record 1 \(transaction 8\): data length 0 runs past the frame$"
        with pytest.raises(MalformedMessage, match=expected):
            decode_server_response(message.TYPE, body[:cut])


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_strict_prefix_of_a_body_is_malformed(cls, data):
    body = body_of(data.draw(MESSAGE_STRATEGIES[cls], label="message"))
    cut = data.draw(st.integers(0, len(body) - 1), label="cut")
    with pytest.raises(
        MalformedMessage, match=r"^[\w. ]+: needs \d+ bytes at offset|truncated head|runs past"
    ):
        decoder_for(cls)(cls.TYPE, body[:cut])


# --- trailing bytes -----------------------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), extra=st.binary(min_size=1, max_size=64))
def test_trailing_bytes_are_malformed(cls, data, extra):
    body = body_of(data.draw(MESSAGE_STRATEGIES[cls], label="message"))
    if cls is ReadRangeResponse:
        expected = rf"^record list: {len(extra)} trailing bytes after \d+ records$"
    else:
        expected = rf"^{cls.__name__}: {len(extra)} unexpected trailing bytes$"
    with pytest.raises(MalformedMessage, match=expected):
        decoder_for(cls)(cls.TYPE, body + extra)


def test_one_trailing_byte_after_an_empty_body():
    with pytest.raises(MalformedMessage, match=r"^FlushRequest: 1 unexpected trailing bytes$"):
        decode_client_request(ClientMessageType.FLUSH_REQUEST, REQ_BYTES + b"\x00")


# --- unknown types and the wrong direction ------------------------------------------------------


@pytest.mark.parametrize("message_type", [20, 21, 100, 255])
def test_unknown_message_type(message_type):
    with pytest.raises(
        UnknownMessageType, match=rf"^message type {message_type} is not a client request$"
    ):
        decode_client_request(message_type, REQ_BYTES)
    with pytest.raises(
        UnknownMessageType, match=rf"^message type {message_type} is not a client response$"
    ):
        decode_server_response(message_type, REQ_BYTES)


@pytest.mark.parametrize("cls", RESPONSE_CLASSES, ids=lambda c: c.__name__)
def test_a_response_type_is_not_a_request(cls):
    with pytest.raises(
        UnknownMessageType, match=rf"^message type {cls.TYPE} is not a client request$"
    ):
        decode_client_request(cls.TYPE, body_of(cls(REQ)))


@pytest.mark.parametrize("cls", REQUEST_CLASSES, ids=lambda c: c.__name__)
def test_a_request_type_is_not_a_response(cls):
    with pytest.raises(
        UnknownMessageType, match=rf"^message type {cls.TYPE} is not a client response$"
    ):
        decode_server_response(cls.TYPE, body_of(cls(REQ)))


def test_unknown_type_is_reported_before_the_body_is_read():
    with pytest.raises(UnknownMessageType):
        decode_client_request(200, b"")


def test_protocol_error_hierarchy():
    for cls in (UnknownMessageType, MalformedMessage, ChecksumMismatch, FrameTooLarge):
        assert issubclass(cls, ProtocolError)
    assert issubclass(ChecksumMismatch, MalformedMessage)


# --- lock counts --------------------------------------------------------------------------------

LOCK_KINDS = ["write", "read", "append"]


def append_with_lock_count(kind: str, count: int) -> bytes:
    """An Append body whose ``kind`` lock count is ``count`` (the others empty)."""
    body = REQ_BYTES + struct.pack(">q", 0)
    for k in LOCK_KINDS:
        body += struct.pack(">i", count if k == kind else 0)
        if k == kind:
            break
    return body


@pytest.mark.parametrize("kind", LOCK_KINDS)
@pytest.mark.parametrize("count", [-1, -(2**31), MAX_LOCKS + 1, 2**31 - 1])
def test_lock_count_outside_its_bound(kind, count):
    with pytest.raises(
        MalformedMessage, match=rf"^Append\.{kind}_locks: count {count} is outside 0\.\.1024$"
    ):
        decode_client_request(ClientMessageType.APPEND_REQUEST, append_with_lock_count(kind, count))


@pytest.mark.parametrize("kind", LOCK_KINDS)
def test_lock_count_exactly_max_locks_is_accepted(kind):
    locks = tuple(range(MAX_LOCKS))
    body = append_body(b"", **{kind: locks})
    decoded = decode_client_request(ClientMessageType.APPEND_REQUEST, body)
    assert getattr(decoded, f"{kind}_locks") == locks


@pytest.mark.parametrize("kind", LOCK_KINDS)
def test_lock_count_larger_than_the_hashes_sent(kind):
    body = append_with_lock_count(kind, 3) + struct.pack(">ii", 1, 2)
    with pytest.raises(
        MalformedMessage, match=rf"^Append\.{kind}_locks: needs 12 bytes at offset \d+, only 8"
    ):
        decode_client_request(ClientMessageType.APPEND_REQUEST, body)


def test_encoder_does_not_police_lock_count_but_the_decoder_does():
    locks = tuple(range(MAX_LOCKS + 1))
    encoded = AppendRequest(REQ, 0, (), locks).encode()
    with pytest.raises(
        MalformedMessage, match=r"^Append\.read_locks: count 1025 is outside 0\.\.1024$"
    ):
        decode_client_request(*FrameDecoder().feed(encoded)[0])


# --- data lengths and max_data_bytes ------------------------------------------------------------


@pytest.mark.parametrize("length", [-1, -(2**31), DEFAULT_MAX_DATA_BYTES + 1, 2**31 - 1])
def test_append_data_length_outside_its_bound(length):
    with pytest.raises(
        MalformedMessage, match=rf"^Append\.data length {length} is outside 0\.\.16777216$"
    ):
        decode_client_request(ClientMessageType.APPEND_REQUEST, append_body(b"", length=length))


def test_append_data_longer_than_max_data_bytes():
    body = append_body(b"12345")
    assert decode_client_request(2, body, max_data_bytes=5).data == b"12345"
    with pytest.raises(MalformedMessage, match=r"^Append\.data length 5 is outside 0\.\.4$"):
        decode_client_request(2, body, max_data_bytes=4)


def test_append_data_length_past_the_frame():
    with pytest.raises(
        MalformedMessage, match=r"^Append\.data: needs 4096 bytes at offset 44, only 7 left$"
    ):
        decode_client_request(2, append_body(b"abc", length=4096))


@pytest.mark.parametrize("length", [-1, -(2**31), DEFAULT_MAX_DATA_BYTES + 1, 2**31 - 1])
def test_transaction_data_length_outside_its_bound(length):
    with pytest.raises(
        MalformedMessage,
        match=rf"^TransactionDataResponse\.data length {length} is outside 0\.\.16777216$",
    ):
        decode_server_response(7, data_response_body(b"", length=length))


def test_transaction_data_longer_than_max_data_bytes():
    body = data_response_body(b"12345")
    assert decode_server_response(7, body, max_data_bytes=5).data == b"12345"
    with pytest.raises(
        MalformedMessage, match=r"^TransactionDataResponse\.data length 5 is outside 0\.\.4$"
    ):
        decode_server_response(7, body, max_data_bytes=4)


def test_read_range_record_longer_than_max_data_bytes():
    body = REQ_BYTES + struct.pack(">qi", 9, 1) + wire_record(44, b"12345")
    assert len(decode_server_response(14, body, max_data_bytes=5).records) == 1
    with pytest.raises(
        MalformedMessage, match=r"^record 0 \(transaction 44\): data length 5 is outside 0\.\.4$"
    ):
        decode_server_response(14, body, max_data_bytes=4)


@pytest.mark.parametrize("length", [-1, -(2**31)])
def test_read_range_record_negative_data_length(length):
    body = REQ_BYTES + struct.pack(">qi", 9, 1) + wire_record(44, b"", length=length)
    with pytest.raises(
        MalformedMessage,
        match=rf"^record 0 \(transaction 44\): data length {length} is outside 0\.\.16777216$",
    ):
        decode_server_response(14, body)


# --- counts -------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [-1, -(2**31), MAX_FEED_BATCH + 1, 2**31 - 1])
def test_feed_data_count_outside_its_bound(count):
    with pytest.raises(
        MalformedMessage, match=rf"^FeedData\.count: count {count} is outside 0\.\.65536$"
    ):
        decode_server_response(4, REQ_BYTES + struct.pack(">i", count))


def test_feed_data_with_fewer_headers_than_counted():
    body = REQ_BYTES + struct.pack(">i", 2) + struct.pack(">qiiiiiq", 1, 0, 0, 0, 0, 0, 5)
    with pytest.raises(
        MalformedMessage, match=r"^FeedData\.headers: needs 72 bytes at offset 20, only 36 left$"
    ):
        decode_server_response(4, body)
    older = REQ_BYTES + struct.pack(">i", 2) + struct.pack(">qiiiii", 1, 0, 0, 0, 0, 0)
    with pytest.raises(
        MalformedMessage, match=r"^FeedData\.headers: needs 56 bytes at offset 20, only 28 left$"
    ):
        decode_server_response(4, older, version=2)


@pytest.mark.parametrize("count", [-1, -(2**31), 1_000_001, 2**31 - 1])
def test_read_range_response_count_outside_its_bound(count):
    with pytest.raises(
        MalformedMessage,
        match=rf"^ReadRangeResponse\.count: count {count} is outside 0\.\.1000000$",
    ):
        decode_server_response(14, REQ_BYTES + struct.pack(">qi", 0, count))


def test_read_range_response_with_fewer_records_than_counted():
    body = REQ_BYTES + struct.pack(">qi", 0, 3) + wire_record(1, b"a") + wire_record(2, b"b")
    with pytest.raises(MalformedMessage, match=r"^record 2 of 3: truncated head at offset 90$"):
        decode_server_response(14, body)


# --- checksums ----------------------------------------------------------------------------------


def test_append_crc_mismatch_is_malformed():
    with pytest.raises(
        MalformedMessage,
        match=r"^Append ReqId\(client_id=1, generation=2, partition_id=3, seq=4\): "
        r"data CRC-32 0x352441c2 != sent 0x352441c3$",
    ):
        decode_client_request(2, append_body(b"abc", checksum=0x352441C3))


def test_transaction_data_crc_mismatch_is_malformed():
    with pytest.raises(
        MalformedMessage, match=r"^transaction 44: data CRC-32 0x352441c2 != sent 0x00000000$"
    ):
        decode_server_response(7, data_response_body(b"abc", checksum=0))


def test_read_range_crc_mismatch_is_a_checksum_mismatch():
    body = (
        REQ_BYTES
        + struct.pack(">qi", 0, 2)
        + wire_record(1, b"fine")
        + wire_record(2, b"abc", checksum=0x352441C3)
    )
    with pytest.raises(
        ChecksumMismatch, match=r"^transaction 2: data CRC-32 0x352441c2 != sent 0x352441c3$"
    ):
        decode_server_response(14, body)


def test_append_crc_mismatch_is_a_checksum_mismatch():
    with pytest.raises(ChecksumMismatch):
        decode_client_request(2, append_body(b"abc", checksum=0))


def test_transaction_data_crc_mismatch_is_a_checksum_mismatch():
    with pytest.raises(ChecksumMismatch):
        decode_server_response(7, data_response_body(b"abc", checksum=0))


@given(DATA, st.integers(0, 2**32 - 1))
def test_any_wrong_checksum_is_refused(data, checksum):
    if checksum == zlib.crc32(data):
        return
    with pytest.raises(MalformedMessage, match="data CRC-32"):
        decode_client_request(2, append_body(data, checksum=checksum))
    with pytest.raises(MalformedMessage, match="data CRC-32"):
        decode_server_response(7, data_response_body(data, checksum=checksum))


@given(DATA, st.integers(0, 255))
def test_a_flipped_data_byte_is_refused(data, xor):
    if not data or not xor:
        return
    good = append_body(data)
    at = 16 + 8 + 12 + 8  # first data byte
    bad = bytearray(good)
    bad[at] ^= xor
    with pytest.raises(MalformedMessage, match="data CRC-32"):
        decode_client_request(2, bytes(bad))


# --- enumerations and flags ---------------------------------------------------------------------


@pytest.mark.parametrize("code", [4, 5, 127, 255])
def test_unknown_mount_status(code):
    with pytest.raises(MalformedMessage, match=rf"^MountResponse: unknown status {code}$"):
        decode_server_response(1, REQ_BYTES + bytes([code]))


@pytest.mark.parametrize("code", [0, 11, 127, 255])
def test_unknown_error_code(code):
    with pytest.raises(MalformedMessage, match=rf"^ErrorResponse: unknown code {code}$"):
        decode_server_response(15, REQ_BYTES + bytes([code]) + b"\x00\x00")


@pytest.mark.parametrize("flag", [2, 0x7F, 0xFF])
def test_transaction_data_success_flag_must_be_0_or_1(flag):
    body = REQ_BYTES + struct.pack(">qB", 1, flag) + b"\x00\x00"
    with pytest.raises(
        MalformedMessage,
        match=rf"^TransactionDataResponse\.success: boolean must be 0 or 1, got {flag}$",
    ):
        decode_server_response(7, body)


# --- strings ------------------------------------------------------------------------------------

STRING_FIELDS = [
    (5, b"", "FeedSuspended.reason"),
    (15, b"\x01", "ErrorResponse.message"),
    (7, struct.pack(">qB", 1, 0), "TransactionDataResponse.error"),
]


@pytest.mark.parametrize(("message_type", "prefix", "field"), STRING_FIELDS)
def test_string_longer_than_its_bound(message_type, prefix, field):
    body = REQ_BYTES + prefix + struct.pack(">H", 4097) + b"a" * 4097
    with pytest.raises(
        MalformedMessage, match=rf"^{re.escape(field)}: string length 4097 exceeds 4096$"
    ):
        decode_server_response(message_type, body)


@pytest.mark.parametrize(("message_type", "prefix", "field"), STRING_FIELDS)
@pytest.mark.parametrize("raw", [b"\xff", b"\xc3", b"abc\xc3(", b"\xed\xa0\x80", b"\xc0\x80"])
def test_string_must_be_utf8(message_type, prefix, field, raw):
    body = REQ_BYTES + prefix + struct.pack(">H", len(raw)) + raw
    with pytest.raises(MalformedMessage, match=rf"^{re.escape(field)}: not valid UTF-8 \("):
        decode_server_response(message_type, body)


@pytest.mark.parametrize(("message_type", "prefix", "field"), STRING_FIELDS)
def test_string_length_past_the_frame(message_type, prefix, field):
    body = REQ_BYTES + prefix + struct.pack(">H", 10) + b"abc"
    with pytest.raises(
        MalformedMessage, match=rf"^{re.escape(field)}: needs 10 bytes at offset \d+, only 3 left$"
    ):
        decode_server_response(message_type, body)


# --- ReadRangeRequest limits --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "count", "size"),
    [
        (0, 0, 1),
        (0, 1, 0),
        (0, -1, 1),
        (0, 1, -1),
        (0, -(2**31), -(2**31)),
        (-1, 1, 1),
        (-(2**63), 1000, 1000),
    ],
)
def test_read_range_request_needs_a_start_and_positive_limits(start, count, size):
    body = REQ_BYTES + struct.pack(">qii", start, count, size)
    with pytest.raises(
        MalformedMessage,
        match=rf"^ReadRange: from {start}, max_records {count}, max_bytes {size}: "
        r"need from >= 0 and positive limits$",
    ):
        decode_client_request(13, body)


def test_read_range_request_smallest_valid_limits():
    body = REQ_BYTES + struct.pack(">qii", 0, 1, 1)
    assert decode_client_request(13, body) == ReadRangeRequest(REQ, 0, 1, 1)


# --- frame limits -------------------------------------------------------------------------------


def test_frame_limit_bounds_a_large_append():
    encoded = AppendRequest(REQ, data=b"x" * 2000).encode()
    with pytest.raises(FrameTooLarge, match=r"exceeds the maximum of 1000 bytes"):
        FrameDecoder(max_frame_bytes=1000).feed(encoded)
    assert len(FrameDecoder(max_frame_bytes=len(encoded) - 4).feed(encoded)) == 1


# --- fuzzing: only ProtocolError, ever ----------------------------------------------------------


@given(st.integers(0, 255), st.binary(max_size=200))
def test_random_bodies_only_raise_protocol_errors(message_type, body):
    for decoder in (decode_client_request, decode_server_response):
        with contextlib.suppress(ProtocolError):
            decoder(message_type, body)


@given(st.sampled_from(ALL_CLASSES), st.binary(max_size=200))
def test_random_bodies_after_a_valid_req_id_only_raise_protocol_errors(cls, rest):
    with contextlib.suppress(ProtocolError):
        decoder_for(cls)(cls.TYPE, REQ_BYTES + rest, 4096)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(ANY_MESSAGE, st.data())
def test_mutated_messages_only_raise_protocol_errors(message, data):
    body = bytearray(body_of(message))
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        op = data.draw(st.sampled_from(["flip", "cut", "insert", "int"]), label="op")
        at = data.draw(st.integers(0, len(body)), label="at")
        if op == "flip" and at < len(body):
            body[at] ^= data.draw(st.integers(1, 255), label="xor")
        elif op == "cut":
            del body[at : at + data.draw(st.integers(1, 40), label="n")]
        elif op == "insert":
            body[at:at] = data.draw(st.binary(min_size=1, max_size=8), label="bytes")
        else:  # overwrite with an interesting 32-bit value (counts, lengths, codes)
            value = data.draw(
                st.sampled_from([-1, 0, 1, 2, 0x7FFF, 0xFFFF, 2**31 - 1, -(2**31)]), label="value"
            )
            body[at : at + 4] = struct.pack(">i", value)
    try:
        decoded = decoder_for(type(message))(message.TYPE, bytes(body), 4096)
    except ProtocolError:
        return
    assert type(decoded) is type(message)
    assert decode(decoded.TYPE, body_of(decoded)) == decoded


@pytest.mark.parametrize(
    "message",
    [
        MountRequest(REQ, -2, 1),
        FeedRequest(REQ, -(2**63)),
        AppendRequest(REQ, -5, (), (), (), 0, b"x"),
    ],
)
def test_a_client_high_water_mark_below_minus_one_is_malformed(message):
    with pytest.raises(MalformedMessage, match=r"client_high_water_mark .* is below -1"):
        decode_client_request(*one_frame(message))


@given(ANY_MESSAGE)
def test_the_frame_in_parts_is_the_frame(message):
    """A range read's response is written as several buffers (its records not copied into
    the frame); joined, they are exactly the encoded frame."""
    parts = message.encode_parts()
    assert b"".join(parts) == message.encode()
    if isinstance(message, ReadRangeResponse):
        assert parts[-1] is message.records.buf


# --- protocol versions: commit times from version 3 on ------------------------------------------


def test_record_format_of_each_version():
    assert [record_format(v) for v in SERVER_PROTOCOL_VERSIONS] == [FORMAT_1, FORMAT_1, FORMAT_2]


@pytest.mark.parametrize("version", [0, 4, -1])
def test_a_version_this_build_does_not_speak_is_refused(version):
    with pytest.raises(
        ValueError,
        match=rf"^client protocol version {version} is not one this build speaks \(1\.\.3\)$",
    ):
        decode_server_response(
            ClientMessageType.FLUSH_RESPONSE, body_of(FlushResponse(REQ, 1)), version=version
        )


@pytest.mark.parametrize("version", [1, 2, 3])
@given(req_id=REQ_IDS, headers=st.lists(HEADERS, max_size=30))
def test_feed_rows_round_trip_in_each_version(version, req_id, headers):
    """Version 3 rows keep each commit time; a version 1 or 2 feed has none (every row's
    time is NO_TIMESTAMP), the rest of each row the same."""
    fmt = record_format(version)
    frame = one_frame(FeedData(req_id, tuple(headers), fmt))
    rows = decode_server_response(*frame, feed_rows=True, version=version)
    assert type(rows) is FeedRows and rows.fmt is fmt
    fields = [_fields(h) for h in headers]
    if version >= 3:
        assert list(rows.rows) == fields
    else:
        assert list(rows.rows) == [(*f[:6], NO_TIMESTAMP) for f in fields]
    assert all(len(row) == 7 for row in rows.rows)
    assert rows.encode() == FeedData(req_id, tuple(headers), fmt).encode()
    objects = decode_server_response(*frame, version=version)
    assert objects.headers == rows.headers
    assert [h.timestamp for h in objects.headers] == [r[6] for r in rows.rows]


def test_a_version_3_feed_keeps_its_times_and_a_version_2_feed_has_none():
    headers = (
        RecordHeader(5, REQ, 1, 1_700_000_000_001),
        RecordHeader(6, REQ, 2, 1_700_000_000_002),
    )
    v3 = decode_server_response(*one_frame(FeedData(REQ, headers)), feed_rows=True, version=3)
    assert [row[6] for row in v3.rows] == [1_700_000_000_001, 1_700_000_000_002]
    v2 = decode_server_response(
        *one_frame(FeedData(REQ, headers, FORMAT_1)), feed_rows=True, version=2
    )
    assert [row[6] for row in v2.rows] == [NO_TIMESTAMP, NO_TIMESTAMP]
    assert [row[:6] for row in v2.rows] == [row[:6] for row in v3.rows]


def test_a_version_3_feed_read_as_version_2_is_malformed():
    """The layouts differ in size: a decoder told the wrong version fails, it does not
    read garbage."""
    headers = (RecordHeader(5, REQ, 1, 7), RecordHeader(6, REQ, 2, 8))
    with pytest.raises(MalformedMessage, match=r"^FeedData: 16 unexpected trailing bytes$"):
        decode_server_response(*one_frame(FeedData(REQ, headers)), version=2)


@pytest.mark.parametrize("version", [1, 2, 3])
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(req_id=REQ_IDS, hwm=I64, records=st.lists(RECORDS, max_size=10))
def test_read_range_response_round_trips_in_each_version(version, req_id, hwm, records):
    """Version 3 carries format-2 records (with their times), 1 and 2 format-1 records
    (none): checked or not, the decoder reads the version's format."""
    fmt = record_format(version)
    batch = RecordBatch.from_records(records, fmt)
    frame = one_frame(ReadRangeResponse(req_id, hwm, batch))
    decoded = decode_server_response(*frame, version=version)
    assert decoded == ReadRangeResponse(req_id, hwm, batch)
    assert decoded.records.format is fmt
    got = list(decoded.records.records())
    assert [(r.transaction_id, r.req_id, r.header, r.data) for r in got] == [
        (r.transaction_id, r.req_id, r.header, r.data) for r in records
    ]
    expected_times = (
        [r.timestamp for r in records] if version >= 3 else [NO_TIMESTAMP] * len(records)
    )
    assert [r.timestamp for r in got] == expected_times == decoded.records.timestamps()
    unchecked = decode_server_response(*frame, check_records=False, version=version).records
    assert isinstance(unchecked, UncheckedRecords) and unchecked.format is fmt
    assert unchecked.check() == batch


def test_a_version_2_range_read_has_format_1_heads():
    records = [Record(10, ReqId(1, 2, 3, 4), 7, b"xy", 1_700_000_000_000)]
    batch = RecordBatch.from_records(records, FORMAT_1)
    body = body_of(ReadRangeResponse(REQ, 20, batch))
    assert body == REQ_BYTES + struct.pack(">qi", 20, 1) + wire_record(
        10, b"xy", req=(1, 2, 3, 4), header=7, time=False
    )
    (got,) = decode_server_response(14, body, version=2).records.records()
    assert got == Record(10, ReqId(1, 2, 3, 4), 7, b"xy")  # the time was not sent
    with pytest.raises(MalformedMessage):  # read as version 3, the heads do not fit
        decode_server_response(14, body, version=3)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(RECORDS, max_size=15))
def test_convert_moves_the_bytes_a_re_encoding_would_write(records):
    for source, target in ((FORMAT_2, FORMAT_1), (FORMAT_1, FORMAT_2)):
        batch = RecordBatch.from_records(records, source)
        moved = batch.convert(target)
        timed = target.version >= 2 and source.version >= 2
        again = [
            Record(r.transaction_id, r.req_id, r.header, r.data, r.timestamp if timed else -1)
            for r in records
        ]
        assert moved == RecordBatch.from_records(again, target)
        assert (
            moved.format is target and moved.spans == RecordBatch.from_records(again, target).spans
        )
        # and the result is a valid batch of that format
        assert RecordBatch.read(Reader(moved.buf), len(records), fmt=target) == moved
    same = RecordBatch.from_records(records)
    assert same.convert(FORMAT_2) is same


def test_convert_to_format_2_gives_every_record_no_timestamp():
    old = RecordBatch.from_records([Record(i, REQ, i, b"d" * i, 99) for i in range(4)], FORMAT_1)
    assert old.convert(FORMAT_2).timestamps() == [NO_TIMESTAMP] * 4


def test_records_in_relays_records_of_the_wanted_format_as_they_are():
    batch = RecordBatch.from_records([Record(1, REQ, 0, b"abc", 5)])
    unchecked = UncheckedRecords(batch.buf, 1, FORMAT_2)
    assert records_in(unchecked, FORMAT_2) is unchecked
    assert records_in(batch, FORMAT_2) is batch


def test_records_in_checks_and_converts_for_an_older_client():
    records = [Record(1, REQ, 0, b"abc", 5), Record(2, REQ, 1, b"", 6)]
    batch = RecordBatch.from_records(records)
    older = records_in(UncheckedRecords(batch.buf, 2, FORMAT_2), FORMAT_1)
    assert older == RecordBatch.from_records(records, FORMAT_1)
    assert records_in(batch, FORMAT_1) == older
    bad = bytearray(batch.buf)
    bad[-1] ^= 1  # the last record's CRC
    with pytest.raises(ChecksumMismatch, match=r"^transaction 2: data CRC-32"):
        records_in(UncheckedRecords(bytes(bad), 2, FORMAT_2), FORMAT_1)
