"""Wire record batches to Arrow record batches, without one Python object per record.

A range-read response is the records' wire bytes (``RecordBatch``): a 32-byte head,
the data, a 4-byte CRC, then the next record. numpy gathers the head fields from
every record at once; the data column is the records' data copied once into one
buffer, and its offsets are a running sum of the lengths.
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

    starts = (positions + _HEAD).tolist()
    values = np.concatenate([raw[s : s + n] for s, n in zip(starts, lengths.tolist(), strict=True)])
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(values)]
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(n, partition_id, dtype=np.int32)),
            pa.array(txids),
            pa.array(big_endian_i32(_HEADER_AT)),
            data,
            pa.array(big_endian_i32(_CLIENT_ID_AT).astype(np.int64)),
        ],
        schema=ARROW_SCHEMA,
    )


def _empty() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
