"""Server <-> storage messages (the spec's "Waltz Storage" request/response pairs).

Every message starts with the same three fields::

    i64 session id | i64 sequence number | i32 partition id

Requests go server -> storage and responses come back with the request's
sequence number. Type codes follow the original implementation.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import ClassVar, Self

from .buffers import Reader, pack_string
from .errors import MalformedMessage, UnknownMessageType
from .framing import encode_frame, frame_parts
from .records import (
    DEFAULT_FORMAT,
    DEFAULT_MAX_DATA_BYTES,
    FORMAT_1,
    NO_TIMESTAMP,
    Record,
    RecordBatch,
    RecordFormat,
    RecordHeader,
    UncheckedRecords,
)

# Versions this build speaks. 2 adds retention: Log Info and Set Log Start. 3 carries
# records in format 2 (with their commit time) in every message that holds one.
STORAGE_PROTOCOL_VERSIONS = range(1, 4)
RETENTION_VERSION = 2
COMMIT_TIME_VERSION = 3


def record_format(version: int) -> RecordFormat:
    """The record format messages of a negotiated protocol version carry."""
    return DEFAULT_FORMAT if version >= COMMIT_TIME_VERSION else FORMAT_1


MESSAGE_HEADER = struct.Struct(">qqi")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U16 = struct.Struct(">H")

MAX_ERROR_MESSAGE_BYTES = 4096
# In an IO_ERROR's message: the storage node's disk had no room for an append (nothing
# was written; the node recovers by itself once there is room).
NO_SPACE_MESSAGE = "no space for an append"
DEFAULT_MAX_LIST_RECORDS = 100_000


class StorageMessageType(IntEnum):
    OPEN_REQUEST = 1
    LAST_SESSION_INFO_REQUEST = 2
    LAST_SESSION_INFO_RESPONSE = 3
    SET_LOW_WATER_MARK_REQUEST = 4
    TRUNCATE_REQUEST = 5
    APPEND_REQUEST = 6
    SUCCESS_RESPONSE = 7
    FAILURE_RESPONSE = 8
    RECORD_HEADER_REQUEST = 9
    RECORD_HEADER_RESPONSE = 10
    RECORD_REQUEST = 11
    RECORD_RESPONSE = 12
    MAX_TRANSACTION_ID_REQUEST = 13
    MAX_TRANSACTION_ID_RESPONSE = 14
    RECORD_HEADER_LIST_REQUEST = 15
    RECORD_HEADER_LIST_RESPONSE = 16
    RECORD_LIST_REQUEST = 17
    RECORD_LIST_RESPONSE = 18
    LOG_INFO_REQUEST = 19  # version 2
    LOG_INFO_RESPONSE = 20  # version 2
    SET_LOG_START_REQUEST = 21  # version 2
    FIND_TIME_REQUEST = 22  # version 3
    FIND_TIME_RESPONSE = 23  # version 3


class StorageError(IntEnum):
    """Error types carried by a Failure response."""

    INTERNAL = 1
    MALFORMED_REQUEST = 2
    NOT_OPEN = 3  # a partition request before a successful Open
    CLUSTER_KEY_MISMATCH = 4
    PARTITION_COUNT_MISMATCH = 5
    PARTITION_NOT_FOUND = 6  # this node does not hold the partition
    PARTITION_UNAVAILABLE = 7  # held, but failed to open or failed an fsync
    SESSION_FENCED = 8  # the request's session is older than the partition's
    NON_CONTIGUOUS = 9  # an append that is not the next transaction ID
    TRANSACTION_NOT_FOUND = 10
    TRUNCATE_REFUSED = 11
    IO_ERROR = 12
    SESSION_UNKNOWN = 13  # newer than any session the cluster metadata records


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds a decoder enforces besides the frame size."""

    max_data_bytes: int = DEFAULT_MAX_DATA_BYTES
    max_list_records: int = DEFAULT_MAX_LIST_RECORDS
    record_format: RecordFormat = DEFAULT_FORMAT  # the connection's (record_format(version))


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class StorageMessage:
    TYPE: ClassVar[StorageMessageType]

    session_id: int
    seq: int
    partition_id: int

    def _body(self) -> bytes:
        return b""

    def encode(self) -> bytes:
        head = MESSAGE_HEADER.pack(self.session_id, self.seq, self.partition_id)
        return encode_frame(self.TYPE, head + self._body())

    def encode_parts(self) -> list[bytes | memoryview]:
        """The frame as buffers to write in turn (``transport.writelines``)."""
        return [self.encode()]

    @classmethod
    def _read_body(cls, r: Reader, head: tuple[int, int, int], limits: Limits) -> Self:
        return cls(*head)


# --- requests -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OpenRequest(StorageMessage):
    TYPE = StorageMessageType.OPEN_REQUEST
    cluster_key: uuid.UUID = field(default_factory=uuid.uuid4)
    num_partitions: int = 0

    def _body(self) -> bytes:
        return self.cluster_key.bytes + _I32.pack(self.num_partitions)

    @classmethod
    def _read_body(cls, r: Reader, head: tuple[int, int, int], limits: Limits) -> Self:
        return cls(*head, r.uuid("Open.cluster_key"), r.i32("Open.num_partitions"))


@dataclass(frozen=True, slots=True)
class LastSessionInfoRequest(StorageMessage):
    TYPE = StorageMessageType.LAST_SESSION_INFO_REQUEST


@dataclass(frozen=True, slots=True)
class MaxTransactionIdRequest(StorageMessage):
    TYPE = StorageMessageType.MAX_TRANSACTION_ID_REQUEST


@dataclass(frozen=True, slots=True)
class TruncateRequest(StorageMessage):
    """Remove every transaction after ``transaction_id``."""

    TYPE = StorageMessageType.TRUNCATE_REQUEST
    transaction_id: int = -1

    def _body(self) -> bytes:
        return _I64.pack(self.transaction_id)

    @classmethod
    def _read_body(cls, r: Reader, head: tuple[int, int, int], limits: Limits) -> Self:
        return cls(*head, r.i64("Truncate.transaction_id"))


@dataclass(frozen=True, slots=True)
class SetLowWaterMarkRequest(StorageMessage):
    TYPE = StorageMessageType.SET_LOW_WATER_MARK_REQUEST
    low_water_mark: int = -1

    def _body(self) -> bytes:
        return _I64.pack(self.low_water_mark)

    @classmethod
    def _read_body(cls, r: Reader, head: tuple[int, int, int], limits: Limits) -> Self:
        return cls(*head, r.i64("SetLowWaterMark.low_water_mark"))


@dataclass(frozen=True, slots=True)
class LogInfoRequest(StorageMessage):
    """The partition's log start and its segments (retention decides from them)."""

    TYPE = StorageMessageType.LOG_INFO_REQUEST


@dataclass(frozen=True, slots=True)
class SetLogStartRequest(StorageMessage):
    """Retention: serve nothing below ``log_start``; delete the segments wholly below it.
    Past the end of the replica's log, the replica skips ahead to start empty there."""

    TYPE = StorageMessageType.SET_LOG_START_REQUEST
    log_start: int = 0

    def _body(self) -> bytes:
        return _I64.pack(self.log_start)

    @classmethod
    def _read_body(cls, r: Reader, head: tuple[int, int, int], limits: Limits) -> Self:
        return cls(*head, r.i64("SetLogStart.log_start"))


@dataclass(frozen=True, slots=True)
class FindTimeRequest(StorageMessage):
    """The first transaction committed at or after ``timestamp`` (ms since the epoch), as
    far as this node stores the log (version 3)."""

    TYPE = StorageMessageType.FIND_TIME_REQUEST
    timestamp: int = 0

    def _body(self) -> bytes:
        return _I64.pack(self.timestamp)

    @classmethod
    def _read_body(cls, r: Reader, head: tuple[int, int, int], limits: Limits) -> Self:
        return cls(*head, r.i64("FindTime.timestamp"))


@dataclass(frozen=True, slots=True)
class AppendRequest(StorageMessage):
    TYPE = StorageMessageType.APPEND_REQUEST
    records: RecordBatch = field(default_factory=lambda: RecordBatch(b"", []))

    def _body(self) -> bytes:
        return _I32.pack(len(self.records)) + self.records.buf

    @classmethod
    def _read_body(cls, r: Reader, head: tuple[int, int, int], limits: Limits) -> Self:
        n = r.count("Append.record count", limits.max_list_records)
        return cls(*head, RecordBatch.read(r, n, limits.max_data_bytes, limits.record_format))


@dataclass(frozen=True, slots=True)
class _ReadOneRequest(StorageMessage):
    """A read of one transaction (the Record Header and Record requests share this layout)."""

    transaction_id: int = 0

    def _body(self) -> bytes:
        return _I64.pack(self.transaction_id)

    @classmethod
    def _read_body(cls, r: Reader, head: tuple[int, int, int], limits: Limits) -> Self:
        return cls(*head, r.i64(f"{cls.__name__}.transaction_id"))


@dataclass(frozen=True, slots=True)
class RecordHeaderRequest(_ReadOneRequest):
    TYPE = StorageMessageType.RECORD_HEADER_REQUEST


@dataclass(frozen=True, slots=True)
class RecordRequest(_ReadOneRequest):
    TYPE = StorageMessageType.RECORD_REQUEST


@dataclass(frozen=True, slots=True)
class _ReadListRequest(StorageMessage):
    """A read of up to ``max_records`` transactions from ``transaction_id``."""

    transaction_id: int = 0
    max_records: int = 0

    def _body(self) -> bytes:
        return _I64.pack(self.transaction_id) + _I32.pack(self.max_records)

    @classmethod
    def _read_body(cls, r: Reader, head: tuple[int, int, int], limits: Limits) -> Self:
        txid = r.i64(f"{cls.__name__}.transaction_id")
        return cls(*head, txid, r.count(f"{cls.__name__}.max_records", 2**31 - 1))


@dataclass(frozen=True, slots=True)
class RecordHeaderListRequest(_ReadListRequest):
    TYPE = StorageMessageType.RECORD_HEADER_LIST_REQUEST


@dataclass(frozen=True, slots=True)
class RecordListRequest(_ReadListRequest):
    TYPE = StorageMessageType.RECORD_LIST_REQUEST


# --- responses ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SuccessResponse(StorageMessage):
    TYPE = StorageMessageType.SUCCESS_RESPONSE


@dataclass(frozen=True, slots=True)
class FailureResponse(StorageMessage):
    TYPE = StorageMessageType.FAILURE_RESPONSE
    error: StorageError = StorageError.INTERNAL
    message: str = ""

    def _body(self) -> bytes:
        return _U16.pack(self.error) + pack_string(self.message, MAX_ERROR_MESSAGE_BYTES)

    @classmethod
    def _read_body(cls, r: Reader, head: tuple[int, int, int], limits: Limits) -> Self:
        code = r.u16("Failure.error")
        try:
            error = StorageError(code)
        except ValueError:
            raise MalformedMessage(f"Failure.error: unknown error type {code}") from None
        return cls(*head, error, r.string("Failure.message", MAX_ERROR_MESSAGE_BYTES))


@dataclass(frozen=True, slots=True)
class LastSessionInfoResponse(StorageMessage):
    """The session that last set the low-water mark, and the marks it set."""

    TYPE = StorageMessageType.LAST_SESSION_INFO_RESPONSE
    last_session_id: int = -1
    low_water_mark: int = -1
    local_low_water_mark: int = -1

    def _body(self) -> bytes:
        return (
            _I64.pack(self.last_session_id)
            + _I64.pack(self.low_water_mark)
            + _I64.pack(self.local_low_water_mark)
        )

    @classmethod
    def _read_body(cls, r: Reader, head: tuple[int, int, int], limits: Limits) -> Self:
        return cls(
            *head,
            r.i64("LastSessionInfo.last_session_id"),
            r.i64("LastSessionInfo.low_water_mark"),
            r.i64("LastSessionInfo.local_low_water_mark"),
        )


@dataclass(frozen=True, slots=True)
class MaxTransactionIdResponse(StorageMessage):
    TYPE = StorageMessageType.MAX_TRANSACTION_ID_RESPONSE
    transaction_id: int = -1

    def _body(self) -> bytes:
        return _I64.pack(self.transaction_id)

    @classmethod
    def _read_body(cls, r: Reader, head: tuple[int, int, int], limits: Limits) -> Self:
        return cls(*head, r.i64("MaxTransactionId.transaction_id"))


@dataclass(frozen=True, slots=True)
class RecordHeaderResponse(StorageMessage):
    TYPE = StorageMessageType.RECORD_HEADER_RESPONSE
    record_header: RecordHeader | None = None
    fmt: RecordFormat = DEFAULT_FORMAT  # the connection's record format

    def _body(self) -> bytes:
        assert self.record_header is not None
        return self.record_header.encode(self.fmt)

    @classmethod
    def _read_body(cls, r: Reader, head: tuple[int, int, int], limits: Limits) -> Self:
        fmt = limits.record_format
        return cls(*head, RecordHeader.read(r, fmt), fmt)


@dataclass(frozen=True, slots=True)
class RecordResponse(StorageMessage):
    TYPE = StorageMessageType.RECORD_RESPONSE
    record: Record | None = None
    fmt: RecordFormat = DEFAULT_FORMAT  # the connection's record format

    def _body(self) -> bytes:
        assert self.record is not None
        return self.record.encode(self.fmt)

    @classmethod
    def _read_body(cls, r: Reader, head: tuple[int, int, int], limits: Limits) -> Self:
        fmt = limits.record_format
        return cls(*head, Record.read(r, limits.max_data_bytes, fmt), fmt)


MAX_SEGMENTS_LISTED = 1_000_000


@dataclass(frozen=True, slots=True)
class SegmentStats:
    first_txid: int
    records: int
    size_bytes: int
    modified_ms: int  # when the segment's data file last changed (ms since the epoch)
    # The commit time of its last record (version 3; NO_TIMESTAMP: none, or no record).
    last_commit_ms: int = NO_TIMESTAMP

    @property
    def last_txid(self) -> int:
        return self.first_txid + self.records - 1


_SEGMENT_STATS = struct.Struct(">qiqq")
_TIMED_SEGMENT_STATS = struct.Struct(">qiqqq")  # version 3: + the last commit time


@dataclass(frozen=True, slots=True)
class LogInfoResponse(StorageMessage):
    TYPE = StorageMessageType.LOG_INFO_RESPONSE
    log_start: int = 0
    max_transaction_id: int = -1
    segments: tuple[SegmentStats, ...] = ()
    fmt: RecordFormat = DEFAULT_FORMAT  # the connection's: format 2 carries commit times

    def _body(self) -> bytes:
        if self.fmt.version >= 2:
            stats = b"".join(
                _TIMED_SEGMENT_STATS.pack(
                    s.first_txid, s.records, s.size_bytes, s.modified_ms, s.last_commit_ms
                )
                for s in self.segments
            )
        else:
            stats = b"".join(
                _SEGMENT_STATS.pack(s.first_txid, s.records, s.size_bytes, s.modified_ms)
                for s in self.segments
            )
        return (
            _I64.pack(self.log_start)
            + _I64.pack(self.max_transaction_id)
            + _I32.pack(len(self.segments))
            + stats
        )

    @classmethod
    def _read_body(cls, r: Reader, head: tuple[int, int, int], limits: Limits) -> Self:
        log_start = r.i64("LogInfo.log_start")
        max_txid = r.i64("LogInfo.max_transaction_id")
        n = r.count("LogInfo.segments", MAX_SEGMENTS_LISTED)
        fmt = limits.record_format
        timed = fmt.version >= 2
        segments = tuple(
            SegmentStats(
                r.i64("LogInfo.first_txid"),
                r.i32("LogInfo.records"),
                r.i64("LogInfo.size_bytes"),
                r.i64("LogInfo.modified_ms"),
                r.i64("LogInfo.last_commit_ms") if timed else NO_TIMESTAMP,
            )
            for _ in range(n)
        )
        return cls(*head, log_start, max_txid, segments, fmt)


@dataclass(frozen=True, slots=True)
class FindTimeResponse(StorageMessage):
    """The answer to a FindTimeRequest: the first transaction this node stores whose commit
    time is at or after the time asked, or its last transaction + 1 when there is none
    (a record without a commit time counts as earlier than any). Below the node's log
    start nothing is looked at: the answer is then its log start."""

    TYPE = StorageMessageType.FIND_TIME_RESPONSE
    transaction_id: int = 0

    def _body(self) -> bytes:
        return _I64.pack(self.transaction_id)

    @classmethod
    def _read_body(cls, r: Reader, head: tuple[int, int, int], limits: Limits) -> Self:
        return cls(*head, r.i64("FindTime.transaction_id"))


@dataclass(frozen=True, slots=True)
class RecordHeaderListResponse(StorageMessage):
    TYPE = StorageMessageType.RECORD_HEADER_LIST_RESPONSE
    headers: tuple[RecordHeader, ...] = ()
    fmt: RecordFormat = DEFAULT_FORMAT  # the connection's record format

    def _body(self) -> bytes:
        fmt = self.fmt
        return _I32.pack(len(self.headers)) + b"".join(h.encode(fmt) for h in self.headers)

    @classmethod
    def _read_body(cls, r: Reader, head: tuple[int, int, int], limits: Limits) -> Self:
        n = r.count("RecordHeaderList.count", limits.max_list_records)
        fmt = limits.record_format
        return cls(*head, tuple(RecordHeader.read(r, fmt) for _ in range(n)), fmt)


@dataclass(frozen=True, slots=True)
class RecordListResponse(StorageMessage):
    TYPE = StorageMessageType.RECORD_LIST_RESPONSE
    records: RecordBatch = field(default_factory=lambda: RecordBatch(b"", []))

    def _body(self) -> bytes:
        return _I32.pack(len(self.records)) + self.records.buf

    def encode_parts(self) -> list[bytes | memoryview]:
        head = MESSAGE_HEADER.pack(self.session_id, self.seq, self.partition_id)
        return frame_parts(self.TYPE, head + _I32.pack(len(self.records)), self.records.buf)

    @classmethod
    def _read_body(cls, r: Reader, head: tuple[int, int, int], limits: Limits) -> Self:
        n = r.count("RecordList.count", limits.max_list_records)
        return cls(*head, RecordBatch.read(r, n, limits.max_data_bytes, limits.record_format))


def decode_unchecked_record_list(
    body: bytes | bytearray | memoryview, limits: Limits = DEFAULT_LIMITS
) -> StorageMessage:
    """A Record List response with its records counted but not walked or checked
    (``UncheckedRecords``), for a relay whose receiver checks them; any other response
    decodes as usual."""
    r = Reader(body)
    head = (r.i64("session id"), r.i64("sequence number"), r.i32("partition id"))
    n = r.count("RecordList.count", limits.max_list_records)
    # The field is typed RecordBatch for every other reader; only the relay that asked
    # for this response (StorageClient.records_unchecked) sees it hold UncheckedRecords.
    records = UncheckedRecords(r.rest(), n, limits.record_format)
    return RecordListResponse(*head, records)  # type: ignore[arg-type]


def in_record_format(message: StorageMessage, fmt: RecordFormat) -> StorageMessage:
    """``message`` with the records it holds in record format ``fmt`` (a peer of an older
    protocol version: see ``record_format``); any other message as it is."""
    match message:
        case AppendRequest(records=batch) | RecordListResponse(records=batch) if (
            isinstance(batch, RecordBatch) and batch.format.version != fmt.version
        ):
            return replace(message, records=batch.convert(fmt))
        case (
            RecordHeaderResponse()
            | RecordResponse()
            | RecordHeaderListResponse()
            | LogInfoResponse()
        ) if message.fmt.version != fmt.version:
            return replace(message, fmt=fmt)
    return message


STORAGE_REQUESTS: dict[int, type[StorageMessage]] = {
    cls.TYPE: cls
    for cls in (
        OpenRequest,
        LastSessionInfoRequest,
        MaxTransactionIdRequest,
        TruncateRequest,
        SetLowWaterMarkRequest,
        AppendRequest,
        RecordHeaderRequest,
        RecordRequest,
        RecordHeaderListRequest,
        RecordListRequest,
        LogInfoRequest,
        SetLogStartRequest,
        FindTimeRequest,
    )
}
STORAGE_RESPONSES: dict[int, type[StorageMessage]] = {
    cls.TYPE: cls
    for cls in (
        SuccessResponse,
        FailureResponse,
        LastSessionInfoResponse,
        MaxTransactionIdResponse,
        RecordHeaderResponse,
        RecordResponse,
        RecordHeaderListResponse,
        RecordListResponse,
        LogInfoResponse,
        FindTimeResponse,
    )
}


def _decode(
    table: dict[int, type[StorageMessage]],
    direction: str,
    message_type: int,
    body: bytes | bytearray | memoryview,
    limits: Limits,
) -> StorageMessage:
    cls = table.get(message_type)
    if cls is None:
        raise UnknownMessageType(f"message type {message_type} is not a storage {direction}")
    r = Reader(body)
    head = r.peek(MESSAGE_HEADER)  # every message starts so: one unpack, not three
    if head is not None:
        r.skip(MESSAGE_HEADER.size)
    else:  # cut short: read field by field, which names the field
        head = (r.i64("session id"), r.i64("sequence number"), r.i32("partition id"))
    message = cls._read_body(r, head, limits)
    r.expect_end(cls.__name__)
    return message


def decode_request(
    message_type: int, body: bytes | bytearray | memoryview, limits: Limits = DEFAULT_LIMITS
) -> StorageMessage:
    return _decode(STORAGE_REQUESTS, "request", message_type, body, limits)


def decode_response(
    message_type: int, body: bytes | bytearray | memoryview, limits: Limits = DEFAULT_LIMITS
) -> StorageMessage:
    return _decode(STORAGE_RESPONSES, "response", message_type, body, limits)
