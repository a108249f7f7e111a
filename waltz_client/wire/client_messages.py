"""Client <-> server messages (the spec's "Client-Server Communication").

Every message starts with a ReqId (client ID, generation, partition ID,
sequence number): the partition a message is about is its ReqId's. Type
codes 0-12 follow the original implementation; 13-19 are additions (a bulk
range read for batch readers, an error response for RPCs, client-ID
allocation, protocol version 2, and Find Time, version 3). Feed data travels
in batches: one frame carries many committed transaction headers.

Protocol version 3 carries commit times: a Feed Data row is a ``TIMED_HEADER`` (the
header, then its commit time) and a Read Range Response's records are of record format
2. Versions 1 and 2 carry ``RECORD_HEADER`` rows and format-1 records; requests are the
same in every version. A message's decoder is told the connection's version
(``decode_server_response(version=...)``); a server sends each client its version's
layout (``encode_feed_data``, ``records_in``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar, Self

from .buffers import Reader, pack_string
from .errors import ChecksumMismatch, MalformedMessage, UnknownMessageType
from .framing import encode_frame, frame_parts
from .records import (
    CRC,
    DEFAULT_FORMAT,
    DEFAULT_MAX_DATA_BYTES,
    FORMAT_1,
    NO_TIMESTAMP,
    RECORD_HEADER,
    TIMED_HEADER,
    RecordBatch,
    RecordFormat,
    RecordHeader,
    ReqId,
    UncheckedRecords,
    crc32,
)

# Versions this build speaks: 2 adds AllocateClientId (a client of a version-1 server
# draws its ID from ZooKeeper, as clients did before); 3 adds commit times (feed rows and
# range-read records carry them).
SERVER_PROTOCOL_VERSIONS = range(1, 4)
CLIENT_ID_PROTOCOL_VERSION = 2
COMMIT_TIME_VERSION = 3
PROTOCOL_VERSION = SERVER_PROTOCOL_VERSIONS[-1]  # the newest: what decoders assume unless told


def record_format(version: int) -> RecordFormat:
    """The record format (and feed row layout) of a negotiated protocol version: format 2
    (``TIMED_HEADER`` rows) from version 3 on, else format 1 (``RECORD_HEADER`` rows)."""
    if version not in SERVER_PROTOCOL_VERSIONS:
        raise ValueError(
            f"client protocol version {version} is not one this build speaks "
            f"({SERVER_PROTOCOL_VERSIONS.start}..{SERVER_PROTOCOL_VERSIONS.stop - 1})"
        )
    return DEFAULT_FORMAT if version >= COMMIT_TIME_VERSION else FORMAT_1


_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U8 = struct.Struct(">B")
_APPEND_HEAD = struct.Struct(">iiiiq")  # ReqId, client high-water mark
_FEED_HEAD = 20  # a FeedData body's ReqId and header count

MAX_LOCKS = 1024  # lock hashes of each kind in one append
MAX_FEED_BATCH = 65_536
MAX_ERROR_MESSAGE_BYTES = 4096


class ClientMessageType(IntEnum):
    MOUNT_REQUEST = 0
    MOUNT_RESPONSE = 1
    APPEND_REQUEST = 2
    FEED_REQUEST = 3
    FEED_DATA = 4
    FEED_SUSPENDED = 5
    TRANSACTION_DATA_REQUEST = 6
    TRANSACTION_DATA_RESPONSE = 7
    FLUSH_REQUEST = 8
    FLUSH_RESPONSE = 9
    LOCK_FAILURE = 10
    HIGH_WATER_MARK_REQUEST = 11
    HIGH_WATER_MARK_RESPONSE = 12
    READ_RANGE_REQUEST = 13
    READ_RANGE_RESPONSE = 14
    ERROR_RESPONSE = 15
    ALLOCATE_CLIENT_ID_REQUEST = 16
    CLIENT_ID_ALLOCATED = 17
    FIND_TIME_REQUEST = 18  # version 3
    FIND_TIME_RESPONSE = 19  # version 3


class MountStatus(IntEnum):
    READY = 0
    NOT_OWNER = 1  # this server does not own the partition: look up the owner again
    STALE_GENERATION = 2  # the ReqId's generation is not the partition's current one
    STALE_CONNECTION = 3  # a newer connection of this client has mounted the partition


class ErrorCode(IntEnum):
    NOT_OWNER = 1  # this server does not own the partition
    NOT_READY = 2  # owned, but recovering
    NOT_FOUND = 3  # reserved: a missing transaction gets a failed TransactionDataResponse
    STORAGE_UNAVAILABLE = 4  # no storage node could answer the read
    BAD_REQUEST = 5  # reserved: a malformed request closes the connection instead
    NOT_MOUNTED = 6  # a Flush on a connection without a current mount of the client
    LIMIT_EXCEEDED = 7  # a limit of the server (or a client-ID quota); the message says which
    UNAUTHORIZED = 8  # the connection's certificate may not act as this client ID
    FORBIDDEN = 9  # the cluster's access policy does not let this identity do that here
    TRUNCATED = 10  # below the partition's log start (retention); the message names it


@dataclass(frozen=True, slots=True)
class ClientMessage:
    TYPE: ClassVar[ClientMessageType]

    req_id: ReqId

    @property
    def partition_id(self) -> int:
        return self.req_id.partition_id

    def _body(self) -> bytes:
        return b""

    def encode(self) -> bytes:
        return encode_frame(self.TYPE, self.req_id.encode() + self._body())

    def encode_parts(self) -> list[bytes | memoryview]:
        """The frame as buffers to write in turn (``transport.writelines``)."""
        return [self.encode()]

    @classmethod
    def _read_body(cls, r: Reader, req_id: ReqId, max_data_bytes: int, fmt: RecordFormat) -> Self:
        return cls(req_id)


# --- client -> server -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MountRequest(ClientMessage):
    """Start the feed after ``client_high_water_mark``; ``connection_seq`` orders this
    client's connections, so a server ignores what an older one still sends."""

    TYPE = ClientMessageType.MOUNT_REQUEST
    client_high_water_mark: int = -1
    connection_seq: int = 0

    def _body(self) -> bytes:
        return _I64.pack(self.client_high_water_mark) + _I32.pack(self.connection_seq)

    @classmethod
    def _read_body(cls, r: Reader, req_id: ReqId, max_data_bytes: int, fmt: RecordFormat) -> Self:
        hwm = _high_water_mark(r, "Mount.client_high_water_mark")
        return cls(req_id, hwm, r.i32("Mount.connection_seq"))


def _high_water_mark(r: Reader, what: str) -> int:
    """A client high-water mark: -1 (nothing applied yet) or a transaction ID."""
    hwm = r.i64(what)
    if hwm < -1:
        raise MalformedMessage(f"{what} {hwm} is below -1")
    return hwm


_NO_HASHES = _I32.pack(0)
# An Append's fields up to its data when it takes no locks: high-water mark, the three
# lock counts (0), header, data length.
_APPEND_WITHOUT_LOCKS = struct.Struct(">qiiiii")
# Its whole frame up to the data: frame length and type, ReqId, then the fields above.
_APPEND_FRAME_WITHOUT_LOCKS = struct.Struct(">IB" + "iiii" + _APPEND_WITHOUT_LOCKS.format[1:])


def _pack_hashes(hashes: tuple[int, ...]) -> bytes:
    if not hashes:
        return _NO_HASHES  # most appends take no locks of a kind
    return _I32.pack(len(hashes)) + struct.pack(f">{len(hashes)}i", *hashes)


def _read_hashes(r: Reader, what: str) -> tuple[int, ...]:
    n = r.count(what, MAX_LOCKS)
    raw = r.raw(4 * n, what)
    return struct.unpack(f">{n}i", raw)


@dataclass(frozen=True, slots=True)
class AppendRequest(ClientMessage):
    """A transaction. Write locks are checked and taken, read locks only checked, append
    locks only taken. The data's CRC-32 travels with it and is checked on decode."""

    TYPE = ClientMessageType.APPEND_REQUEST
    client_high_water_mark: int = -1
    write_locks: tuple[int, ...] = ()
    read_locks: tuple[int, ...] = ()
    append_locks: tuple[int, ...] = ()
    header: int = 0
    data: bytes = b""

    def encode(self) -> bytes:
        if self.write_locks or self.read_locks or self.append_locks:
            return ClientMessage.encode(self)
        # Most appends take no locks: the frame's head and fixed fields in one pack.
        q, data = self.req_id, self.data
        return b"".join(
            (
                _APPEND_FRAME_WITHOUT_LOCKS.pack(
                    # The length counts the type byte on: the head less its 4 length
                    # bytes, the data and its 4-byte CRC.
                    _APPEND_FRAME_WITHOUT_LOCKS.size + len(data),
                    self.TYPE,
                    q.client_id,
                    q.generation,
                    q.partition_id,
                    q.seq,
                    self.client_high_water_mark,
                    0,
                    0,
                    0,
                    self.header,
                    len(data),
                ),
                data,
                CRC.pack(crc32(data)),
            )
        )

    def _body(self) -> bytes:
        return b"".join(
            (
                _I64.pack(self.client_high_water_mark),
                _pack_hashes(self.write_locks),
                _pack_hashes(self.read_locks),
                _pack_hashes(self.append_locks),
                _I32.pack(self.header),
                _I32.pack(len(self.data)),
                self.data,
                struct.pack(">I", crc32(self.data)),
            )
        )

    @classmethod
    def _read_body(cls, r: Reader, req_id: ReqId, max_data_bytes: int, fmt: RecordFormat) -> Self:
        plain = r.peek(_APPEND_WITHOUT_LOCKS)
        if plain is not None:
            hwm, n_write, n_read, n_append, header, length = plain
            if n_write == n_read == n_append == 0 and hwm >= -1 and 0 <= length <= max_data_bytes:
                # Most appends take no locks: their fixed fields in one unpack. Anything
                # else (or anything wrong) is read field by field below, which names it.
                r.skip(_APPEND_WITHOUT_LOCKS.size)
                return cls._data(r, req_id, hwm, (), (), (), header, length)
        hwm = _high_water_mark(r, "Append.client_high_water_mark")
        write = _read_hashes(r, "Append.write_locks")
        read = _read_hashes(r, "Append.read_locks")
        append = _read_hashes(r, "Append.append_locks")
        header = r.i32("Append.header")
        length = r.i32("Append.data length")
        if length < 0 or length > max_data_bytes:
            raise MalformedMessage(f"Append.data length {length} is outside 0..{max_data_bytes}")
        return cls._data(r, req_id, hwm, write, read, append, header, length)

    @classmethod
    def _data(
        cls,
        r: Reader,
        req_id: ReqId,
        hwm: int,
        write: tuple[int, ...],
        read: tuple[int, ...],
        append: tuple[int, ...],
        header: int,
        length: int,
    ) -> Self:
        """The rest of an Append, from its data: the data and its checked CRC."""
        data = r.raw(length, "Append.data")
        checksum = r.u32("Append.checksum")
        if crc32(data) != checksum:
            raise ChecksumMismatch(
                f"Append {req_id}: data CRC-32 {crc32(data):#010x} != sent {checksum:#010x}"
            )
        return cls(req_id, hwm, write, read, append, header, data)


@dataclass(frozen=True, slots=True)
class FeedRequest(ClientMessage):
    """Stream committed transactions after ``client_high_water_mark`` (a read-only
    subscription: unlike Mount, it waits for no pending append)."""

    TYPE = ClientMessageType.FEED_REQUEST
    client_high_water_mark: int = -1

    def _body(self) -> bytes:
        return _I64.pack(self.client_high_water_mark)

    @classmethod
    def _read_body(cls, r: Reader, req_id: ReqId, max_data_bytes: int, fmt: RecordFormat) -> Self:
        return cls(req_id, _high_water_mark(r, "Feed.client_high_water_mark"))


@dataclass(frozen=True, slots=True)
class TransactionDataRequest(ClientMessage):
    TYPE = ClientMessageType.TRANSACTION_DATA_REQUEST
    transaction_id: int = -1

    def _body(self) -> bytes:
        return _I64.pack(self.transaction_id)

    @classmethod
    def _read_body(cls, r: Reader, req_id: ReqId, max_data_bytes: int, fmt: RecordFormat) -> Self:
        return cls(req_id, r.i64("TransactionData.transaction_id"))


@dataclass(frozen=True, slots=True)
class FlushRequest(ClientMessage):
    TYPE = ClientMessageType.FLUSH_REQUEST


@dataclass(frozen=True, slots=True)
class HighWaterMarkRequest(ClientMessage):
    TYPE = ClientMessageType.HIGH_WATER_MARK_REQUEST


@dataclass(frozen=True, slots=True)
class FindTimeRequest(ClientMessage):
    """The first committed transaction of the partition whose commit time is at or after
    ``timestamp`` (ms since the Unix epoch); version 3."""

    TYPE = ClientMessageType.FIND_TIME_REQUEST
    timestamp: int = 0

    def _body(self) -> bytes:
        return _I64.pack(self.timestamp)

    @classmethod
    def _read_body(cls, r: Reader, req_id: ReqId, max_data_bytes: int, fmt: RecordFormat) -> Self:
        return cls(req_id, r.i64("FindTime.timestamp"))


@dataclass(frozen=True, slots=True)
class ReadRangeRequest(ClientMessage):
    """Committed transactions with their data from ``from_transaction_id`` on, at most
    ``max_records`` of them and about ``max_bytes`` of data (at least one record)."""

    TYPE = ClientMessageType.READ_RANGE_REQUEST
    from_transaction_id: int = 0
    max_records: int = 1000
    max_bytes: int = 4 * 1024 * 1024

    def _body(self) -> bytes:
        return struct.pack(">qii", self.from_transaction_id, self.max_records, self.max_bytes)

    @classmethod
    def _read_body(cls, r: Reader, req_id: ReqId, max_data_bytes: int, fmt: RecordFormat) -> Self:
        start = r.i64("ReadRange.from_transaction_id")
        count = r.i32("ReadRange.max_records")
        size = r.i32("ReadRange.max_bytes")
        if start < 0 or count < 1 or size < 1:
            raise MalformedMessage(
                f"ReadRange: from {start}, max_records {count}, max_bytes {size}: "
                f"need from >= 0 and positive limits"
            )
        return cls(req_id, start, count, size)


@dataclass(frozen=True, slots=True)
class AllocateClientIdRequest(ClientMessage):
    """Ask for a client ID (version 2). On a mutual-TLS port it is bound to the
    connection's certificate identity. Only the ReqId's sequence number matters (a
    client without an ID sends -1 as its client ID)."""

    TYPE = ClientMessageType.ALLOCATE_CLIENT_ID_REQUEST


# --- server -> client -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MountResponse(ClientMessage):
    TYPE = ClientMessageType.MOUNT_RESPONSE
    status: MountStatus = MountStatus.READY

    @property
    def partition_ready(self) -> bool:
        return self.status == MountStatus.READY

    def _body(self) -> bytes:
        return _U8.pack(self.status)

    @classmethod
    def _read_body(cls, r: Reader, req_id: ReqId, max_data_bytes: int, fmt: RecordFormat) -> Self:
        code = r.u8("MountResponse.status")
        try:
            return cls(req_id, MountStatus(code))
        except ValueError:
            raise MalformedMessage(f"MountResponse: unknown status {code}") from None


@dataclass(frozen=True, slots=True)
class FeedData(ClientMessage):
    """Committed transaction headers in commit order; ``req_id`` is the Mount's or Feed
    request's, each header carries the ReqId of the append that wrote it and (version 3:
    ``fmt`` FORMAT_2) its commit time. Decoded from a version 1 or 2 feed, every header's
    time is ``NO_TIMESTAMP``."""

    TYPE = ClientMessageType.FEED_DATA
    headers: tuple[RecordHeader, ...] = ()
    fmt: RecordFormat = DEFAULT_FORMAT  # the connection's (``record_format(version)``)

    def _body(self) -> bytes:
        fmt = self.fmt
        return _I32.pack(len(self.headers)) + b"".join(h.encode(fmt) for h in self.headers)

    @classmethod
    def _read_body(cls, r: Reader, req_id: ReqId, max_data_bytes: int, fmt: RecordFormat) -> Self:
        return cls(req_id, _headers(_feed_rows(r, fmt)), fmt)


# A feed's header as unpacked: transaction ID, the ReqId's four fields, header, commit
# time (ms since the Unix epoch; NO_TIMESTAMP from a version 1 or 2 feed).
FeedRow = tuple[int, int, int, int, int, int, int]


@dataclass(frozen=True, slots=True)
class FeedRows(ClientMessage):
    """A FeedData decoded without an object for each header
    (``decode_server_response(feed_rows=True)``): each row is a ``FeedRow``. A client
    settles its own appends from its feed, which carries every client's transactions:
    most rows are someone else's, and need nothing built."""

    TYPE = ClientMessageType.FEED_DATA
    rows: tuple[FeedRow, ...] = ()
    fmt: RecordFormat = DEFAULT_FORMAT  # the connection's (``record_format(version)``)

    def _body(self) -> bytes:
        if self.fmt.version >= 2:
            packed = b"".join(TIMED_HEADER.pack(*row) for row in self.rows)
        else:
            packed = b"".join(RECORD_HEADER.pack(*row[:6]) for row in self.rows)
        return _I32.pack(len(self.rows)) + packed

    @property
    def headers(self) -> tuple[RecordHeader, ...]:
        return _headers(self.rows)

    @classmethod
    def _read_body(cls, r: Reader, req_id: ReqId, max_data_bytes: int, fmt: RecordFormat) -> Self:
        return cls(req_id, tuple(_feed_rows(r, fmt)), fmt)


def _headers(rows: Iterable[FeedRow]) -> tuple[RecordHeader, ...]:
    return tuple(RecordHeader(t, ReqId(c, g, p, s), h, ts) for t, c, g, p, s, h, ts in rows)


def _feed_rows(r: Reader, fmt: RecordFormat) -> Iterable[FeedRow]:
    n = r.count("FeedData.count", MAX_FEED_BATCH)
    if fmt.version >= 2:  # the hot path: one unpack a row, nothing else
        return TIMED_HEADER.iter_unpack(r.raw(n * TIMED_HEADER.size, "FeedData.headers"))
    rows = RECORD_HEADER.iter_unpack(r.raw(n * RECORD_HEADER.size, "FeedData.headers"))
    return [(*row, NO_TIMESTAMP) for row in rows]  # an older server's: no commit times


def encode_feed_data(req_id: ReqId, packed_headers: list[bytes], version: int) -> bytes:
    """A FeedData frame for a client of protocol ``version`` from headers already packed
    as ``TIMED_HEADER`` (the server's feed cache keeps them packed, so the hot path builds
    no objects): version 3 gets them as they are, older versions each one's first 28
    bytes (``RECORD_HEADER``: the time left out)."""
    n = len(packed_headers)
    head = (req_id.encode(), _I32.pack(n))
    if version >= COMMIT_TIME_VERSION:
        body, row = b"".join((*head, *packed_headers)), TIMED_HEADER.size
    else:
        short = RECORD_HEADER.size
        body, row = b"".join((*head, *[h[:short] for h in packed_headers])), short
    if len(body) != _FEED_HEAD + n * row:  # one check a frame: a wrong cache entry
        raise ValueError(
            f"FeedData: {n} headers packed in {len(body) - _FEED_HEAD} bytes; each must be "
            f"a TIMED_HEADER of {TIMED_HEADER.size} bytes"
        )
    return encode_frame(ClientMessageType.FEED_DATA, body)


@dataclass(frozen=True, slots=True)
class FeedSuspended(ClientMessage):
    """The server stopped feeding this partition (it moved away or lost its ZooKeeper
    session): find the owner and mount again."""

    TYPE = ClientMessageType.FEED_SUSPENDED
    reason: str = ""

    def _body(self) -> bytes:
        return pack_string(self.reason, MAX_ERROR_MESSAGE_BYTES)

    @classmethod
    def _read_body(cls, r: Reader, req_id: ReqId, max_data_bytes: int, fmt: RecordFormat) -> Self:
        return cls(req_id, r.string("FeedSuspended.reason", MAX_ERROR_MESSAGE_BYTES))


@dataclass(frozen=True, slots=True)
class TransactionDataResponse(ClientMessage):
    """The data of one committed transaction, or why it could not be fetched."""

    TYPE = ClientMessageType.TRANSACTION_DATA_RESPONSE
    transaction_id: int = -1
    data: bytes | None = None
    error: str = ""

    def _body(self) -> bytes:
        if self.data is None:
            return _I64.pack(self.transaction_id) + b"\x00" + pack_string(self.error, 4096)
        return b"".join(
            (
                _I64.pack(self.transaction_id),
                b"\x01",
                _I32.pack(len(self.data)),
                self.data,
                struct.pack(">I", crc32(self.data)),
            )
        )

    @classmethod
    def _read_body(cls, r: Reader, req_id: ReqId, max_data_bytes: int, fmt: RecordFormat) -> Self:
        txid = r.i64("TransactionDataResponse.transaction_id")
        if not r.bool("TransactionDataResponse.success"):
            return cls(req_id, txid, None, r.string("TransactionDataResponse.error", 4096))
        length = r.i32("TransactionDataResponse.data length")
        if length < 0 or length > max_data_bytes:
            raise MalformedMessage(
                f"TransactionDataResponse.data length {length} is outside 0..{max_data_bytes}"
            )
        data = r.raw(length, "TransactionDataResponse.data")
        checksum = r.u32("TransactionDataResponse.checksum")
        if crc32(data) != checksum:
            raise ChecksumMismatch(
                f"transaction {txid}: data CRC-32 {crc32(data):#010x} != sent {checksum:#010x}"
            )
        return cls(req_id, txid, data)


@dataclass(frozen=True, slots=True)
class FlushResponse(ClientMessage):
    """Every append sent before the flush is resolved; the partition's high-water mark."""

    TYPE = ClientMessageType.FLUSH_RESPONSE
    transaction_id: int = -1

    def _body(self) -> bytes:
        return _I64.pack(self.transaction_id)

    @classmethod
    def _read_body(cls, r: Reader, req_id: ReqId, max_data_bytes: int, fmt: RecordFormat) -> Self:
        return cls(req_id, r.i64("FlushResponse.transaction_id"))


@dataclass(frozen=True, slots=True)
class LockFailure(ClientMessage):
    """The append was rejected: transaction ``transaction_id`` took one of its locks after
    the client's high-water mark."""

    TYPE = ClientMessageType.LOCK_FAILURE
    transaction_id: int = -1

    def _body(self) -> bytes:
        return _I64.pack(self.transaction_id)

    @classmethod
    def _read_body(cls, r: Reader, req_id: ReqId, max_data_bytes: int, fmt: RecordFormat) -> Self:
        return cls(req_id, r.i64("LockFailure.transaction_id"))


@dataclass(frozen=True, slots=True)
class HighWaterMarkResponse(ClientMessage):
    TYPE = ClientMessageType.HIGH_WATER_MARK_RESPONSE
    transaction_id: int = -1

    def _body(self) -> bytes:
        return _I64.pack(self.transaction_id)

    @classmethod
    def _read_body(cls, r: Reader, req_id: ReqId, max_data_bytes: int, fmt: RecordFormat) -> Self:
        return cls(req_id, r.i64("HighWaterMarkResponse.transaction_id"))


@dataclass(frozen=True, slots=True)
class FindTimeResponse(ClientMessage):
    """The answer to a FindTimeRequest: the first committed transaction at or after the
    time (never below the log start), or ``high_water_mark + 1`` when none is; and the
    high-water mark it was looked up against."""

    TYPE = ClientMessageType.FIND_TIME_RESPONSE
    transaction_id: int = 0
    high_water_mark: int = -1

    def _body(self) -> bytes:
        return _I64.pack(self.transaction_id) + _I64.pack(self.high_water_mark)

    @classmethod
    def _read_body(cls, r: Reader, req_id: ReqId, max_data_bytes: int, fmt: RecordFormat) -> Self:
        txid = r.i64("FindTimeResponse.transaction_id")
        return cls(req_id, txid, r.i64("FindTimeResponse.high_water_mark"))


@dataclass(frozen=True, slots=True)
class ReadRangeResponse(ClientMessage):
    """Consecutive committed records from the requested ID (none when it is above the
    high-water mark), and the high-water mark when they were read. The records are of the
    connection's record format (``record_format(version)``): the sender sees to it
    (``records_in``), the encoder sends their bytes as they are."""

    TYPE = ClientMessageType.READ_RANGE_RESPONSE
    high_water_mark: int = -1
    # A server relays a storage node's records unchecked; a client decodes a RecordBatch.
    records: RecordBatch | UncheckedRecords = field(default_factory=lambda: RecordBatch(b"", []))

    def _body(self) -> bytes:
        return _I64.pack(self.high_water_mark) + _I32.pack(len(self.records)) + self.records.buf

    def encode_parts(self) -> list[bytes | memoryview]:
        head = self.req_id.encode() + _I64.pack(self.high_water_mark)
        return frame_parts(self.TYPE, head + _I32.pack(len(self.records)), self.records.buf)

    @classmethod
    def _read_body(cls, r: Reader, req_id: ReqId, max_data_bytes: int, fmt: RecordFormat) -> Self:
        hwm = r.i64("ReadRangeResponse.high_water_mark")
        n = r.count("ReadRangeResponse.count", 1_000_000)
        return cls(req_id, hwm, RecordBatch.read(r, n, max_data_bytes, fmt))

    @classmethod
    def read_unchecked(
        cls, r: Reader, req_id: ReqId, fmt: RecordFormat = DEFAULT_FORMAT
    ) -> ReadRangeResponse:
        """The response with its records counted but not walked (``UncheckedRecords`` of
        record format ``fmt``): a bulk reader checks them where it converts them."""
        hwm = r.i64("ReadRangeResponse.high_water_mark")
        n = r.count("ReadRangeResponse.count", 1_000_000)
        return cls(req_id, hwm, UncheckedRecords(r.rest(), n, fmt))


def records_in(
    records: RecordBatch | UncheckedRecords,
    fmt: RecordFormat,
    max_data_bytes: int = DEFAULT_MAX_DATA_BYTES,
) -> RecordBatch | UncheckedRecords:
    """``records`` in record format ``fmt``: as they are when they are in it already (a
    server relaying a storage node's records to a client of its version), else checked
    (``max_data_bytes``: their data's bound) and converted."""
    if records.format.version == fmt.version:
        return records
    batch = records.check(max_data_bytes) if isinstance(records, UncheckedRecords) else records
    return batch.convert(fmt)


@dataclass(frozen=True, slots=True)
class ErrorResponse(ClientMessage):
    """A request that could not be answered: an RPC (data, high-water mark, range read),
    or a Flush or Feed request for a partition this server does not own."""

    TYPE = ClientMessageType.ERROR_RESPONSE
    code: ErrorCode = ErrorCode.BAD_REQUEST
    message: str = ""

    def _body(self) -> bytes:
        return _U8.pack(self.code) + pack_string(self.message, MAX_ERROR_MESSAGE_BYTES)

    @classmethod
    def _read_body(cls, r: Reader, req_id: ReqId, max_data_bytes: int, fmt: RecordFormat) -> Self:
        code = r.u8("ErrorResponse.code")
        try:
            error = ErrorCode(code)
        except ValueError:
            raise MalformedMessage(f"ErrorResponse: unknown code {code}") from None
        return cls(req_id, error, r.string("ErrorResponse.message", MAX_ERROR_MESSAGE_BYTES))


@dataclass(frozen=True, slots=True)
class ClientIdAllocated(ClientMessage):
    """The answer to an AllocateClientId: the client's ID (0..2**31-1)."""

    TYPE = ClientMessageType.CLIENT_ID_ALLOCATED
    client_id: int = 0

    def _body(self) -> bytes:
        return _I32.pack(self.client_id)

    @classmethod
    def _read_body(cls, r: Reader, req_id: ReqId, max_data_bytes: int, fmt: RecordFormat) -> Self:
        client_id = r.i32("ClientIdAllocated.client_id")
        if client_id < 0:
            raise MalformedMessage(f"ClientIdAllocated.client_id {client_id} is negative")
        return cls(req_id, client_id)


CLIENT_REQUESTS: dict[int, type[ClientMessage]] = {
    cls.TYPE: cls
    for cls in (
        MountRequest,
        AppendRequest,
        FeedRequest,
        TransactionDataRequest,
        FlushRequest,
        HighWaterMarkRequest,
        ReadRangeRequest,
        AllocateClientIdRequest,
        FindTimeRequest,
    )
}
SERVER_RESPONSES: dict[int, type[ClientMessage]] = {
    cls.TYPE: cls
    for cls in (
        MountResponse,
        FeedData,
        FeedSuspended,
        TransactionDataResponse,
        FlushResponse,
        LockFailure,
        HighWaterMarkResponse,
        ReadRangeResponse,
        ErrorResponse,
        ClientIdAllocated,
        FindTimeResponse,
    )
}


def _decode(
    table: dict[int, type[ClientMessage]],
    direction: str,
    message_type: int,
    body: bytes | bytearray | memoryview,
    max_data_bytes: int,
    fmt: RecordFormat = DEFAULT_FORMAT,
    check_records: bool = True,
    feed_rows: bool = False,
) -> ClientMessage:
    cls = table.get(message_type)
    if cls is None:
        raise UnknownMessageType(f"message type {message_type} is not a client {direction}")
    if cls is FeedData and feed_rows:
        cls = FeedRows
    r = Reader(body)
    if cls is ReadRangeResponse and not check_records:
        message: ClientMessage = ReadRangeResponse.read_unchecked(r, ReqId.read(r), fmt)
    else:
        message = cls._read_body(r, ReqId.read(r), max_data_bytes, fmt)
    r.expect_end(cls.__name__)
    return message


def decode_client_request(
    message_type: int,
    body: bytes | bytearray | memoryview,
    max_data_bytes: int = DEFAULT_MAX_DATA_BYTES,
) -> ClientMessage:
    """A request, the same in every protocol version."""
    return _decode(CLIENT_REQUESTS, "request", message_type, body, max_data_bytes)


def decode_server_response(
    message_type: int,
    body: bytes | bytearray | memoryview,
    max_data_bytes: int = DEFAULT_MAX_DATA_BYTES,
    *,
    check_records: bool = True,
    feed_rows: bool = False,
    version: int = PROTOCOL_VERSION,
) -> ClientMessage:
    """A response on a connection of protocol ``version`` (the handshake's): it says how
    feed rows and range-read records are laid out. ``check_records=False``: a range
    read's records come as ``UncheckedRecords``, for the reader to check
    (``UncheckedRecords.check``) where it uses them. ``feed_rows``: a FeedData comes as
    ``FeedRows``."""
    fmt = record_format(version)
    return _decode(
        SERVER_RESPONSES,
        "response",
        message_type,
        body,
        max_data_bytes,
        fmt,
        check_records,
        feed_rows,
    )
