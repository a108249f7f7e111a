"""The byte layout of a segment's files, and the checks of a header and of a record.

Both files of a segment, ``<first txid>.seg`` (records) and ``.idx`` (offsets), start with
the same 128-byte header::

    i32 format version | i64 creation time (ms) | 16-byte cluster key | i32 partition id
    | i64 first transaction id | u32 CRC-32 of the previous 40 bytes | 84 reserved zero bytes

The format version says how the segment's records are laid out: version N holds wire
records of record format N (``waltz_client.wire.records``). New segments are version 2;
version 1 is what nodes before commit times wrote, read as it is and never rewritten.

A record in the ``.seg`` file is its wire head, the data CRC, the data, and a CRC of the
head and data CRC. Version 1 (a 36-byte head, 40 + data bytes a record)::

    i64 transaction id | ReqId (4 x i32) | i32 header | i32 data length | u32 data CRC-32
    | data | u32 record CRC-32 (of the 36 bytes before the data)

Version 2 (a 44-byte head, 48 + data bytes a record) adds the commit time after the
data length, so the length stays at offset 28::

    i64 transaction id | ReqId (4 x i32) | i32 header | i32 data length
    | i64 commit time (ms since the Unix epoch) | u32 data CRC-32
    | data | u32 record CRC-32 (of the 44 bytes before the data)

The ``.idx`` file holds one i64 record offset per transaction after its header.

Pure (no files, no clock): the segment (``segment.py``), recovery and the offline tools
all read and write the files through these.
"""

from __future__ import annotations

import struct
import uuid
import zlib

from waltz_client.wire.crc import crc32 as fast_crc32
from waltz_client.wire.records import FORMAT_1, FORMAT_2, RecordFormat

from .errors import CorruptSegment

FORMAT_VERSION = 2  # what new segments get
# Each segment header version and the record format of its records.
SEGMENT_RECORD_FORMATS = {1: FORMAT_1, 2: FORMAT_2}
HEADER_BYTES = 128
_HEADER = struct.Struct(">iq16siq")
CRC = struct.Struct(">I")  # after the header, and after each record's data
# Format 1's record head and overhead: the smallest of any format (bounds use them).
RECORD_HEAD = struct.Struct(">qiiiiiiI")  # txid, reqid(4), header, data length, data crc
RECORD_HEAD_BYTES = RECORD_HEAD.size  # 36
RECORD_OVERHEAD = RECORD_HEAD_BYTES + CRC.size  # 40 bytes around the data
_TXID_AND_LENGTH = struct.Struct(">q20xi")  # a head's first field and its data length
DATA_LENGTH = struct.Struct(">28xi")  # a head's data length: at offset 28 in every format


def segment_stem(first_txid: int) -> str:
    return f"{first_txid:019d}"


def segment_version(fmt: RecordFormat) -> int:
    """The segment header version of a segment holding records of format ``fmt``."""
    if SEGMENT_RECORD_FORMATS.get(fmt.version) != fmt:
        raise ValueError(f"no segment format holds records of format {fmt.version}")
    return fmt.version


def record_format_of(version: int) -> RecordFormat:
    """The record format of a segment whose header says format ``version`` (1 or 2)."""
    fmt = SEGMENT_RECORD_FORMATS.get(version)
    if fmt is None:
        raise ValueError(f"segment format version {version} not supported")
    return fmt


def encode_header(
    cluster_key: uuid.UUID,
    partition_id: int,
    first_txid: int,
    created_ms: int,
    version: int = FORMAT_VERSION,
) -> bytes:
    record_format_of(version)  # a version this build reads back
    head = _HEADER.pack(version, created_ms, cluster_key.bytes, partition_id, first_txid)
    return (head + CRC.pack(zlib.crc32(head))).ljust(HEADER_BYTES, b"\x00")


def decode_header(data: bytes, path: str) -> tuple[int, int, uuid.UUID, int, int]:
    """(version, created ms, cluster key, partition id, first txid); CorruptSegment if bad."""
    if len(data) < HEADER_BYTES:
        raise CorruptSegment(f"{path}: header is {len(data)} bytes, expected {HEADER_BYTES}")
    version, created, key, partition_id, first = _HEADER.unpack_from(data)
    (crc,) = CRC.unpack_from(data, _HEADER.size)
    if zlib.crc32(data[: _HEADER.size]) != crc:
        raise CorruptSegment(f"{path}: header checksum mismatch")
    if version not in SEGMENT_RECORD_FORMATS:
        raise CorruptSegment(f"{path}: format version {version} not supported")
    return version, created, uuid.UUID(bytes=key), partition_id, first


def cut_short(length: int, follow: int) -> str:
    """The problem of a record whose head says ``length`` data bytes where ``follow``
    bytes are left after the head."""
    return f"record cut short (head says {length} data bytes, {follow} follow)"


def disk_head_bytes(fmt: RecordFormat) -> int:
    """A record's head on disk: the wire head, then the data CRC (36 or 44 bytes)."""
    return fmt.head_size + CRC.size


def disk_overhead(fmt: RecordFormat) -> int:
    """The bytes a record of format ``fmt`` takes on disk besides its data (40 or 48)."""
    return fmt.head_size + 2 * CRC.size


def disk_bytes_bound(wire_bytes: int) -> int:
    """The most bytes records of ``wire_bytes`` on the wire take in a new segment: a record
    of format 1 (an older server's, 36 + data bytes) takes 48 + data, 4/3 of it, the
    largest ratio of any format (format 2: 48/44)."""
    new = disk_overhead(SEGMENT_RECORD_FORMATS[FORMAT_VERSION])
    smallest = min(fmt.head_size + CRC.size for fmt in SEGMENT_RECORD_FORMATS.values())
    return wire_bytes * new // smallest


def check_record(
    buf: bytes | memoryview, pos: int, expected_txid: int, fmt: RecordFormat = FORMAT_1
) -> str | None:
    """Why the record at ``pos`` is not a whole, valid record of ``expected_txid`` (None if it is).

    ``buf`` must extend at least to the record's end for a valid record. ``fmt``: the
    record format of the segment (its head size; the rest is laid out alike).
    """
    end = len(buf)
    head_bytes = disk_head_bytes(fmt)
    if end - pos < head_bytes:
        return f"record head cut short ({end - pos} of {head_bytes} bytes)"
    txid, length = _TXID_AND_LENGTH.unpack_from(buf, pos)
    (data_crc,) = CRC.unpack_from(buf, pos + fmt.head_size)
    head_end = pos + head_bytes
    if end - head_end >= length + 4 and length >= 0:
        (record_crc,) = CRC.unpack_from(buf, head_end + length)
        head_ok = fast_crc32(memoryview(buf)[pos:head_end]) == record_crc
    else:
        head_ok = False
    if not head_ok:
        if length < 0 or end - head_end < length + 4:
            return cut_short(length, end - head_end)
        return "record checksum mismatch"
    if txid != expected_txid:
        return f"transaction id {txid} where {expected_txid} was expected"
    if fast_crc32(memoryview(buf)[head_end : head_end + length]) != data_crc:
        return f"data checksum mismatch in transaction {txid}"
    return None
