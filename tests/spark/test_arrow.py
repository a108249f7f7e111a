"""Wire record batches to Arrow: every field of every record, for any lengths."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz_client.spark.arrow import ARROW_SCHEMA, checked_to_arrow, to_arrow
from waltz_client.wire.errors import ChecksumMismatch, MalformedMessage
from waltz_client.wire.records import (
    FORMAT_1,
    FORMAT_2,
    NO_TIMESTAMP,
    Record,
    RecordBatch,
    RecordFormat,
    ReqId,
    UncheckedRecords,
)

i32 = st.integers(-(2**31), 2**31 - 1)
# A commit time: ms since the Unix epoch, or -1 (NO_TIMESTAMP) for a record without one.
times = st.one_of(st.just(NO_TIMESTAMP), st.integers(0, 2**53))
records = st.lists(
    st.tuples(st.integers(0, 2**40), i32, i32, st.binary(max_size=300), times), max_size=40
)
# Record format 1 (32-byte heads) or 2 (40: the commit time after the length): the same rows.
formats = st.sampled_from([FORMAT_1, FORMAT_2])


def _micros(table: pa.RecordBatch) -> list[int | None]:
    """The timestamp column as microseconds since the Unix epoch (None: null)."""
    return table.column("timestamp").cast(pa.int64()).to_pylist()


@given(records, st.integers(0, 1000), formats)
def test_arrow_batches_hold_exactly_the_records(rows, partition, fmt):
    batch = RecordBatch.from_records(
        [
            Record(txid, ReqId(client, 3, partition, i), header, data, time)
            for i, (txid, client, header, data, time) in enumerate(rows)
        ],
        fmt,
    )
    table = to_arrow(partition, batch)
    assert table.schema == ARROW_SCHEMA
    assert table.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert table.drop_columns(["timestamp"]).to_pylist() == [
        {
            "partition": partition,
            "transaction_id": txid,
            "header": header,
            "data": data,
            "client_id": client,
        }
        for txid, client, header, data, _ in rows
    ]
    # The commit time in microseconds; null without one, for every record of format 1.
    assert _micros(table) == [
        None if fmt is FORMAT_1 or time == NO_TIMESTAMP else time * 1000 for *_, time in rows
    ]


def test_an_arrow_batch_from_a_decoded_response_is_independent_of_its_buffer():
    """The data column is a copy: the response buffer can go."""
    batch = RecordBatch.from_records([Record(7, ReqId(1, 1, 0, 1), 2, b"payload")])
    table = to_arrow(0, batch)
    del batch
    assert table.column("data").to_pylist() == [b"payload"]


def _wire(rows, first=0, fmt: RecordFormat = FORMAT_2):
    return RecordBatch.from_records(
        [
            Record(first + i, ReqId(client, 3, 0, i), header, data, *time)
            for i, (client, header, data, *time) in enumerate(rows)
        ],
        fmt,
    ).buf


unchecked_rows = st.lists(st.tuples(i32, i32, st.binary(max_size=300), times), max_size=40)


@given(unchecked_rows, st.integers(0, 2**40), st.integers(0, 1000), formats)
def test_checking_while_converting_equals_checking_then_converting(rows, first, partition, fmt):
    records = UncheckedRecords(memoryview(b"xx" + _wire(rows, first, fmt))[2:], len(rows), fmt)
    table = checked_to_arrow(partition, records)
    assert table.equals(to_arrow(partition, records.check()))
    assert _micros(table) == [
        None if fmt is FORMAT_1 or time == NO_TIMESTAMP else time * 1000 for *_, time in rows
    ]
    # The same records in the other format: the same rows, but for the commit times
    # (format 1 has none).
    other = FORMAT_1 if fmt is FORMAT_2 else FORMAT_2
    again = checked_to_arrow(
        partition, UncheckedRecords(_wire(rows, first, other), len(rows), other)
    )
    assert again.drop_columns(["timestamp"]).equals(table.drop_columns(["timestamp"]))
    if FORMAT_1 in (fmt, other):
        one = table if fmt is FORMAT_1 else again
        assert one.column("timestamp").null_count == len(rows)


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
    flipped[FORMAT_2.head_size + 5] ^= 1  # in the first record's data
    assert "CRC-32" in refused(bytes(flipped))
    assert "truncated" in refused(good[:-40]) or "runs past" in refused(good[:-40])
    assert "trailing" in refused(good + b"\x00")
    assert "outside 0.." in refused(good[:28] + b"\x7f\xff\xff\xff" + good[32:])
    assert "truncated" in refused(good, len(rows) + 1)
    gap = _wire(rows[:5], 100) + _wire(rows[5:], 106)
    with pytest.raises(MalformedMessage, match="record 5 is transaction 106, where 105"):
        checked_to_arrow(0, UncheckedRecords(gap, len(rows)))
