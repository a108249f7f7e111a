"""Wire record batches to Arrow: every field of every record, for any lengths."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from waltz_client.spark.arrow import ARROW_SCHEMA, to_arrow
from waltz_client.wire.records import Record, RecordBatch, ReqId

i32 = st.integers(-(2**31), 2**31 - 1)
records = st.lists(st.tuples(st.integers(0, 2**40), i32, i32, st.binary(max_size=300)), max_size=40)


@given(records, st.integers(0, 1000))
def test_arrow_batches_hold_exactly_the_records(rows, partition):
    batch = RecordBatch.from_records(
        [
            Record(txid, ReqId(client, 3, partition, i), header, data)
            for i, (txid, client, header, data) in enumerate(rows)
        ]
    )
    table = to_arrow(partition, batch)
    assert table.schema == ARROW_SCHEMA
    assert table.to_pylist() == [
        {
            "partition": partition,
            "transaction_id": txid,
            "header": header,
            "data": data,
            "client_id": client,
        }
        for txid, client, header, data in rows
    ]


def test_an_arrow_batch_from_a_decoded_response_is_independent_of_its_buffer():
    """The data column is a copy: the response buffer can go."""
    batch = RecordBatch.from_records([Record(7, ReqId(1, 1, 0, 1), 2, b"payload")])
    table = to_arrow(0, batch)
    del batch
    assert table.column("data").to_pylist() == [b"payload"]
