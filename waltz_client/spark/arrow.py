"""Wire record batches to Arrow record batches, without one Python object per record.

A range-read response is the records' wire bytes (``RecordBatch``): a fixed head (32
bytes in record format 1, 40 in format 2: the same fields, then the commit time), the
data, a 4-byte CRC, then the next record. numpy gathers the head fields from
every record at once; the data column is the records' data copied once into one
buffer by Arrow itself (from views into the response's bytes). The ``timestamp``
column is the commit time (Spark's TimestampType: microseconds, UTC), null for a
record without one (``NO_TIMESTAMP``, and every record of format 1).
"""

from __future__ import annotations

import struct
from typing import NoReturn

import numpy as np
import pyarrow as pa

from waltz_client.wire.crc import crc32
from waltz_client.wire.errors import MalformedMessage
from waltz_client.wire.records import (
    DEFAULT_MAX_DATA_BYTES,
    NO_TIMESTAMP,
    RecordBatch,
    RecordFormat,
    UncheckedRecords,
)

# The columns after client_id come last, so code that picks columns by position keeps
# working as columns are added.
SCHEMA_DDL = (
    "partition int, transaction_id long, header int, data binary, client_id long, "
    "timestamp timestamp"
)
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")  # what Spark's TimestampType is in Arrow
ARROW_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("transaction_id", pa.int64()),
        ("header", pa.int32()),
        ("data", pa.binary()),
        ("client_id", pa.int64()),
        ("timestamp", TIMESTAMP_TYPE),
    ]
)

# A head: txid i64 | client, generation, partition, seq i32 | header | len (| time i64):
# the data starts at the batch's ``format.head_size``.
_CLIENT_ID_AT = 8
_HEADER_AT = 24
_TIMESTAMP_AT = 32  # format 2 on: the commit time, ms since the Unix epoch
_FOUR = np.arange(4, dtype=np.int64)
_TWELVE = np.arange(12, dtype=np.int64)
_INLINE = 12  # a binary view holds data up to this long in itself


def to_arrow(partition_id: int, batch: RecordBatch) -> pa.RecordBatch:
    n = len(batch.spans)
    if n == 0:
        return _empty()
    spans = np.array(batch.spans, dtype=np.int64).reshape(n, 3)
    txids, positions, lengths = spans[:, 0], spans[:, 1], spans[:, 2]
    raw = np.frombuffer(batch.buf, dtype=np.uint8)
    fmt = batch.format
    return _record_batch(
        partition_id, batch.buf, raw, fmt, positions + fmt.head_size, positions, txids, lengths
    )


def _gather(raw: np.ndarray, offsets: np.ndarray, width: int, dtype: str) -> np.ndarray:
    """The ``width`` bytes at each of ``offsets``, read as ``dtype`` (one per offset)."""
    return raw[offsets[:, None] + np.arange(width)].view(dtype).reshape(len(offsets))


def _record_batch(
    partition_id: int,
    buf: bytes | memoryview,
    raw: np.ndarray,
    fmt: RecordFormat,
    starts: np.ndarray,
    positions: np.ndarray,
    txids: np.ndarray,
    lengths: np.ndarray,
) -> pa.RecordBatch:
    """The Arrow batch of checked wire records at ``positions`` in ``buf``, their data
    at ``starts``."""
    n = len(positions)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(n, partition_id, dtype=np.int32)),
            pa.array(txids),
            pa.array(_gather(raw, positions + _HEADER_AT, 4, ">i4").astype(np.int32)),
            _data_column(buf, raw, starts, lengths),
            pa.array(_gather(raw, positions + _CLIENT_ID_AT, 4, ">i4").astype(np.int64)),
            _timestamp_column(raw, fmt, positions),
        ],
        schema=ARROW_SCHEMA,
    )


def _timestamp_column(raw: np.ndarray, fmt: RecordFormat, positions: np.ndarray) -> pa.Array:
    """Each record's commit time in microseconds, null where it has none."""
    n = len(positions)
    if fmt.head_size < _TIMESTAMP_AT + 8:  # format 1: no commit times
        return pa.nulls(n, TIMESTAMP_TYPE)
    millis = _gather(raw, positions + _TIMESTAMP_AT, 8, ">i8")
    missing = millis == NO_TIMESTAMP
    micros = millis.astype(np.int64) * 1000
    return pa.array(micros, TIMESTAMP_TYPE, mask=missing if missing.any() else None)


_LENGTH_AT = struct.Struct(">i").unpack_from  # a record's data length, at 28 in its head
_LENGTH_OFFSET = 28
_CRC_BYTES = 4


def checked_to_arrow(
    partition_id: int, records: UncheckedRecords, max_data_bytes: int = DEFAULT_MAX_DATA_BYTES
) -> pa.RecordBatch:
    """``to_arrow(partition_id, records.check(max_data_bytes))`` in one pass, which also
    checks that the IDs are consecutive: walk the lengths to find each record, then
    numpy checks the heads and compares the CRCs. On any fault, ``check`` says what is
    wrong (MalformedMessage, ChecksumMismatch)."""
    n = len(records)
    if n == 0:
        return _empty()
    buf = records.buf
    end = len(buf)
    # The one sequential part: each record's length says where the next one starts.
    positions: list[int] = []
    add = positions.append
    length_at = _LENGTH_AT
    head = records.format.head_size
    overhead = head + _CRC_BYTES
    pos = 0
    for _ in range(n):
        if end - pos < overhead:
            _refuse(records, max_data_bytes)
        length = length_at(buf, pos + _LENGTH_OFFSET)[0]
        if length < 0 or length > max_data_bytes or end - pos - overhead < length:
            _refuse(records, max_data_bytes)
        add(pos)
        pos += overhead + length
    if pos != end:
        _refuse(records, max_data_bytes)
    raw = np.frombuffer(buf, dtype=np.uint8)
    at = np.array(positions, dtype=np.int64)
    lengths = _gather(raw, at + _LENGTH_OFFSET, 4, ">i4").astype(np.int64)
    starts = at + head
    stops = starts + lengths
    mv = memoryview(buf)
    actual = np.fromiter(
        (crc32(mv[a:b]) for a, b in zip(starts.tolist(), stops.tolist(), strict=True)),
        dtype=np.uint32,
        count=n,
    )
    if not np.array_equal(actual, _gather(raw, stops, 4, ">u4")):
        _refuse(records, max_data_bytes)
    txids = _gather(raw, at, 8, ">i8").astype(np.int64)
    first = int(txids[0])
    if not np.array_equal(txids, np.arange(first, first + n, dtype=np.int64)):
        i = int(np.argmax(txids != np.arange(first, first + n)))
        raise MalformedMessage(
            f"range read: record {i} is transaction {int(txids[i])}, where {first + i} "
            f"follows {first} without a gap"
        )
    return _record_batch(partition_id, buf, raw, records.format, starts, at, txids, lengths)


def _refuse(records: UncheckedRecords, max_data_bytes: int) -> NoReturn:
    records.check(max_data_bytes)  # raises, naming the record and the fault
    raise MalformedMessage(f"range read: {records!r} failed a check that check() passed")


def _data_column(buf: bytes, raw: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """The records' data as an Arrow binary column: views into the batch's own bytes
    (Arrow's binary view layout, built by numpy), then one cast in Arrow's C++ that
    copies the data out contiguously, instead of a Python slice per record."""
    n = len(starts)
    views = np.zeros((n, 4), dtype="<i4")  # length | prefix (4 bytes) | buffer 0 | offset
    views[:, 0] = lengths
    long = lengths > _INLINE
    views[long, 1] = raw[starts[long, None] + _FOUR].view("<i4").reshape(-1)
    views[long, 3] = starts[long]
    short = ~long
    if short.any():  # up to 12 bytes sit in the view itself, zero-padded
        inline = np.minimum(starts[short, None] + _TWELVE, len(raw) - 1)
        data = raw[inline] * (lengths[short, None] > _TWELVE)
        views.view(np.uint8).reshape(n, 16)[short, 4:] = data
    view_array = pa.Array.from_buffers(
        pa.binary_view(), n, [None, pa.py_buffer(views), pa.py_buffer(buf)]
    )
    return view_array.cast(pa.binary())


def _empty() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
