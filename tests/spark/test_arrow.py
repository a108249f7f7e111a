"""Wire record batches to Arrow: every field of every record, for any lengths."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz_client.spark.arrow import ARROW_SCHEMA, checked_to_arrow, to_arrow
from waltz_client.wire.errors import ChecksumMismatch, MalformedMessage
from waltz_client.wire.records import Record, RecordBatch, ReqId, UncheckedRecords

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


def _wire(rows, first=0):
    return RecordBatch.from_records(
        [
            Record(first + i, ReqId(client, 3, 0, i), header, data)
            for i, (client, header, data) in enumerate(rows)
        ]
    ).buf


unchecked_rows = st.lists(st.tuples(i32, i32, st.binary(max_size=300)), max_size=40)


@given(unchecked_rows, st.integers(0, 2**40), st.integers(0, 1000))
def test_checking_while_converting_equals_checking_then_converting(rows, first, partition):
    records = UncheckedRecords(memoryview(b"xx" + _wire(rows, first))[2:], len(rows))
    table = checked_to_arrow(partition, records)
    assert table.equals(to_arrow(partition, records.check()))


def test_a_conversion_that_checks_refuses_what_check_refuses():
    rows = [(7, i, bytes([i]) * (20 + i)) for i in range(10)]
    good = _wire(rows, 100)

    def refused(buf: bytes, count: int = len(rows)) -> str:
        with pytest.raises((MalformedMessage, ChecksumMismatch)) as e:
            checked_to_arrow(0, UncheckedRecords(buf, count))
        with pytest.raises(type(e.value)):  # the same verdict as the record-by-record check
            UncheckedRecords(buf, count).check()
        return str(e.value)

    flipped = bytearray(good)
    flipped[32 + 5] ^= 1  # in the first record's data
    assert "CRC-32" in refused(bytes(flipped))
    assert "truncated" in refused(good[:-40]) or "runs past" in refused(good[:-40])
    assert "trailing" in refused(good + b"\x00")
    assert "outside 0.." in refused(good[:28] + b"\x7f\xff\xff\xff" + good[32:])
    assert "truncated" in refused(good, len(rows) + 1)
    gap = _wire(rows[:5], 100) + _wire(rows[5:], 106)
    with pytest.raises(MalformedMessage, match="record 5 is transaction 106, where 105"):
        checked_to_arrow(0, UncheckedRecords(gap, len(rows)))
