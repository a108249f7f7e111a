"""Server <-> storage messages: layouts, round trips through the frame decoder, validation,
in either record format: format 2 (records with their commit time: protocol version 3,
the default) and format 1 (without: versions 1 and 2, ``Limits(record_format=FORMAT_1)``).
"""

from __future__ import annotations

import contextlib
import random
import struct
import uuid
import zlib
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from waltz_client.wire.buffers import Reader, pack_string
from waltz_client.wire.errors import (
    ChecksumMismatch,
    MalformedMessage,
    ProtocolError,
    UnknownMessageType,
)
from waltz_client.wire.framing import FrameDecoder
from waltz_client.wire.records import (
    FORMAT_1,
    FORMAT_2,
    NO_TIMESTAMP,
    Record,
    RecordBatch,
    RecordFormat,
    RecordHeader,
    ReqId,
    UncheckedRecords,
)
from waltz_client.wire.storage_messages import (
    COMMIT_TIME_VERSION,
    DEFAULT_LIMITS,
    DEFAULT_MAX_LIST_RECORDS,
    MAX_ERROR_MESSAGE_BYTES,
    RETENTION_VERSION,
    STORAGE_PROTOCOL_VERSIONS,
    STORAGE_REQUESTS,
    STORAGE_RESPONSES,
    AppendRequest,
    FailureResponse,
    FindTimeRequest,
    FindTimeResponse,
    LastSessionInfoRequest,
    LastSessionInfoResponse,
    Limits,
    LogInfoRequest,
    LogInfoResponse,
    MaxTransactionIdRequest,
    MaxTransactionIdResponse,
    OpenRequest,
    RecordHeaderListRequest,
    RecordHeaderListResponse,
    RecordHeaderRequest,
    RecordHeaderResponse,
    RecordListRequest,
    RecordListResponse,
    RecordRequest,
    RecordResponse,
    SegmentStats,
    SetLogStartRequest,
    SetLowWaterMarkRequest,
    StorageError,
    StorageMessage,
    StorageMessageType,
    SuccessResponse,
    TruncateRequest,
    decode_request,
    decode_response,
    decode_unchecked_record_list,
    in_record_format,
    record_format,
)

I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
COUNT = st.integers(0, 2**31 - 1)
# Commit times: any i64, NO_TIMESTAMP (none known) often.
TIMES = st.one_of(st.just(NO_TIMESTAMP), st.integers(0, 2**45), I64)
DATA = st.one_of(
    st.binary(max_size=64),
    st.builds(lambda n, seed: random.Random(seed).randbytes(n), st.integers(0, 2048), I64),
)
REQ_IDS = st.builds(ReqId, I32, I32, I32, I32)
HEADERS = st.builds(RecordHeader, I64, REQ_IDS, I32, TIMES)
RECORDS = st.builds(Record, I64, REQ_IDS, I32, DATA, TIMES)
SEGMENTS = st.lists(st.builds(SegmentStats, I64, I32, I64, I64, TIMES), max_size=20).map(tuple)
BATCHES = st.lists(RECORDS, max_size=20).map(RecordBatch.from_records)
# Up to 1000 characters of at most 4 UTF-8 bytes each: always under the 4096-byte cap.
MESSAGES = st.text(max_size=1000)

FORMAT_1_LIMITS = Limits(record_format=FORMAT_1)  # a connection of protocol version 1 or 2
LIMITS = {1: FORMAT_1_LIMITS, 2: DEFAULT_LIMITS}  # by record format version
BOTH_FORMATS = pytest.mark.parametrize("fmt", [FORMAT_1, FORMAT_2], ids=["format1", "format2"])


def message_strategies(
    fmt: RecordFormat,
) -> dict[type[StorageMessage], st.SearchStrategy[StorageMessage]]:
    """A strategy for every message class, its records in record format ``fmt``. Format 1
    carries no commit time: its records, headers and segments have none (NO_TIMESTAMP),
    as decoding them gives."""
    timed = fmt.version >= 2
    headers = HEADERS if timed else HEADERS.map(lambda h: replace(h, timestamp=NO_TIMESTAMP))
    records = RECORDS if timed else RECORDS.map(lambda r: replace(r, timestamp=NO_TIMESTAMP))
    segments = SEGMENTS
    if not timed:
        segments = SEGMENTS.map(lambda t: tuple(replace(s, last_commit_ms=NO_TIMESTAMP) for s in t))
    batches = st.lists(records, max_size=20).map(lambda rs: RecordBatch.from_records(rs, fmt))
    return {
        OpenRequest: st.builds(OpenRequest, I64, I64, I32, st.uuids(), I32),
        LastSessionInfoRequest: st.builds(LastSessionInfoRequest, I64, I64, I32),
        MaxTransactionIdRequest: st.builds(MaxTransactionIdRequest, I64, I64, I32),
        TruncateRequest: st.builds(TruncateRequest, I64, I64, I32, I64),
        SetLowWaterMarkRequest: st.builds(SetLowWaterMarkRequest, I64, I64, I32, I64),
        LogInfoRequest: st.builds(LogInfoRequest, I64, I64, I32),
        SetLogStartRequest: st.builds(SetLogStartRequest, I64, I64, I32, st.integers(0, 2**63 - 1)),
        FindTimeRequest: st.builds(FindTimeRequest, I64, I64, I32, I64),
        LogInfoResponse: st.builds(
            LogInfoResponse, I64, I64, I32, I64, I64, segments, st.just(fmt)
        ),
        AppendRequest: st.builds(AppendRequest, I64, I64, I32, batches),
        RecordHeaderRequest: st.builds(RecordHeaderRequest, I64, I64, I32, I64),
        RecordRequest: st.builds(RecordRequest, I64, I64, I32, I64),
        RecordHeaderListRequest: st.builds(RecordHeaderListRequest, I64, I64, I32, I64, COUNT),
        RecordListRequest: st.builds(RecordListRequest, I64, I64, I32, I64, COUNT),
        SuccessResponse: st.builds(SuccessResponse, I64, I64, I32),
        FailureResponse: st.builds(
            FailureResponse, I64, I64, I32, st.sampled_from(StorageError), MESSAGES
        ),
        LastSessionInfoResponse: st.builds(LastSessionInfoResponse, I64, I64, I32, I64, I64, I64),
        MaxTransactionIdResponse: st.builds(MaxTransactionIdResponse, I64, I64, I32, I64),
        FindTimeResponse: st.builds(FindTimeResponse, I64, I64, I32, I64),
        RecordHeaderResponse: st.builds(RecordHeaderResponse, I64, I64, I32, headers, st.just(fmt)),
        RecordResponse: st.builds(RecordResponse, I64, I64, I32, records, st.just(fmt)),
        RecordHeaderListResponse: st.builds(
            RecordHeaderListResponse,
            I64,
            I64,
            I32,
            st.lists(headers, max_size=20).map(tuple),
            st.just(fmt),
        ),
        RecordListResponse: st.builds(RecordListResponse, I64, I64, I32, batches),
    }


MESSAGE_STRATEGIES = message_strategies(FORMAT_2)  # the default record format
STRATEGIES = {1: message_strategies(FORMAT_1), 2: MESSAGE_STRATEGIES}  # by format version
REQUEST_CLASSES = sorted(STORAGE_REQUESTS.values(), key=lambda c: c.TYPE)
RESPONSE_CLASSES = sorted(STORAGE_RESPONSES.values(), key=lambda c: c.TYPE)
ALL_CLASSES = REQUEST_CLASSES + RESPONSE_CLASSES
ANY_MESSAGE = st.one_of(*MESSAGE_STRATEGIES.values())
ANY_MESSAGE_IN = {v: st.one_of(*strategies.values()) for v, strategies in STRATEGIES.items()}


def decoder_for(cls):
    return decode_request if cls in REQUEST_CLASSES else decode_response


def decode(message_type: int, body: bytes, limits: Limits = DEFAULT_LIMITS) -> StorageMessage:
    if message_type in STORAGE_REQUESTS:
        return decode_request(message_type, body, limits)
    return decode_response(message_type, body, limits)


def split(stream: bytes, rnd, max_chunk: int) -> list[bytes]:
    chunks = []
    pos = 0
    while pos < len(stream):
        n = rnd.randint(1, max_chunk)
        chunks.append(stream[pos : pos + n])
        pos += n
    return chunks


def one_frame(message: StorageMessage) -> tuple[int, bytes]:
    (frame,) = FrameDecoder().feed(message.encode())
    return frame


def body_of(message: StorageMessage) -> bytes:
    return one_frame(message)[1]


def head(session=1, seq=2, partition=3) -> bytes:
    return struct.pack(">qqi", session, seq, partition)


TIME = 1_795_000_000_000  # a commit time, ms since the epoch


def wire_record(
    txid, data, length=None, crc=None, req=(0, 0, 0, 0), header=0, *, version=1, timestamp=TIME
) -> bytes:
    """A record built by hand: format 1, or with ``version=2`` format 2 (the commit time
    after the data length)."""
    timed = struct.pack(">q", timestamp) if version >= 2 else b""
    return (
        struct.pack(">qiiiiii", txid, *req, header, len(data) if length is None else length)
        + timed
        + data
        + struct.pack(">I", zlib.crc32(data) if crc is None else crc)
    )


def wire_header(txid, req, header, *, version=1, timestamp=TIME) -> bytes:
    """A record header built by hand: 28 bytes in format 1, 36 (+ the time) in format 2."""
    if version >= 2:
        return struct.pack(">qiiiiiq", txid, *req, header, timestamp)
    return struct.pack(">qiiiii", txid, *req, header)


def fields_of(req: ReqId) -> tuple[int, int, int, int]:
    return (req.client_id, req.generation, req.partition_id, req.seq)


def untimed(rec):
    """A record or header as format 1 carries it: without its commit time."""
    return replace(rec, timestamp=NO_TIMESTAMP)


CHUNK_SIZES = st.sampled_from([1, 2, 3, 5, 13, 100, 4096, 1 << 20])


# --- type codes and tables --------------------------------------------------------------------


def test_every_message_class_has_a_strategy():
    assert set(MESSAGE_STRATEGIES) == set(ALL_CLASSES)
    assert set(STRATEGIES[1]) == set(ALL_CLASSES)
    assert len(STORAGE_REQUESTS) == 13 and len(STORAGE_RESPONSES) == 10


def test_type_codes_follow_the_original():
    assert {t.name: t.value for t in StorageMessageType} == {
        "OPEN_REQUEST": 1,
        "LAST_SESSION_INFO_REQUEST": 2,
        "LAST_SESSION_INFO_RESPONSE": 3,
        "SET_LOW_WATER_MARK_REQUEST": 4,
        "TRUNCATE_REQUEST": 5,
        "APPEND_REQUEST": 6,
        "SUCCESS_RESPONSE": 7,
        "FAILURE_RESPONSE": 8,
        "RECORD_HEADER_REQUEST": 9,
        "RECORD_HEADER_RESPONSE": 10,
        "RECORD_REQUEST": 11,
        "RECORD_RESPONSE": 12,
        "MAX_TRANSACTION_ID_REQUEST": 13,
        "MAX_TRANSACTION_ID_RESPONSE": 14,
        "RECORD_HEADER_LIST_REQUEST": 15,
        "RECORD_HEADER_LIST_RESPONSE": 16,
        "RECORD_LIST_REQUEST": 17,
        "RECORD_LIST_RESPONSE": 18,
        "LOG_INFO_REQUEST": 19,
        "LOG_INFO_RESPONSE": 20,
        "SET_LOG_START_REQUEST": 21,
        "FIND_TIME_REQUEST": 22,
        "FIND_TIME_RESPONSE": 23,
    }
    assert {c.__name__: c.TYPE for c in REQUEST_CLASSES} == {
        "OpenRequest": 1,
        "LastSessionInfoRequest": 2,
        "SetLowWaterMarkRequest": 4,
        "TruncateRequest": 5,
        "AppendRequest": 6,
        "RecordHeaderRequest": 9,
        "RecordRequest": 11,
        "MaxTransactionIdRequest": 13,
        "RecordHeaderListRequest": 15,
        "RecordListRequest": 17,
        "LogInfoRequest": 19,
        "SetLogStartRequest": 21,
        "FindTimeRequest": 22,
    }
    assert {c.__name__: c.TYPE for c in RESPONSE_CLASSES} == {
        "LastSessionInfoResponse": 3,
        "SuccessResponse": 7,
        "FailureResponse": 8,
        "RecordHeaderResponse": 10,
        "RecordResponse": 12,
        "MaxTransactionIdResponse": 14,
        "RecordHeaderListResponse": 16,
        "RecordListResponse": 18,
        "LogInfoResponse": 20,
        "FindTimeResponse": 23,
    }


def test_storage_error_codes():
    assert {e.name: e.value for e in StorageError} == {
        "INTERNAL": 1,
        "MALFORMED_REQUEST": 2,
        "NOT_OPEN": 3,
        "CLUSTER_KEY_MISMATCH": 4,
        "PARTITION_COUNT_MISMATCH": 5,
        "PARTITION_NOT_FOUND": 6,
        "PARTITION_UNAVAILABLE": 7,
        "SESSION_FENCED": 8,
        "NON_CONTIGUOUS": 9,
        "TRANSACTION_NOT_FOUND": 10,
        "TRUNCATE_REFUSED": 11,
        "IO_ERROR": 12,
        "SESSION_UNKNOWN": 13,
    }


def test_constants():
    assert range(1, 4) == STORAGE_PROTOCOL_VERSIONS
    assert RETENTION_VERSION == 2
    assert COMMIT_TIME_VERSION == 3
    assert MAX_ERROR_MESSAGE_BYTES == 4096
    assert DEFAULT_MAX_LIST_RECORDS == 100_000
    assert Limits(16 * 1024 * 1024, 100_000, FORMAT_2) == DEFAULT_LIMITS
    assert DEFAULT_LIMITS.record_format is FORMAT_2


def test_the_record_format_of_each_protocol_version():
    # Versions 1 and 2 carry records without a commit time; 3 with one.
    assert {v: record_format(v).version for v in STORAGE_PROTOCOL_VERSIONS} == {1: 1, 2: 1, 3: 2}
    assert record_format(1) is FORMAT_1
    assert record_format(RETENTION_VERSION) is FORMAT_1
    assert record_format(COMMIT_TIME_VERSION) is FORMAT_2


# --- byte layouts (independent of the encoder) -------------------------------------------------


def test_truncate_request_bytes():
    assert TruncateRequest(7, 8, 9, 10).encode() == bytes.fromhex(
        "0000001d 05"  # length 29 = type byte + 20-byte header + i64
        "0000000000000007 0000000000000008 00000009"
        "000000000000000a"
    )


def test_success_response_bytes():
    assert SuccessResponse(-1, -1, -1).encode() == bytes.fromhex(
        "00000015 07 ffffffffffffffff ffffffffffffffff ffffffff"
    )


def test_open_request_bytes():
    key = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
    assert OpenRequest(-1, 5, -1, key, 16).encode() == bytes.fromhex(
        "00000029 01 ffffffffffffffff 0000000000000005 ffffffff"
        "00112233445566778899aabbccddeeff 00000010"
    )


def test_failure_response_bytes():
    assert FailureResponse(1, 2, 3, StorageError.SESSION_FENCED, "né").encode() == (
        bytes.fromhex("0000001c 08") + head(1, 2, 3) + bytes.fromhex("0008 0003 6ec3a9")
    )


def test_record_response_bytes():
    record = Record(1, ReqId(2, 3, 4, 5), 6, b"abc", TIME)
    assert RecordResponse(1, 2, 3, record).encode() == (
        struct.pack(">IB", 1 + 20 + 40 + 3 + 4, 12)
        + head(1, 2, 3)
        + bytes.fromhex(
            "0000000000000001 00000002 00000003 00000004 00000005 00000006 00000003"
            "000001a1ee565e00 616263 352441c2"  # the commit time after the length
        )
    )


def test_record_response_bytes_in_format_1():
    record = Record(1, ReqId(2, 3, 4, 5), 6, b"abc", TIME)
    assert RecordResponse(1, 2, 3, record, FORMAT_1).encode() == (
        struct.pack(">IB", 1 + 20 + 32 + 3 + 4, 12)
        + head(1, 2, 3)
        + bytes.fromhex(
            "0000000000000001 00000002 00000003 00000004 00000005 00000006 00000003616263 352441c2"
        )
    )


def test_find_time_bytes():
    assert FindTimeRequest(7, 8, 9, TIME).encode() == bytes.fromhex(
        "0000001d 16"  # length 29 = type byte + 20-byte header + i64; type 22
        "0000000000000007 0000000000000008 00000009"
        "000001a1ee565e00"
    )
    assert FindTimeResponse(7, 8, 9, 4711).encode() == bytes.fromhex(
        "0000001d 17"  # type 23
        "0000000000000007 0000000000000008 00000009"
        "0000000000001267"
    )


APPENDED = [
    Record(10, ReqId(1, 2, 3, 4), 7, b"xy", TIME),
    Record(11, ReqId(1, 2, 3, 5), 8, b"", NO_TIMESTAMP),
]
HEADERS_LISTED = (
    RecordHeader(5, ReqId(6, 7, 8, 9), 10, TIME),
    RecordHeader(6, ReqId(6, 7, 8, 10), 11, TIME + 1),
)
UNTIMED_HEADERS = tuple(untimed(h) for h in HEADERS_LISTED)

# (message, its fields after the common header, the record format it is decoded in)
LAYOUT_CASES = [
    (LastSessionInfoRequest(1, 2, 3), b"", FORMAT_2),
    (MaxTransactionIdRequest(1, 2, 3), b"", FORMAT_2),
    (SetLowWaterMarkRequest(1, 2, 3, -5), struct.pack(">q", -5), FORMAT_2),
    (LogInfoRequest(1, 2, 3), b"", FORMAT_2),
    (SetLogStartRequest(1, 2, 3, 4711), struct.pack(">q", 4711), FORMAT_2),
    (FindTimeRequest(1, 2, 3, TIME), struct.pack(">q", TIME), FORMAT_2),
    (FindTimeResponse(1, 2, 3, 4711), struct.pack(">q", 4711), FORMAT_2),
    (
        LogInfoResponse(
            1,
            2,
            3,
            100,
            250,
            (
                SegmentStats(0, 200, 8192, 1700000000000, TIME),
                SegmentStats(200, 0, 128, 1700000000001),
            ),
        ),
        struct.pack(">qqi", 100, 250, 2)
        + struct.pack(">qiqqq", 0, 200, 8192, 1700000000000, TIME)
        + struct.pack(">qiqqq", 200, 0, 128, 1700000000001, NO_TIMESTAMP),
        FORMAT_2,
    ),
    (
        LogInfoResponse(1, 2, 3, 100, 250, (SegmentStats(0, 200, 8192, 1700000000000),), FORMAT_1),
        struct.pack(">qqi", 100, 250, 1) + struct.pack(">qiqq", 0, 200, 8192, 1700000000000),
        FORMAT_1,
    ),
    (RecordHeaderRequest(1, 2, 3, 99), struct.pack(">q", 99), FORMAT_2),
    (RecordRequest(1, 2, 3, 99), struct.pack(">q", 99), FORMAT_2),
    (RecordHeaderListRequest(1, 2, 3, 99, 500), struct.pack(">qi", 99, 500), FORMAT_2),
    (RecordListRequest(1, 2, 3, 99, 500), struct.pack(">qi", 99, 500), FORMAT_2),
    (
        AppendRequest(1, 2, 3, RecordBatch.from_records(APPENDED)),
        struct.pack(">i", 2)
        + wire_record(10, b"xy", req=(1, 2, 3, 4), header=7, version=2, timestamp=TIME)
        + wire_record(11, b"", req=(1, 2, 3, 5), header=8, version=2, timestamp=NO_TIMESTAMP),
        FORMAT_2,
    ),
    (
        AppendRequest(
            1,
            2,
            3,
            RecordBatch.from_records([untimed(r) for r in APPENDED], FORMAT_1),
        ),
        struct.pack(">i", 2)
        + wire_record(10, b"xy", req=(1, 2, 3, 4), header=7)
        + wire_record(11, b"", req=(1, 2, 3, 5), header=8),
        FORMAT_1,
    ),
    (AppendRequest(1, 2, 3), struct.pack(">i", 0), FORMAT_2),
    (AppendRequest(1, 2, 3, RecordBatch(b"", [], FORMAT_1)), struct.pack(">i", 0), FORMAT_1),
    (LastSessionInfoResponse(1, 2, 3, 40, 30, 20), struct.pack(">qqq", 40, 30, 20), FORMAT_2),
    (MaxTransactionIdResponse(1, 2, 3, 77), struct.pack(">q", 77), FORMAT_2),
    (
        RecordHeaderResponse(1, 2, 3, HEADERS_LISTED[0]),
        struct.pack(">qiiiiiq", 5, 6, 7, 8, 9, 10, TIME),
        FORMAT_2,
    ),
    (
        RecordHeaderResponse(1, 2, 3, UNTIMED_HEADERS[0], FORMAT_1),
        struct.pack(">qiiiii", 5, 6, 7, 8, 9, 10),
        FORMAT_1,
    ),
    (
        RecordHeaderListResponse(1, 2, 3, HEADERS_LISTED),
        struct.pack(">i", 2)
        + struct.pack(">qiiiiiq", 5, 6, 7, 8, 9, 10, TIME)
        + struct.pack(">qiiiiiq", 6, 6, 7, 8, 10, 11, TIME + 1),
        FORMAT_2,
    ),
    (
        RecordHeaderListResponse(1, 2, 3, UNTIMED_HEADERS, FORMAT_1),
        struct.pack(">i", 2)
        + struct.pack(">qiiiii", 5, 6, 7, 8, 9, 10)
        + struct.pack(">qiiiii", 6, 6, 7, 8, 10, 11),
        FORMAT_1,
    ),
    (
        RecordResponse(1, 2, 3, Record(10, ReqId(1, 2, 3, 4), 7, b"data", TIME)),
        wire_record(10, b"data", req=(1, 2, 3, 4), header=7, version=2, timestamp=TIME),
        FORMAT_2,
    ),
    (
        RecordResponse(1, 2, 3, Record(10, ReqId(1, 2, 3, 4), 7, b"data"), FORMAT_1),
        wire_record(10, b"data", req=(1, 2, 3, 4), header=7),
        FORMAT_1,
    ),
    (
        RecordListResponse(
            1, 2, 3, RecordBatch.from_records([Record(10, ReqId(1, 2, 3, 4), 7, b"data", TIME)])
        ),
        struct.pack(">i", 1)
        + wire_record(10, b"data", req=(1, 2, 3, 4), header=7, version=2, timestamp=TIME),
        FORMAT_2,
    ),
    (
        RecordListResponse(
            1,
            2,
            3,
            RecordBatch.from_records([Record(10, ReqId(1, 2, 3, 4), 7, b"data")], FORMAT_1),
        ),
        struct.pack(">i", 1) + wire_record(10, b"data", req=(1, 2, 3, 4), header=7),
        FORMAT_1,
    ),
    (RecordListResponse(1, 2, 3), struct.pack(">i", 0), FORMAT_2),
    (FailureResponse(1, 2, 3), struct.pack(">HH", 1, 0), FORMAT_2),
]


@pytest.mark.parametrize(
    ("message", "fields", "fmt"),
    LAYOUT_CASES,
    ids=[f"{type(m).__name__}-format{f.version}" for m, _, f in LAYOUT_CASES],
)
def test_layout(message, fields, fmt):
    body = head(1, 2, 3) + fields
    assert message.encode() == struct.pack(">IB", len(body) + 1, message.TYPE) + body
    decoded = decode(message.TYPE, body, LIMITS[fmt.version])
    assert decoded == message
    if hasattr(decoded, "fmt"):
        assert decoded.fmt is fmt  # decoded in the connection's format, and says so
    if isinstance(decoded, AppendRequest | RecordListResponse):
        assert decoded.records.format is fmt


def test_log_info_carries_each_segments_last_commit_time_in_format_2_only():
    segments = (SegmentStats(0, 200, 8192, 1700000000000, TIME),)
    new = LogInfoResponse(1, 2, 3, 100, 250, segments)
    old = LogInfoResponse(1, 2, 3, 100, 250, segments, FORMAT_1)
    assert new.fmt is FORMAT_2  # the default
    assert len(body_of(new)) - len(body_of(old)) == 8
    assert body_of(new)[-8:] == struct.pack(">q", TIME)
    assert body_of(old) == body_of(new)[:-8]
    # Decoded in format 1, no commit time is known.
    decoded = decode_response(LogInfoResponse.TYPE, body_of(old), FORMAT_1_LIMITS)
    assert decoded.segments == (SegmentStats(0, 200, 8192, 1700000000000, NO_TIMESTAMP),)
    assert decode_response(LogInfoResponse.TYPE, body_of(new)).segments == segments
    # Each layout read as the other: 8 bytes short, or 8 over.
    with pytest.raises(MalformedMessage, match=r"^LogInfo.last_commit_ms: needs 8 bytes"):
        decode_response(LogInfoResponse.TYPE, body_of(old))
    with pytest.raises(MalformedMessage, match=r"^LogInfoResponse: 8 unexpected trailing bytes"):
        decode_response(LogInfoResponse.TYPE, body_of(new), FORMAT_1_LIMITS)


# --- round trips -----------------------------------------------------------------------------


@BOTH_FORMATS
@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), max_chunk=CHUNK_SIZES, rnd=st.randoms())
def test_round_trip_through_the_frame_decoder(fmt, cls, data, max_chunk, rnd):
    message = data.draw(STRATEGIES[fmt.version][cls], label="message")
    encoded = message.encode()
    decoder = FrameDecoder()
    frames = []
    for chunk in split(encoded, rnd, max_chunk):
        frames.extend(decoder.feed(chunk))
    assert decoder.buffered == 0
    assert len(frames) == 1
    message_type, body = frames[0]
    assert message_type == cls.TYPE
    decoded = decoder_for(cls)(message_type, body, LIMITS[fmt.version])
    assert type(decoded) is cls
    assert decoded == message
    assert decoded.encode() == encoded
    # The other direction's table does not accept it.
    other = decode_response if cls in REQUEST_CLASSES else decode_request
    with pytest.raises(UnknownMessageType):
        other(message_type, body)


@BOTH_FORMATS
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), max_chunk=CHUNK_SIZES, rnd=st.randoms())
def test_a_stream_of_messages_round_trips(fmt, data, max_chunk, rnd):
    messages = data.draw(st.lists(ANY_MESSAGE_IN[fmt.version], max_size=8), label="messages")
    stream = b"".join(m.encode() for m in messages)
    decoder = FrameDecoder()
    decoded = []
    limits = LIMITS[fmt.version]
    for chunk in split(stream, rnd, max_chunk):
        decoded.extend(decode(t, body, limits) for t, body in decoder.feed(chunk))
    assert decoded == messages
    assert decoder.buffered == 0


@BOTH_FORMATS
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(RECORDS, max_size=20), session=I64, seq=I64, partition=I32)
def test_append_batch_survives_the_round_trip(fmt, records, session, seq, partition):
    message = AppendRequest(session, seq, partition, RecordBatch.from_records(records, fmt))
    decoded = decode_request(*one_frame(message), LIMITS[fmt.version])
    assert isinstance(decoded, AppendRequest)
    assert decoded.records.format is fmt
    if fmt.version >= 2:
        assert list(decoded.records.records()) == records
        assert decoded.records.timestamps() == [rec.timestamp for rec in records]
    else:
        assert list(decoded.records.records()) == [untimed(rec) for rec in records]
    assert decoded.records.spans == message.records.spans
    assert len(decoded.records) == len(records)
    if records:
        assert decoded.records.first_txid == records[0].transaction_id
        assert decoded.records.last_txid == records[-1].transaction_id


@BOTH_FORMATS
@pytest.mark.parametrize("n", [20, 1000, DEFAULT_MAX_LIST_RECORDS])
def test_long_lists_round_trip(fmt, n):
    time = (lambda i: TIME + i) if fmt.version >= 2 else (lambda i: NO_TIMESTAMP)
    limits = LIMITS[fmt.version]
    headers = tuple(RecordHeader(i, ReqId(1, 2, 3, i), i % 7, time(i)) for i in range(n))
    message = RecordHeaderListResponse(1, 2, 3, headers, fmt)
    assert decode_response(*one_frame(message), limits) == message
    batch = RecordBatch.from_records(
        [Record(i, ReqId(1, 2, 3, i), 0, i.to_bytes(4, "big"), time(i)) for i in range(n)], fmt
    )
    for message in (AppendRequest(1, 2, 3, batch), RecordListResponse(1, 2, 3, batch)):
        decoded = decode(*one_frame(message), limits)
        assert decoded == message
        assert (decoded.records.first_txid, decoded.records.last_txid) == (0, n - 1)
        assert len(decoded.records) == n


@given(st.sampled_from(StorageError), st.text(), I64, I64, I32)
def test_failure_carries_every_error_and_any_text(error, text, session, seq, partition):
    decoded = decode_response(*one_frame(FailureResponse(session, seq, partition, error, text)))
    assert isinstance(decoded, FailureResponse)
    assert decoded.error is error
    encoded = text.encode("utf-8")
    if len(encoded) <= MAX_ERROR_MESSAGE_BYTES:
        assert decoded.message == text
    else:
        assert text.startswith(decoded.message)


@given(
    st.one_of(
        st.text(
            alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]),
            min_size=1000,
            max_size=5000,
        ),
        # Only 2- to 4-byte characters: always over the cap, cut inside a character often.
        st.text(
            alphabet=st.characters(min_codepoint=0x80, codec="utf-8", exclude_categories=["Cs"]),
            min_size=2049,
            max_size=3000,
        ),
    ),
    st.sampled_from(["", "a", "ab", "abc"]),
)
def test_failure_message_is_cut_to_4096_bytes_on_a_character_boundary(text, pad):
    text = pad + text
    decoded = decode_response(*one_frame(FailureResponse(1, 2, 3, StorageError.INTERNAL, text)))
    raw = text.encode("utf-8")
    cut = decoded.message.encode("utf-8")
    assert len(cut) <= MAX_ERROR_MESSAGE_BYTES
    assert text.startswith(decoded.message)
    if len(raw) <= MAX_ERROR_MESSAGE_BYTES:
        assert decoded.message == text
    else:
        # As many whole characters as fit: adding the next one would not.
        assert len(cut) > MAX_ERROR_MESSAGE_BYTES - 4
        next_char = text[len(decoded.message)]
        assert len(cut) + len(next_char.encode("utf-8")) > MAX_ERROR_MESSAGE_BYTES


@pytest.mark.parametrize(
    ("text", "expected_bytes"),
    [
        ("a" * 4096, 4096),
        ("a" * 4097, 4096),
        ("a" * 4095 + "é", 4095),  # é is 2 bytes: it would end at 4097
        ("a" * 4094 + "é", 4096),
        ("a" * 4094 + "€", 4094),  # € is 3 bytes
        ("a" * 4093 + "😀", 4093),  # 4-byte character straddling the cut
        ("a" * 4092 + "😀", 4096),
        ("😀" * 2000, 4096),
    ],
)
def test_failure_message_truncation_edges(text, expected_bytes):
    decoded = decode_response(*one_frame(FailureResponse(1, 2, 3, StorageError.INTERNAL, text)))
    assert len(decoded.message.encode("utf-8")) == expected_bytes
    assert text.startswith(decoded.message)


def test_failure_message_with_a_lone_surrogate_still_encodes():
    message = FailureResponse(1, 2, 3, StorageError.IO_ERROR, "cannot open /data/\udcff")
    decoded = decode_response(*one_frame(message))
    assert decoded.message == "cannot open /data/\\udcff"


# --- pack_string / Reader ----------------------------------------------------------------


def test_pack_string_layout():
    assert pack_string("") == b"\x00\x00"
    assert pack_string("héllo") == b"\x00\x06h\xc3\xa9llo"
    assert pack_string("abcdef", maximum=4) == b"\x00\x04abcd"
    assert pack_string("aé", maximum=2) == b"\x00\x01a"


@given(st.text(), st.integers(0, 300))
def test_pack_string_round_trips_within_its_bound(text, maximum):
    packed = pack_string(text, maximum)
    r = Reader(packed)
    decoded = r.string("s", maximum)
    assert r.remaining == 0
    assert text.startswith(decoded)
    assert len(decoded.encode("utf-8")) <= maximum


def test_reader_bool():
    r = Reader(b"\x00\x01\x02")
    assert r.bool("a") is False
    assert r.bool("b") is True
    with pytest.raises(MalformedMessage, match=r"flag: boolean must be 0 or 1, got 2"):
        r.bool("flag")


@pytest.mark.parametrize("value", [2, 0x7F, 0xFF])
def test_reader_rejects_any_bool_but_0_or_1(value):
    with pytest.raises(MalformedMessage, match=rf"ready: boolean must be 0 or 1, got {value}"):
        Reader(bytes([value])).bool("ready")


def test_reader_overrun_names_the_field():
    r = Reader(b"\x00\x01\x02")
    with pytest.raises(MalformedMessage, match=r"big: needs 8 bytes at offset 0, only 3 left"):
        r.i64("big")


def test_reader_count_bounds():
    assert Reader(struct.pack(">i", 5)).count("n", 5) == 5
    with pytest.raises(MalformedMessage, match=r"n: count 6 is outside 0\.\.5"):
        Reader(struct.pack(">i", 6)).count("n", 5)
    with pytest.raises(MalformedMessage, match=r"n: count -1 is outside 0\.\.5"):
        Reader(struct.pack(">i", -1)).count("n", 5)


def test_reader_expect_end():
    r = Reader(b"abc")
    r.raw(1, "x")
    with pytest.raises(MalformedMessage, match=r"Thing: 2 unexpected trailing bytes"):
        r.expect_end("Thing")


# --- malformed messages ------------------------------------------------------------------------


@pytest.mark.parametrize("message_type", [0, 24, 100, 255])
def test_unknown_message_type(message_type):
    with pytest.raises(
        UnknownMessageType, match=rf"message type {message_type} is not a storage request"
    ):
        decode_request(message_type, head())
    with pytest.raises(
        UnknownMessageType, match=rf"message type {message_type} is not a storage response"
    ):
        decode_response(message_type, head())


@pytest.mark.parametrize("cls", RESPONSE_CLASSES, ids=lambda c: c.__name__)
def test_a_response_type_is_not_a_request(cls):
    with pytest.raises(UnknownMessageType, match=rf"message type {cls.TYPE} is not a storage req"):
        decode_request(cls.TYPE, head())


@pytest.mark.parametrize("cls", REQUEST_CLASSES, ids=lambda c: c.__name__)
def test_a_request_type_is_not_a_response(cls):
    with pytest.raises(UnknownMessageType, match=rf"message type {cls.TYPE} is not a storage res"):
        decode_response(cls.TYPE, head())


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    ("cut", "field"),
    [(0, "session id"), (7, "session id"), (8, "sequence number"), (19, "partition id")],
)
def test_body_shorter_than_the_common_header(cls, cut, field):
    with pytest.raises(MalformedMessage, match=rf"^{field}: needs \d bytes at offset"):
        decoder_for(cls)(cls.TYPE, head()[:cut])


FIXED_FIELD_CASES = [
    (OpenRequest, "Open.cluster_key"),
    (TruncateRequest, "Truncate.transaction_id"),
    (SetLowWaterMarkRequest, "SetLowWaterMark.low_water_mark"),
    (SetLogStartRequest, "SetLogStart.log_start"),
    (FindTimeRequest, "FindTime.timestamp"),
    (AppendRequest, "Append.record count"),
    (RecordHeaderRequest, "RecordHeaderRequest.transaction_id"),
    (RecordRequest, "RecordRequest.transaction_id"),
    (RecordHeaderListRequest, "RecordHeaderListRequest.transaction_id"),
    (RecordListRequest, "RecordListRequest.transaction_id"),
    (FailureResponse, "Failure.error"),
    (LastSessionInfoResponse, "LastSessionInfo.last_session_id"),
    (MaxTransactionIdResponse, "MaxTransactionId.transaction_id"),
    (FindTimeResponse, "FindTime.transaction_id"),
    (LogInfoResponse, "LogInfo.log_start"),
    (RecordHeaderResponse, "RecordHeader.transaction_id"),
    (RecordResponse, "Record.transaction_id"),
    (RecordHeaderListResponse, "RecordHeaderList.count"),
    (RecordListResponse, "RecordList.count"),
]


@pytest.mark.parametrize(
    ("cls", "field"), FIXED_FIELD_CASES, ids=lambda x: getattr(x, "__name__", x)
)
def test_body_with_only_the_header_names_the_missing_field(cls, field):
    with pytest.raises(MalformedMessage, match=rf"^{field}: needs \d+ bytes at offset 20, only 0"):
        decoder_for(cls)(cls.TYPE, head())


@BOTH_FORMATS
@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_strict_prefix_of_a_body_is_malformed(fmt, cls, data):
    body = body_of(data.draw(STRATEGIES[fmt.version][cls], label="message"))
    cut = data.draw(st.integers(0, len(body) - 1), label="cut")
    with pytest.raises(MalformedMessage, match=r"needs \d+ bytes|truncated head|runs past"):
        decoder_for(cls)(cls.TYPE, body[:cut], LIMITS[fmt.version])


@BOTH_FORMATS
@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), extra=st.binary(min_size=1, max_size=64))
def test_trailing_bytes_are_malformed(fmt, cls, data, extra):
    body = body_of(data.draw(STRATEGIES[fmt.version][cls], label="message"))
    if cls in (AppendRequest, RecordListResponse):
        expected = rf"^record list: {len(extra)} trailing bytes after \d+ records"
    else:
        expected = rf"^{cls.__name__}: {len(extra)} unexpected trailing bytes"
    with pytest.raises(MalformedMessage, match=expected):
        decoder_for(cls)(cls.TYPE, body + extra, LIMITS[fmt.version])


COUNTED = [
    (AppendRequest, "Append.record count"),
    (RecordHeaderListResponse, "RecordHeaderList.count"),
    (RecordListResponse, "RecordList.count"),
]


@pytest.mark.parametrize(("cls", "field"), COUNTED, ids=lambda x: getattr(x, "__name__", x))
@pytest.mark.parametrize("count", [-1, -(2**31), 100_001, 2**31 - 1])
def test_counts_outside_the_default_limit(cls, field, count):
    body = head() + struct.pack(">i", count)
    with pytest.raises(MalformedMessage, match=rf"^{field}: count {count} is outside 0\.\.100000"):
        decoder_for(cls)(cls.TYPE, body)


@BOTH_FORMATS
@pytest.mark.parametrize(("cls", "field"), COUNTED, ids=lambda x: getattr(x, "__name__", x))
def test_counts_are_bounded_by_limits(fmt, cls, field):
    limits = Limits(max_list_records=2, record_format=fmt)
    two = RecordBatch.from_records([Record(i, ReqId(0, 0, 0, 0), 0, b"") for i in (1, 2)], fmt)
    ok = {
        AppendRequest: AppendRequest(1, 2, 3, two),
        RecordListResponse: RecordListResponse(1, 2, 3, two),
        RecordHeaderListResponse: RecordHeaderListResponse(
            1, 2, 3, tuple(RecordHeader(i, ReqId(0, 0, 0, 0), 0) for i in (1, 2)), fmt
        ),
    }[cls]
    assert decoder_for(cls)(cls.TYPE, body_of(ok), limits) == ok
    with pytest.raises(MalformedMessage, match=rf"^{field}: count 3 is outside 0\.\.2"):
        decoder_for(cls)(cls.TYPE, head() + struct.pack(">i", 3), limits)


@pytest.mark.parametrize(
    ("cls", "field"),
    [
        (RecordHeaderListRequest, "RecordHeaderListRequest.max_records"),
        (RecordListRequest, "RecordListRequest.max_records"),
    ],
    ids=lambda x: getattr(x, "__name__", x),
)
@pytest.mark.parametrize("max_records", [-1, -(2**31)])
def test_negative_max_records_is_malformed(cls, field, max_records):
    body = head() + struct.pack(">qi", 0, max_records)
    with pytest.raises(
        MalformedMessage, match=rf"^{field}: count {max_records} is outside 0\.\.2147483647"
    ):
        decode_request(cls.TYPE, body)
    # max_records is a request parameter, not an allocation: no Limits bound applies.
    ok = decode_request(cls.TYPE, head() + struct.pack(">qi", 0, 2**31 - 1), Limits(1, 1))
    assert ok.max_records == 2**31 - 1


@BOTH_FORMATS
def test_record_header_list_with_fewer_headers_than_counted(fmt):
    one = wire_header(1, (0, 0, 0, 0), 0, version=fmt.version)
    body = head() + struct.pack(">i", 2) + one
    at = 20 + 4 + len(one)  # where the missing second header would start
    with pytest.raises(
        MalformedMessage, match=rf"^RecordHeader.transaction_id: needs 8 bytes at offset {at},"
    ):
        decode_response(StorageMessageType.RECORD_HEADER_LIST_RESPONSE, body, LIMITS[fmt.version])


@pytest.mark.parametrize("cls", [RecordHeaderResponse, RecordHeaderListResponse])
def test_a_format_1_header_read_in_format_2_is_short_of_its_commit_time(cls):
    count = struct.pack(">i", 1) if cls is RecordHeaderListResponse else b""
    body = head() + count + wire_header(1, (0, 0, 0, 0), 0, version=1)
    at = 20 + len(count) + 28
    with pytest.raises(
        MalformedMessage, match=rf"^RecordHeader.timestamp: needs 8 bytes at offset {at}, only 0"
    ):
        decode_response(cls.TYPE, body)
    assert decode_response(cls.TYPE, body, FORMAT_1_LIMITS).fmt is FORMAT_1


BATCHED = [
    (AppendRequest, decode_request),
    (RecordListResponse, decode_response),
]


@BOTH_FORMATS
@pytest.mark.parametrize(("cls", "decoder"), BATCHED, ids=lambda x: getattr(x, "__name__", x))
@pytest.mark.parametrize("length", [-1, -(2**31)])
def test_batch_negative_data_length(fmt, cls, decoder, length):
    body = head() + struct.pack(">i", 1) + wire_record(44, b"", length=length, version=fmt.version)
    with pytest.raises(
        MalformedMessage,
        match=rf"^record 0 \(transaction 44\): data length {length} is outside 0\.\.16777216",
    ):
        decoder(cls.TYPE, body, LIMITS[fmt.version])


@BOTH_FORMATS
@pytest.mark.parametrize(("cls", "decoder"), BATCHED, ids=lambda x: getattr(x, "__name__", x))
def test_batch_data_length_bounded_by_limits(fmt, cls, decoder):
    body = head() + struct.pack(">i", 1) + wire_record(44, b"12345", version=fmt.version)
    decoded = decoder(cls.TYPE, body, Limits(max_data_bytes=5, record_format=fmt))
    assert len(decoded.records) == 1 and decoded.records.format is fmt
    with pytest.raises(
        MalformedMessage, match=r"^record 0 \(transaction 44\): data length 5 is outside 0\.\.4"
    ):
        decoder(cls.TYPE, body, Limits(max_data_bytes=4, record_format=fmt))


@BOTH_FORMATS
@pytest.mark.parametrize(("cls", "decoder"), BATCHED, ids=lambda x: getattr(x, "__name__", x))
def test_batch_data_length_running_past_the_frame(fmt, cls, decoder):
    body = (
        head() + struct.pack(">i", 1) + wire_record(44, b"abc", length=1 << 20, version=fmt.version)
    )
    with pytest.raises(
        MalformedMessage, match=r"^record 0 \(transaction 44\): data length 1048576 runs past"
    ):
        decoder(cls.TYPE, body, LIMITS[fmt.version])


@BOTH_FORMATS
@pytest.mark.parametrize(("cls", "decoder"), BATCHED, ids=lambda x: getattr(x, "__name__", x))
def test_batch_bad_checksum(fmt, cls, decoder):
    body = (
        head()
        + struct.pack(">i", 2)
        + wire_record(1, b"fine", version=fmt.version)
        + wire_record(2, b"abc", crc=0x352441C3, version=fmt.version)
    )
    with pytest.raises(
        ChecksumMismatch, match=r"^transaction 2: data CRC-32 0x352441c2 != sent 0x352441c3"
    ):
        decoder(cls.TYPE, body, LIMITS[fmt.version])


@BOTH_FORMATS
def test_record_response_negative_data_length(fmt):
    body = head() + wire_record(44, b"", length=-1, version=fmt.version)
    with pytest.raises(MalformedMessage, match=r"^Record.data length -1 is outside 0\.\.16777216"):
        decode_response(StorageMessageType.RECORD_RESPONSE, body, LIMITS[fmt.version])


@BOTH_FORMATS
def test_record_response_data_length_bounded_by_limits(fmt):
    body = head() + wire_record(44, b"12345", version=fmt.version)
    decoded = decode_response(
        StorageMessageType.RECORD_RESPONSE, body, Limits(5, record_format=fmt)
    )
    assert decoded.record.data == b"12345"
    assert decoded.fmt is fmt
    with pytest.raises(MalformedMessage, match=r"^Record.data length 5 is outside 0\.\.4"):
        decode_response(StorageMessageType.RECORD_RESPONSE, body, Limits(4, record_format=fmt))


@BOTH_FORMATS
def test_record_response_data_running_past_the_frame(fmt):
    body = head() + wire_record(44, b"abc", length=4096, version=fmt.version)
    at = 20 + fmt.head_size  # the data starts after the common header and the record's head
    assert at == {1: 52, 2: 60}[fmt.version]
    with pytest.raises(MalformedMessage, match=rf"^Record.data: needs 4096 bytes at offset {at}"):
        decode_response(StorageMessageType.RECORD_RESPONSE, body, LIMITS[fmt.version])


@BOTH_FORMATS
def test_record_response_bad_checksum(fmt):
    body = head() + wire_record(44, b"abc", crc=0, version=fmt.version)
    with pytest.raises(
        ChecksumMismatch, match=r"^transaction 44: data CRC-32 0x352441c2 != sent 0x00000000"
    ):
        decode_response(StorageMessageType.RECORD_RESPONSE, body, LIMITS[fmt.version])


@pytest.mark.parametrize(
    "raw", [b"\xff", b"\xc3", b"abc\xc3(", b"\xed\xa0\x80", b"\xc0\x80", b"\xf4\x90\x80\x80"]
)
def test_failure_message_must_be_utf8(raw):
    body = head() + struct.pack(">HH", 1, len(raw)) + raw
    with pytest.raises(MalformedMessage, match=r"^Failure.message: not valid UTF-8 \("):
        decode_response(StorageMessageType.FAILURE_RESPONSE, body)


def test_failure_message_longer_than_its_bound():
    body = head() + struct.pack(">HH", 1, 4097) + b"a" * 4097
    with pytest.raises(
        MalformedMessage, match=r"^Failure.message: string length 4097 exceeds 4096"
    ):
        decode_response(StorageMessageType.FAILURE_RESPONSE, body)


def test_failure_message_length_past_the_frame():
    body = head() + struct.pack(">HH", 1, 10) + b"abc"
    with pytest.raises(MalformedMessage, match=r"^Failure.message: needs 10 bytes .* only 3 left"):
        decode_response(StorageMessageType.FAILURE_RESPONSE, body)


@pytest.mark.parametrize("code", [0, 14, 0x7FFF, 0xFFFF])
def test_failure_with_unknown_error_code(code):
    body = head() + struct.pack(">HH", code, 0)
    with pytest.raises(MalformedMessage, match=rf"^Failure.error: unknown error type {code}$"):
        decode_response(StorageMessageType.FAILURE_RESPONSE, body)


def test_frame_limit_bounds_a_large_append():
    records = [Record(i, ReqId(0, 0, 0, 0), 0, b"x" * 100) for i in range(10)]
    encoded = AppendRequest(1, 2, 3, RecordBatch.from_records(records)).encode()
    with pytest.raises(ProtocolError, match=r"exceeds the maximum of 1000 bytes"):
        FrameDecoder(max_frame_bytes=1000).feed(encoded)
    assert len(FrameDecoder(max_frame_bytes=len(encoded) - 4).feed(encoded)) == 1


# --- older peers: in_record_format, unchecked record lists ---------------------------------

# The messages that hold records, headers or segment stats: their layout depends on the
# record format (version 3 carries commit times, versions 1 and 2 do not).
RECORD_CARRIERS = [
    AppendRequest,
    RecordHeaderResponse,
    RecordResponse,
    RecordHeaderListResponse,
    RecordListResponse,
    LogInfoResponse,
]


def old_record(rec: Record) -> bytes:
    return wire_record(rec.transaction_id, rec.data, req=fields_of(rec.req_id), header=rec.header)


def old_header(h: RecordHeader) -> bytes:
    return wire_header(h.transaction_id, fields_of(h.req_id), h.header)


def a_message_and_its_old_layout(cls, ids, data):
    """A message of ``cls`` in format 2 (with commit times); the fields after the common
    header that a peer of protocol version 2 sends and expects for it (format 1, built by
    hand); and the message as those fields read back in format 2 (no commit times)."""
    if cls in (AppendRequest, RecordListResponse):
        records = data.draw(st.lists(RECORDS, max_size=10), label="records")
        old = struct.pack(">i", len(records)) + b"".join(old_record(r) for r in records)
        back = RecordBatch.from_records([untimed(r) for r in records])
        return cls(*ids, RecordBatch.from_records(records)), old, cls(*ids, back)
    if cls is RecordResponse:
        rec = data.draw(RECORDS, label="record")
        return cls(*ids, rec), old_record(rec), cls(*ids, untimed(rec))
    if cls is RecordHeaderResponse:
        header = data.draw(HEADERS, label="header")
        return cls(*ids, header), old_header(header), cls(*ids, untimed(header))
    if cls is RecordHeaderListResponse:
        headers = tuple(data.draw(st.lists(HEADERS, max_size=10), label="headers"))
        old = struct.pack(">i", len(headers)) + b"".join(old_header(h) for h in headers)
        return cls(*ids, headers), old, cls(*ids, tuple(untimed(h) for h in headers))
    assert cls is LogInfoResponse
    log_start, max_txid = data.draw(I64, label="log start"), data.draw(I64, label="max txid")
    segments = data.draw(SEGMENTS, label="segments")
    old = struct.pack(">qqi", log_start, max_txid, len(segments)) + b"".join(
        struct.pack(">qiqq", s.first_txid, s.records, s.size_bytes, s.modified_ms) for s in segments
    )
    back = tuple(replace(s, last_commit_ms=NO_TIMESTAMP) for s in segments)
    return (
        cls(*ids, log_start, max_txid, segments),
        old,
        cls(*ids, log_start, max_txid, back),
    )


@pytest.mark.parametrize("cls", RECORD_CARRIERS, ids=lambda c: c.__name__)
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), ids=st.tuples(I64, I64, I32))
def test_in_record_format_1_is_what_a_version_2_peer_expects(cls, data, ids):
    message, old_fields, back = a_message_and_its_old_layout(cls, ids, data)
    assert in_record_format(message, FORMAT_2) is message  # in that format already
    old = in_record_format(message, FORMAT_1)
    assert type(old) is cls
    assert (old.session_id, old.seq, old.partition_id) == ids
    body = head(*ids) + old_fields
    assert old.encode() == struct.pack(">IB", len(body) + 1, cls.TYPE) + body
    assert in_record_format(old, FORMAT_1) is old
    # What a connection of version 1 or 2 reads from the older peer, converted back for
    # the callers (StorageClient): the same records, their commit times unknown.
    decoded = decode(cls.TYPE, body, FORMAT_1_LIMITS)
    assert decoded.encode() == old.encode()
    again = in_record_format(decoded, FORMAT_2)
    assert again == back
    assert again.encode() == back.encode()
    assert decode(cls.TYPE, body_of(again)) == back


def test_an_append_to_an_older_node_drops_the_commit_times():
    batch = RecordBatch.from_records(APPENDED)  # format 2, the first with a commit time
    old = in_record_format(AppendRequest(1, 2, 3, batch), FORMAT_1)
    assert old.records.format is FORMAT_1
    assert body_of(old) == (
        head()
        + struct.pack(">i", 2)
        + wire_record(10, b"xy", req=(1, 2, 3, 4), header=7)
        + wire_record(11, b"", req=(1, 2, 3, 5), header=8)
    )
    assert batch.format is FORMAT_2 and batch.timestamps() == [TIME, NO_TIMESTAMP]  # kept
    decoded = decode_request(AppendRequest.TYPE, body_of(old), FORMAT_1_LIMITS)
    assert list(in_record_format(decoded, FORMAT_2).records.records()) == [
        untimed(rec) for rec in APPENDED
    ]


@pytest.mark.parametrize("cls", RECORD_CARRIERS, ids=lambda c: c.__name__)
def test_in_record_format_of_format_1_messages_to_format_2(cls):
    """What a StorageClient does to every response of an older node (and only then)."""
    message = {
        AppendRequest: AppendRequest(1, 2, 3, RecordBatch.from_records(APPENDED, FORMAT_1)),
        RecordListResponse: RecordListResponse(
            1, 2, 3, RecordBatch.from_records(APPENDED, FORMAT_1)
        ),
        RecordResponse: RecordResponse(1, 2, 3, untimed(APPENDED[0]), FORMAT_1),
        RecordHeaderResponse: RecordHeaderResponse(1, 2, 3, UNTIMED_HEADERS[0], FORMAT_1),
        RecordHeaderListResponse: RecordHeaderListResponse(1, 2, 3, UNTIMED_HEADERS, FORMAT_1),
        LogInfoResponse: LogInfoResponse(1, 2, 3, 0, 9, (SegmentStats(0, 10, 99, 5),), FORMAT_1),
    }[cls]
    new = in_record_format(message, FORMAT_2)
    carried = getattr(new, "fmt", None) or new.records.format
    assert carried is FORMAT_2
    body = body_of(new)
    assert len(body) > len(body_of(message))  # the commit times take room
    # No time was known: each reads back as NO_TIMESTAMP.
    decoded = decode(cls.TYPE, body)
    assert decoded == new
    assert in_record_format(decoded, FORMAT_1).encode() == message.encode()


@BOTH_FORMATS
@given(data=st.data())
def test_in_record_format_leaves_what_needs_no_conversion(fmt, data):
    # A message already in the format, or holding no records: the message itself.
    cls = data.draw(st.sampled_from(ALL_CLASSES), label="class")
    message = data.draw(STRATEGIES[fmt.version][cls], label="message")
    assert in_record_format(message, fmt) is message
    if cls not in RECORD_CARRIERS:
        other = FORMAT_2 if fmt is FORMAT_1 else FORMAT_1
        assert in_record_format(message, other) is message


@BOTH_FORMATS
def test_an_unchecked_record_list_is_in_the_connections_format(fmt):
    batch = RecordBatch.from_records(
        APPENDED if fmt.version >= 2 else [untimed(r) for r in APPENDED], fmt
    )
    body = body_of(RecordListResponse(1, 2, 3, batch))
    message = decode_unchecked_record_list(body, LIMITS[fmt.version])
    assert isinstance(message, RecordListResponse)
    assert (message.session_id, message.seq, message.partition_id) == (1, 2, 3)
    unchecked = message.records
    assert isinstance(unchecked, UncheckedRecords)
    assert unchecked.format is fmt
    assert (len(unchecked), unchecked.first_txid, unchecked.last_txid) == (2, 10, 11)
    assert bytes(unchecked.buf) == batch.buf
    assert unchecked.check() == batch
    # Relayed as they are: their receiver checks them, in this format.
    other = FORMAT_2 if fmt is FORMAT_1 else FORMAT_1
    assert in_record_format(message, other) is message


def test_an_unchecked_record_list_is_in_format_2_by_default():
    batch = RecordBatch.from_records(APPENDED)
    message = decode_unchecked_record_list(body_of(RecordListResponse(1, 2, 3, batch)))
    assert message.records.format is FORMAT_2
    assert message.records.check() == batch


# --- fuzzing: only ProtocolError, ever ----------------------------------------------------------


@given(st.integers(0, 255), st.binary(max_size=200))
def test_random_bodies_only_raise_protocol_errors(message_type, body):
    for decoder in (decode_request, decode_response):
        with contextlib.suppress(ProtocolError):
            decoder(message_type, body)


@BOTH_FORMATS
@given(cls=st.sampled_from(ALL_CLASSES), rest=st.binary(max_size=200))
def test_random_bodies_after_a_valid_header_only_raise_protocol_errors(fmt, cls, rest):
    with contextlib.suppress(ProtocolError):
        decoder_for(cls)(cls.TYPE, head() + rest, Limits(4096, 64, fmt))


@BOTH_FORMATS
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_messages_only_raise_protocol_errors(fmt, data):
    message = data.draw(ANY_MESSAGE_IN[fmt.version], label="message")
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
        decoded = decoder_for(type(message))(message.TYPE, bytes(body), Limits(4096, 64, fmt))
    except ProtocolError:
        return
    assert type(decoded) is type(message)
    assert decode(decoded.TYPE, body_of(decoded), LIMITS[fmt.version]) == decoded


@BOTH_FORMATS
@given(chunks=st.lists(st.binary(min_size=1, max_size=100), max_size=10))
def test_random_streams_only_raise_protocol_errors(fmt, chunks):
    decoder = FrameDecoder(max_frame_bytes=512)
    with contextlib.suppress(ProtocolError):
        for chunk in chunks:
            for message_type, body in decoder.feed(chunk):
                decode(message_type, body, LIMITS[fmt.version])


@given(st.one_of(ANY_MESSAGE, ANY_MESSAGE_IN[1]))
def test_the_frame_in_parts_is_the_frame(message):
    """Responses carrying records are written as several buffers (the records not copied
    into the frame); joined, they are exactly the encoded frame."""
    parts = message.encode_parts()
    assert b"".join(parts) == message.encode()
    if isinstance(message, RecordListResponse):
        assert parts[-1] is message.records.buf
