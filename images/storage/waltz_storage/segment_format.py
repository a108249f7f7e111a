"""The byte layout of a segment's files, and the checks of a header and of a record.

Both files of a segment, ``<first txid>.seg`` (records) and ``.idx`` (offsets), start with
the same 128-byte header::

    i32 format version | i64 creation time (ms) | 16-byte cluster key | i32 partition id
    | i64 first transaction id | u32 CRC-32 of the previous 40 bytes | 84 reserved zero bytes

A record in the ``.seg`` file::

    i64 transaction id | ReqId (4 x i32) | i32 header | i32 data length | u32 data CRC-32
    | data | u32 record CRC-32 (of the 36 bytes before the data)

The ``.idx`` file holds one i64 record offset per transaction after its header.

Pure (no files, no clock): the segment (``segment.py``), recovery and the offline tools
all read and write the files through these.
"""

from __future__ import annotations

import struct
import uuid
import zlib

from waltz_client.wire.crc import crc32 as fast_crc32
from waltz_client.wire.records import FORMAT_1, RecordFormat

from .errors import CorruptSegment

FORMAT_VERSION = 1
HEADER_BYTES = 128
_HEADER = struct.Struct(">iq16siq")
CRC = struct.Struct(">I")  # after the header, and after each record's data
RECORD_HEAD = struct.Struct(">qiiiiiiI")  # txid, reqid(4), header, data length, data crc
RECORD_HEAD_BYTES = RECORD_HEAD.size  # 36
RECORD_OVERHEAD = RECORD_HEAD_BYTES + CRC.size  # 40 bytes around the data
_TXID_AND_LENGTH = struct.Struct(">q20xi")  # a head's first field and its data length


def segment_stem(first_txid: int) -> str:
    return f"{first_txid:019d}"


def encode_header(
    cluster_key: uuid.UUID, partition_id: int, first_txid: int, created_ms: int
) -> bytes:
    head = _HEADER.pack(FORMAT_VERSION, created_ms, cluster_key.bytes, partition_id, first_txid)
    return (head + CRC.pack(zlib.crc32(head))).ljust(HEADER_BYTES, b"\x00")


def decode_header(data: bytes, path: str) -> tuple[int, int, uuid.UUID, int, int]:
    """(version, created ms, cluster key, partition id, first txid); CorruptSegment if bad."""
    if len(data) < HEADER_BYTES:
        raise CorruptSegment(f"{path}: header is {len(data)} bytes, expected {HEADER_BYTES}")
    version, created, key, partition_id, first = _HEADER.unpack_from(data)
    (crc,) = CRC.unpack_from(data, _HEADER.size)
    if zlib.crc32(data[: _HEADER.size]) != crc:
        raise CorruptSegment(f"{path}: header checksum mismatch")
    if version != FORMAT_VERSION:
        raise CorruptSegment(f"{path}: format version {version} not supported")
    return version, created, uuid.UUID(bytes=key), partition_id, first


def cut_short(length: int, follow: int) -> str:
    """The problem of a record whose head says ``length`` data bytes where ``follow``
    bytes are left after the head."""
    return f"record cut short (head says {length} data bytes, {follow} follow)"


def disk_head_bytes(fmt: RecordFormat) -> int:
    """A record's head on disk: the wire head, then the data CRC (36 or 44 bytes)."""
    return fmt.head_size + CRC.size


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
