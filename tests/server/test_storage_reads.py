"""Cutting a range read to the client's byte limit (``storage_reads.cut_to_bytes``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from waltz_client.wire.buffers import Reader
from waltz_client.wire.records import Record, RecordBatch, ReqId
from waltz_server.storage_reads import cut_to_bytes


def _batch(sizes: list[int], first: int = 7) -> RecordBatch:
    return RecordBatch.from_records(
        [
            Record(first + i, ReqId(1, 1, 0, i), 0, bytes([i % 256]) * size)
            for i, size in enumerate(sizes)
        ]
    )


def test_records_are_kept_while_their_data_fits():
    cut = cut_to_bytes(_batch([10, 20, 30, 5]), 35)
    assert [s[0] for s in cut.spans] == [7, 8]
    assert cut == _batch([10, 20])


def test_the_first_record_is_kept_even_beyond_the_limit():
    cut = cut_to_bytes(_batch([100, 1]), 10)
    assert cut == _batch([100])


@given(st.lists(st.integers(0, 300), min_size=1, max_size=30), st.integers(0, 3000))
def test_a_cut_is_the_longest_prefix_within_the_limit(sizes: list[int], max_bytes: int):
    batch = _batch(sizes)
    cut = cut_to_bytes(batch, max_bytes)
    kept = len(cut)
    assert 1 <= kept <= len(sizes)
    assert cut == _batch(sizes[:kept])
    assert kept == 1 or cut.data_bytes <= max_bytes
    if kept < len(sizes):
        assert cut.data_bytes + sizes[kept] > max_bytes
    # What is relayed decodes as exactly the records kept.
    assert RecordBatch.read(Reader(cut.buf), kept) == cut
