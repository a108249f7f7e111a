"""ReqId, RecordHeader and Record: the transaction structures on the wire.

Record on the wire (big-endian), format 1::

    i64 transaction id | ReqId (4 x i32) | i32 header | i32 data length
    | data bytes | u32 CRC-32 of data

Format 2 adds the commit time after the data length (a 40-byte head; the length stays
at offset 28, so a walk over records differs only in where the data starts)::

    ... | i32 data length | i64 commit time (ms since the Unix epoch) | data bytes | ...

A record of format 1 has no commit time: ``NO_TIMESTAMP``.

Batches of records (Append, Record List) travel as a ``RecordBatch``: the
raw bytes of consecutive records, validated once (bounds and CRCs) when
decoded, so hot paths never build one Python object per record.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from .buffers import Reader
from .crc import crc32 as fast_crc32
from .errors import ChecksumMismatch, MalformedMessage
from .native import native

REQ_ID = struct.Struct(">iiii")
RECORD_HEADER = struct.Struct(">qiiiii")  # txid, reqid(4), header
TIMED_HEADER = struct.Struct(">qiiiiiq")  # RECORD_HEADER + commit time (format 2)
WIRE_RECORD_HEAD = struct.Struct(">qiiiiii")  # RECORD_HEADER + data length
CRC = struct.Struct(">I")
_TXID_AND_LENGTH = struct.Struct(">q20xi")  # WIRE_RECORD_HEAD's first and last fields
_TXID = struct.Struct(">q")
_TIMESTAMP = struct.Struct(">q")

NO_TIMESTAMP = -1  # a record written before commit times (format 1)


@dataclass(frozen=True, slots=True)
class RecordFormat:
    """A wire record layout: its version and its fixed head."""

    version: int
    head: struct.Struct

    @property
    def head_size(self) -> int:
        return self.head.size


FORMAT_1 = RecordFormat(1, WIRE_RECORD_HEAD)
FORMAT_2 = RecordFormat(2, struct.Struct(">qiiiiiiq"))  # format 1's head + commit time
RECORD_FORMATS = {f.version: f for f in (FORMAT_1, FORMAT_2)}
DEFAULT_FORMAT = FORMAT_2  # what this build writes; format 1 only to and from older peers
_SHARED_HEAD = FORMAT_1.head_size  # every format's head starts with format 1's
_NO_TIME = _TIMESTAMP.pack(NO_TIMESTAMP)

DEFAULT_MAX_DATA_BYTES = 16 * 1024 * 1024


def crc32(data: bytes | bytearray | memoryview) -> int:
    """CRC-32 (zlib polynomial) of transaction data, as an unsigned 32-bit int."""
    return fast_crc32(data) & 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class ReqId:
    """Client-generated unique request ID."""

    client_id: int
    generation: int
    partition_id: int
    seq: int

    def encode(self) -> bytes:
        return REQ_ID.pack(self.client_id, self.generation, self.partition_id, self.seq)

    @classmethod
    def read(cls, r: Reader) -> ReqId:
        fields = r.peek(REQ_ID)  # every message has one: one unpack, not four
        if fields is not None:
            r.skip(REQ_ID.size)
            return cls(*fields)
        return cls(
            r.i32("ReqId.client_id"),
            r.i32("ReqId.generation"),
            r.i32("ReqId.partition_id"),
            r.i32("ReqId.seq"),
        )


@dataclass(frozen=True, slots=True)
class RecordHeader:
    """A record without its data. On the wire: ``RECORD_HEADER`` in format 1,
    ``TIMED_HEADER`` (the commit time after the header) in format 2."""

    transaction_id: int
    req_id: ReqId
    header: int
    timestamp: int = NO_TIMESTAMP  # commit time, ms since the Unix epoch (format 2)

    def encode(self, fmt: RecordFormat | None = None) -> bytes:
        q = self.req_id
        fields = (self.transaction_id, q.client_id, q.generation, q.partition_id, q.seq)
        if (fmt or DEFAULT_FORMAT).version >= 2:
            return TIMED_HEADER.pack(*fields, self.header, self.timestamp)
        return RECORD_HEADER.pack(*fields, self.header)

    @classmethod
    def read(cls, r: Reader, fmt: RecordFormat | None = None) -> RecordHeader:
        layout = TIMED_HEADER if (fmt or DEFAULT_FORMAT).version >= 2 else RECORD_HEADER
        fields = r.peek(layout)  # a feed carries one a transaction: one unpack
        if fields is not None:
            r.skip(layout.size)
            txid, client_id, generation, partition_id, seq, header, *timed = fields
            return cls(txid, ReqId(client_id, generation, partition_id, seq), header, *timed)
        txid = r.i64("RecordHeader.transaction_id")
        req_id = ReqId.read(r)
        header = r.i32("RecordHeader.header")
        if layout is TIMED_HEADER:
            return cls(txid, req_id, header, r.i64("RecordHeader.timestamp"))
        return cls(txid, req_id, header)


@dataclass(frozen=True, slots=True)
class Record:
    transaction_id: int
    req_id: ReqId
    header: int
    data: bytes
    timestamp: int = NO_TIMESTAMP  # commit time, ms since the Unix epoch (format 2)

    @property
    def checksum(self) -> int:
        return crc32(self.data)

    def encode(self, fmt: RecordFormat = DEFAULT_FORMAT) -> bytes:
        q = self.req_id
        fields = (
            self.transaction_id,
            q.client_id,
            q.generation,
            q.partition_id,
            q.seq,
            self.header,
            len(self.data),
        )
        timed = (self.timestamp,) if fmt.version >= 2 else ()
        head = fmt.head.pack(*fields, *timed)
        return b"".join((head, self.data, CRC.pack(crc32(self.data))))

    @classmethod
    def read(
        cls,
        r: Reader,
        max_data_bytes: int = DEFAULT_MAX_DATA_BYTES,
        fmt: RecordFormat = DEFAULT_FORMAT,
    ) -> Record:
        txid = r.i64("Record.transaction_id")
        req_id = ReqId.read(r)
        header = r.i32("Record.header")
        length = r.i32("Record.data length")
        if length < 0 or length > max_data_bytes:
            raise MalformedMessage(f"Record.data length {length} is outside 0..{max_data_bytes}")
        timestamp = r.i64("Record.timestamp") if fmt.version >= 2 else NO_TIMESTAMP
        data = r.raw(length, "Record.data")
        checksum = r.u32("Record.checksum")
        if crc32(data) != checksum:
            raise ChecksumMismatch(
                f"transaction {txid}: data CRC-32 {crc32(data):#010x} != sent {checksum:#010x}"
            )
        return cls(txid, req_id, header, data, timestamp)


class RecordBatch:
    """Consecutive wire records kept as bytes, validated once.

    ``spans`` gives ``(transaction id, offset, data length)`` for each
    record, offsets into ``buf``; the fixed head of a record is the
    ``format.head_size`` bytes at its offset, its data follows, then the 4-byte data CRC.
    """

    __slots__ = ("buf", "format", "spans")

    def __init__(
        self, buf: bytes, spans: list[tuple[int, int, int]], fmt: RecordFormat = DEFAULT_FORMAT
    ) -> None:
        self.buf = buf
        self.spans = spans
        self.format = fmt

    def __len__(self) -> int:
        return len(self.spans)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RecordBatch)
            and self.buf == other.buf
            and self.format.version == other.format.version
        )

    def __repr__(self) -> str:
        if not self.spans:
            return "RecordBatch(empty)"
        return f"RecordBatch({len(self.spans)} records, txid {self.first_txid}..{self.last_txid})"

    @property
    def first_txid(self) -> int:
        return self.spans[0][0]

    @property
    def last_txid(self) -> int:
        return self.spans[-1][0]

    @property
    def data_bytes(self) -> int:
        return sum(length for _, _, length in self.spans)

    @classmethod
    def from_records(cls, records: list[Record], fmt: RecordFormat = DEFAULT_FORMAT) -> RecordBatch:
        buf = b"".join(rec.encode(fmt) for rec in records)
        spans = []
        pos = 0
        for rec in records:
            spans.append((rec.transaction_id, pos, len(rec.data)))
            pos += fmt.head_size + len(rec.data) + CRC.size
        return cls(buf, spans, fmt)

    @classmethod
    def read(
        cls,
        r: Reader,
        count: int,
        max_data_bytes: int = DEFAULT_MAX_DATA_BYTES,
        fmt: RecordFormat = DEFAULT_FORMAT,
    ) -> RecordBatch:
        """Validate ``count`` records at the reader's cursor and keep their bytes."""
        buf = bytes(r.rest())
        head_size = fmt.head_size
        if native is not None:
            checked = native.scan_wire(buf, count, max_data_bytes, head_size)
            if checked is not None:
                return cls(buf, checked, fmt)
        # The hot loop of every append and read where the compiled one is missing, and
        # what names the problem where it found one: locals, and only the fields it checks.
        mv = memoryview(buf)
        end = len(buf)
        spans: list[tuple[int, int, int]] = []
        append = spans.append
        txid_and_length = _TXID_AND_LENGTH.unpack_from
        stored_crc = CRC.unpack_from
        crc32 = fast_crc32
        pos = 0
        for i in range(count):
            if end - pos < head_size:
                raise MalformedMessage(f"record {i} of {count}: truncated head at offset {pos}")
            txid, length = txid_and_length(buf, pos)
            if length < 0 or length > max_data_bytes:
                raise MalformedMessage(
                    f"record {i} (transaction {txid}): data length {length} "
                    f"is outside 0..{max_data_bytes}"
                )
            data_end = pos + head_size + length
            if end - data_end < 4:
                raise MalformedMessage(
                    f"record {i} (transaction {txid}): data length {length} runs past the frame"
                )
            actual = crc32(mv[pos + head_size : data_end])
            if actual != stored_crc(buf, data_end)[0]:
                (sent,) = stored_crc(buf, data_end)
                raise ChecksumMismatch(
                    f"transaction {txid}: data CRC-32 {actual:#010x} != sent {sent:#010x}"
                )
            append((txid, pos, length))
            pos = data_end + 4
        if pos != end:
            raise MalformedMessage(f"record list: {end - pos} trailing bytes after {count} records")
        return cls(buf, spans, fmt)

    def records(self) -> Iterator[Record]:
        buf = self.buf
        head = WIRE_RECORD_HEAD.unpack_from
        head_size = self.format.head_size
        timed = self.format.version >= 2
        for txid, pos, length in self.spans:
            _, c, g, p, s, header, _ = head(buf, pos)
            timestamp = _TIMESTAMP.unpack_from(buf, pos + 32)[0] if timed else NO_TIMESTAMP
            start = pos + head_size
            yield Record(txid, ReqId(c, g, p, s), header, buf[start : start + length], timestamp)

    def timestamps(self) -> list[int]:
        """Each record's commit time (``NO_TIMESTAMP`` for every one of format 1)."""
        if self.format.version < 2:
            return [NO_TIMESTAMP] * len(self.spans)
        buf = self.buf
        return [_TIMESTAMP.unpack_from(buf, pos + 32)[0] for _, pos, _ in self.spans]

    def headers(self) -> Iterator[RecordHeader]:
        for rec in self.records():
            yield RecordHeader(rec.transaction_id, rec.req_id, rec.header, rec.timestamp)

    def convert(self, fmt: RecordFormat) -> RecordBatch:
        """The same records in record format ``fmt``, for and from older peers (format 1
        has no commit time: converting to it drops the times, from it gives each record
        ``NO_TIMESTAMP``). Bytes moved, nothing recomputed: a record's CRC covers its data
        only, and every format's head starts with format 1's."""
        old = self.format
        if old.version == fmt.version:
            return self
        mv = memoryview(self.buf)
        data_at, new_head = old.head_size, fmt.head_size
        timed = fmt.version >= 2
        parts: list[bytes | memoryview] = []
        add = parts.append
        spans: list[tuple[int, int, int]] = []
        pos = 0
        for txid, at, length in self.spans:
            add(mv[at : at + _SHARED_HEAD])
            if timed:
                add(_NO_TIME)
            add(mv[at + data_at : at + data_at + length + CRC.size])  # the data and its CRC
            spans.append((txid, pos, length))
            pos += new_head + length + CRC.size
        return RecordBatch(b"".join(parts), spans, fmt)


class UncheckedRecords:
    """Wire records counted but neither walked nor checked: what a server relays from a
    storage node to a range-read client, which checks every record (bounds, IDs, CRCs)
    itself when it decodes them. ``check`` decodes them here instead."""

    __slots__ = ("buf", "count", "format")

    def __init__(
        self, buf: bytes | memoryview, count: int, fmt: RecordFormat = DEFAULT_FORMAT
    ) -> None:
        self.buf = buf
        self.count = count
        self.format = fmt

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"UncheckedRecords({self.count} records, {len(self.buf)} bytes)"

    @property
    def first_txid(self) -> int | None:
        """The first record's transaction ID as it claims (None: no record, or too short)."""
        if not self.count or len(self.buf) < 8:
            return None
        txid: int = _TXID.unpack_from(self.buf)[0]
        return txid

    @property
    def last_txid(self) -> int | None:
        """The last record's ID if the IDs are consecutive, as a check finds them."""
        first = self.first_txid
        return None if first is None else first + self.count - 1

    def check(self, max_data_bytes: int = DEFAULT_MAX_DATA_BYTES) -> RecordBatch:
        return RecordBatch.read(Reader(self.buf), self.count, max_data_bytes, self.format)
