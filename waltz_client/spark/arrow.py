"""Wire record batches to Arrow record batches, without one Python object per record.

A range-read response is the records' wire bytes (``RecordBatch``): a 32-byte head,
the data, a 4-byte CRC, then the next record. numpy gathers the head fields from
every record at once; the data column is the records' data copied once into one
buffer by Arrow itself (from views into the response's bytes).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from waltz_client.wire.records import WIRE_RECORD_HEAD, RecordBatch

SCHEMA_DDL = "partition int, transaction_id long, header int, data binary, client_id long"
ARROW_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("transaction_id", pa.int64()),
        ("header", pa.int32()),
        ("data", pa.binary()),
        ("client_id", pa.int64()),
    ]
)

_HEAD = WIRE_RECORD_HEAD.size  # txid i64 | client, generation, partition, seq i32 | header | len
_CLIENT_ID_AT = 8
_HEADER_AT = 24
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

    def big_endian_i32(offset: int) -> np.ndarray:
        gathered = raw[(positions + offset)[:, None] + _FOUR]  # n x 4 bytes, contiguous
        return gathered.view(">i4").reshape(n).astype(np.int32)

    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(n, partition_id, dtype=np.int32)),
            pa.array(txids),
            pa.array(big_endian_i32(_HEADER_AT)),
            _data_column(batch.buf, raw, positions + _HEAD, lengths),
            pa.array(big_endian_i32(_CLIENT_ID_AT).astype(np.int64)),
        ],
        schema=ARROW_SCHEMA,
    )


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
