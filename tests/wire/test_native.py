"""The compiled per-record loops (waltz_client/wire/_native.c) against the pure-Python
loops they stand in for: the same spans, bytes and CRCs for any records; the same
refusal, with the Python loop's precise error, for any damaged batch or segment.

Each test runs a public function twice, with the compiled module and with it switched
off (the attribute ``native`` of the calling module set to None), and compares.
"""

from __future__ import annotations

import os
import struct
import uuid
import zlib
from array import array
from itertools import accumulate

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from waltz_client.wire import records as records_module
from waltz_client.wire.buffers import Reader
from waltz_client.wire.errors import ChecksumMismatch, MalformedMessage
from waltz_client.wire.native import native
from waltz_client.wire.records import (
    FORMAT_1,
    FORMAT_2,
    NO_TIMESTAMP,
    Record,
    RecordBatch,
    RecordFormat,
    ReqId,
)
from waltz_storage import partition as partition_module
from waltz_storage import segment as segment_module
from waltz_storage.errors import CorruptSegment, NonContiguousAppend
from waltz_storage.partition import PartitionLog
from waltz_storage.segment import disk_to_wire, wire_to_disk

pytestmark = pytest.mark.skipif(
    native is None, reason="the compiled loops are not built here (no C compiler at install)"
)
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_batch(
    first_txid: int, lengths: list[int], seed: int = 0, fmt: RecordFormat = FORMAT_1
) -> RecordBatch:
    records = [
        Record(
            first_txid + i,
            ReqId(7, 1, 3, seed + i),
            i * 31 - 5,
            os.urandom(length),
            1_795_000_000_000 + 7 * i if fmt.version >= 2 else NO_TIMESTAMP,
        )
        for i, length in enumerate(lengths)
    ]
    return RecordBatch.from_records(records, fmt)


formats = st.sampled_from([FORMAT_1, FORMAT_2])


def both(module, call):
    """(compiled result, pure-Python result) of ``call()``; an exception is a result."""
    results = []
    for compiled in (True, False):
        with pytest.MonkeyPatch.context() as m:
            if not compiled:
                m.setattr(module, "native", None)
            try:
                results.append(("ok", call()))
            except Exception as e:  # the comparison is of outcomes, errors included
                results.append((type(e), str(e)))
    return results


lengths_strategy = st.lists(
    st.one_of(st.integers(0, 80), st.integers(0, 5000)), min_size=0, max_size=12
)


# --- CRC-32 ------------------------------------------------------------------------------


@SETTINGS
@given(data=st.binary(max_size=9000), offset=st.integers(0, 15), start=st.integers(0, 2**32 - 1))
def test_crc32_is_zlibs_at_any_length_alignment_and_start(data, offset, start):
    view = memoryview(bytes(offset) + data)[offset:]  # unaligned as well as aligned
    assert native.crc32(view) == zlib.crc32(data)
    assert native.crc32(view, start) == zlib.crc32(data, start)
    assert native.crc32_tables(view, start) == zlib.crc32(data, start)


def test_crc32_over_the_folding_thresholds():
    """Every length around the 64-byte folding start and the 16-byte blocks."""
    block = os.urandom(4096)
    for length in [*range(300), 1023, 1024, 1025, 4095, 4096]:
        assert native.crc32(block[:length]) == zlib.crc32(block[:length]), length
    assert native.crc32(bytearray(b"123456789")) == 0xCBF43926  # the check value


def test_crc32_of_a_large_buffer_with_the_gil_released():
    data = bytearray(os.urandom(3 * 1024 * 1024 + 5))  # past the size that frees the GIL
    assert native.crc32(data) == zlib.crc32(data)
    assert native.crc32(memoryview(data)[7:], 99) == zlib.crc32(memoryview(data)[7:], 99)


# --- checking a wire batch ---------------------------------------------------------------


def read(
    buf: bytes, count: int, max_data_bytes: int = 16 * 1024 * 1024, fmt: RecordFormat = FORMAT_1
) -> RecordBatch:
    return RecordBatch.read(Reader(buf), count, max_data_bytes, fmt)


@SETTINGS
@given(lengths=lengths_strategy, first=st.integers(-5, 2**62), fmt=formats)
def test_a_valid_batch_is_read_the_same(lengths, first, fmt):
    batch = make_batch(first, lengths, fmt=fmt)
    compiled, pure = both(records_module, lambda: read(batch.buf, len(lengths), fmt=fmt))
    assert compiled[0] == "ok" and pure[0] == "ok"
    assert compiled[1].spans == pure[1].spans == batch.spans
    assert compiled[1].buf == batch.buf
    assert [r.timestamp for r in compiled[1].records()] == compiled[1].timestamps()
    expected = [r.timestamp for r in batch.records()]
    assert compiled[1].timestamps() == expected
    if fmt.version >= 2:
        assert expected == [1_795_000_000_000 + 7 * i for i in range(len(lengths))]
    else:
        assert set(expected) <= {NO_TIMESTAMP}


def test_a_record_round_trips_in_either_format():
    rec = Record(5, ReqId(1, 2, 3, 4), 9, b"data", 1_795_000_000_123)
    assert len(rec.encode(FORMAT_2)) == 40 + 4 + 4
    assert Record.read(Reader(rec.encode(FORMAT_2)), fmt=FORMAT_2) == rec
    assert len(rec.encode(FORMAT_1)) == 32 + 4 + 4
    old = Record.read(Reader(rec.encode(FORMAT_1)), fmt=FORMAT_1)  # format 1 has no commit time
    assert old == Record(5, ReqId(1, 2, 3, 4), 9, b"data", NO_TIMESTAMP)
    with pytest.raises(ValueError, match="a record head is 32 or 40 bytes, not 36"):
        native.scan_wire(rec.encode(FORMAT_2), 1, 100, 36)


@SETTINGS
@given(
    lengths=st.lists(st.integers(0, 300), min_size=1, max_size=6),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=3),
    cut=st.integers(-8, 8),
    count_change=st.sampled_from([0, 0, 0, -1, 1, 10**9, -(10**9)]),
    max_data=st.sampled_from([16 * 1024 * 1024, 100, 0]),
    fmt=formats,
)
def test_a_damaged_batch_is_refused_with_the_same_error(
    lengths, flips, cut, count_change, max_data, fmt
):
    batch = make_batch(1, lengths, fmt=fmt)
    buf = bytearray(batch.buf)
    for where, xor in flips:
        buf[where % len(buf)] ^= xor
    buf = bytes(buf[: len(buf) + cut] if cut < 0 else buf + bytes(cut))
    count = len(lengths) + count_change
    compiled, pure = both(records_module, lambda: read(buf, count, max_data, fmt))
    if compiled[0] == "ok":
        assert pure[0] == "ok" and compiled[1].spans == pure[1].spans
    else:
        assert compiled == pure
        assert compiled[0] in (MalformedMessage, ChecksumMismatch)


@SETTINGS
@given(
    garbage=st.binary(max_size=600),
    count=st.integers(-3, 40),
    max_data=st.sampled_from([0, 64, 1 << 24]),
    ends=st.lists(st.integers(-(2**40), 2**40) | st.integers(-5, 700), max_size=8),
    first=st.integers(-(2**63), 2**63 - 1),
    fmt=formats,
)
def test_garbage_is_refused_never_crashes(garbage, count, max_data, ends, first, fmt):
    """Any bytes, counts and ends: the compiled loops return None (or the spans the
    Python loop also finds), never read outside the buffer."""
    spans = native.scan_wire(garbage, count, max_data, fmt.head_size)
    if spans is not None:
        assert spans == read(garbage, count, max_data, fmt).spans
    converted = native.disk_to_wire(garbage, first, ends, fmt.head_size)
    if converted is not None:
        assert converted[0] == disk_to_wire(garbage, first, ends, "g", fmt).buf


def test_a_huge_count_is_refused_without_allocating_for_it():
    batch = make_batch(1, [10])
    assert native.scan_wire(batch.buf, 2**40, 1000) is None
    assert native.scan_wire(batch.buf, -1, 1000) is None
    with pytest.raises(MalformedMessage, match="truncated head"):
        read(batch.buf, 2**31 - 1)


# --- to the disk layout and back ---------------------------------------------------------


@SETTINGS
@given(lengths=lengths_strategy, data=st.data(), fmt=formats)
def test_wire_to_disk_and_back_the_same_either_way(lengths, data, fmt):
    batch = make_batch(40, lengths, fmt=fmt)
    head = fmt.head_size
    start = data.draw(st.integers(0, len(lengths)))
    stop = data.draw(st.integers(start, len(lengths)))
    prefix = data.draw(st.binary(max_size=5))

    def convert():
        out = bytearray(prefix)
        sizes = wire_to_disk(batch, start, stop, out)
        return bytes(out), sizes

    compiled, pure = both(segment_module, convert)
    assert compiled == pure and compiled[0] == "ok"
    disk, sizes = compiled[1][0][len(prefix) :], compiled[1][1]
    assert sizes == [length + head + 8 for length in lengths[start:stop]]
    ends = list(accumulate(sizes))  # where each record ends
    back = both(segment_module, lambda: disk_to_wire(disk, 40 + start, ends, "seg", fmt))
    assert back[0][0] == back[1][0] == "ok"
    assert back[0][1].buf == back[1][1].buf
    assert back[0][1].spans == back[1][1].spans
    assert back[0][1].spans == [
        (40 + start + i, s, n) for i, (_, s, n) in enumerate(back[0][1].spans)
    ]
    # The same bytes as the records cut out of the original batch.
    assert back[0][1].buf == b"".join(
        batch.buf[p : p + head + 4 + n] for _, p, n in batch.spans[start:stop]
    )
    assert back[0][1].timestamps() == batch.timestamps()[start:stop]


@SETTINGS
@given(
    lengths=st.lists(st.integers(0, 200), min_size=1, max_size=5),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=2),
    end_moves=st.lists(st.tuples(st.integers(0, 10), st.integers(-50, 50)), max_size=2),
    first_change=st.sampled_from([0, 0, 1, -1]),
    fmt=formats,
)
def test_a_damaged_segment_read_is_refused_with_the_same_error(
    lengths, flips, end_moves, first_change, fmt
):
    batch = make_batch(9, lengths, fmt=fmt)
    out = bytearray()
    sizes = wire_to_disk(batch, 0, len(lengths), out)
    for where, xor in flips:
        out[where % len(out)] ^= xor
    ends = list(accumulate(sizes))  # where each record ends
    for which, move in end_moves:
        ends[which % len(ends)] = max(0, ends[which % len(ends)] + move)
    disk = bytes(out)
    compiled, pure = both(
        segment_module, lambda: disk_to_wire(disk, 9 + first_change, ends, "s.seg", fmt)
    )
    if compiled[0] == "ok":
        assert pure[0] == "ok" and compiled[1].buf == pure[1].buf
        assert compiled[1].spans == pure[1].spans
    elif pure[0] == "ok":
        # Only the compiled loop's bounds check can refuse what Python's loop reads: an
        # end past the buffer. Python slices short there, so nothing is lost by refusing.
        assert any(end > len(disk) for end in ends), (ends, len(disk))
    else:
        assert compiled == pure
        assert compiled[0] in (CorruptSegment, struct.error)


def test_wire_to_disk_refuses_spans_outside_the_batch():
    batch = make_batch(1, [10, 20])
    with pytest.raises(ValueError, match="outside the"):
        native.wire_to_disk(batch.buf, [(1, 0, 10), (2, 50, 2000)], 0, 2, bytearray())
    with pytest.raises(ValueError, match="outside the"):
        native.wire_to_disk(batch.buf, [(1, -1, 10)], 0, 1, bytearray())
    with pytest.raises(IndexError):
        native.wire_to_disk(batch.buf, batch.spans, 1, 3, bytearray())
    with pytest.raises(TypeError):
        native.wire_to_disk(batch.buf, [(1, 0)], 0, 1, bytearray())
    out = bytearray(b"kept")
    with pytest.raises(ValueError):
        native.wire_to_disk(batch.buf, [*batch.spans, (3, 999, 1)], 0, 3, out)
    assert out == b"kept"  # refused before anything is written


# --- opening a segment: every record checked -------------------------------------------


def disk_records(first_txid: int, lengths: list[int]) -> bytearray:
    out = bytearray()
    wire_to_disk(make_batch(first_txid, lengths), 0, len(lengths), out)
    return out


def scan_file(contents: bytes, first_txid: int, chunk: int):
    """``scan_segment_file`` over ``contents`` after a 128-byte header, reading ``chunk``
    bytes at a time: (offsets, where the valid records stop, the problem, the data end)."""
    import tempfile

    with tempfile.TemporaryFile() as f:
        f.write(bytes(segment_module.HEADER_BYTES) + contents)
        f.flush()
        size = segment_module.HEADER_BYTES + len(contents)
        with pytest.MonkeyPatch.context() as m:
            m.setattr(segment_module, "SCAN_CHUNK_BYTES", chunk)
            offsets, pos, problem, end = segment_module.scan_segment_file(
                f.fileno(), size, first_txid
            )
    return offsets.tolist(), pos, problem, end


@SETTINGS
@given(
    lengths=st.lists(st.one_of(st.integers(0, 60), st.integers(0, 3000)), max_size=10),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=2),
    cut=st.one_of(st.just(0), st.integers(0, 200)),
    zeros=st.sampled_from([0, 0, 7, 36, 4096]),
    first_change=st.sampled_from([0, 0, 0, 1, -1]),
    chunk=st.sampled_from([4 * 1024 * 1024, 4 * 1024 * 1024, 37, 100, 1000, 5000]),
)
def test_a_segment_is_scanned_the_same_either_way(lengths, flips, cut, zeros, first_change, chunk):
    """Open's check of every record: the same offsets, stopping place, problem and data
    end with the compiled scan as with Python's loop, for valid and damaged files, torn
    tails and zeros written ahead, with records across chunk boundaries."""
    contents = disk_records(50, lengths)
    for where, xor in flips:
        if contents:
            contents[where % len(contents)] ^= xor
    if cut:
        del contents[max(0, len(contents) - cut) :]
    contents += bytes(zeros)
    compiled, pure = both(
        segment_module, lambda: scan_file(bytes(contents), 50 + first_change, chunk)
    )
    assert compiled == pure
    assert compiled[0] == "ok"
    if not flips and not cut and not first_change:  # every record, the zeros free space
        offsets, pos, problem, end = compiled[1]
        starts = list(accumulate([128] + [40 + length for length in lengths]))
        assert (offsets, pos, problem, end) == (starts[:-1], starts[-1], None, starts[-1])


def test_scan_disk_stops_before_what_it_cannot_vouch_for():
    buf = bytes(disk_records(7, [10, 0, 300]))  # 50, 40 and 340 bytes on disk
    skip = 60  # the records start this far into the buffer given
    expected = [skip + 1000, skip + 50 + 1000, skip + 90 + 1000]  # plus the base, 1000

    def offsets(found: bytes) -> list[int]:
        a = array("q")
        a.frombytes(found)
        return a.tolist()

    pos, txid, found = native.scan_disk(bytes(skip) + buf, skip, 7, 1000)
    assert (pos, txid, offsets(found)) == (skip + 430, 10, expected)
    # A record cut off by the buffer's end: it stops before it, for the caller to read on.
    pos, txid, found = native.scan_disk(bytes(skip) + buf[:-1], skip, 7, 1000)
    assert (pos, txid, offsets(found)) == (skip + 90, 9, expected[:2])
    # The wrong transaction, a flipped data byte, a flipped head byte: stops before it.
    assert native.scan_disk(buf, 0, 8, 0)[:2] == (0, 8)
    damaged = bytearray(buf)
    damaged[90 + 36 + 5] ^= 1
    assert native.scan_disk(bytes(damaged), 0, 7, 0)[:2] == (90, 9)
    damaged = bytearray(buf)
    damaged[50 + 20] ^= 1
    assert native.scan_disk(bytes(damaged), 0, 7, 0)[:2] == (50, 8)
    # A negative length, fewer bytes than a head, nothing at all.
    negative = bytearray(buf)
    negative[28:32] = (-1).to_bytes(4, "big", signed=True)
    assert native.scan_disk(bytes(negative), 0, 7, 0)[:2] == (0, 7)
    assert native.scan_disk(buf[:35], 0, 7, 0) == (0, 7, b"")
    assert native.scan_disk(b"", 0, 7, 0) == (0, 7, b"")
    with pytest.raises(ValueError, match="outside the buffer"):
        native.scan_disk(buf, len(buf) + 1, 7, 0)


def test_scan_disk_leaves_the_last_id_to_python():
    top = 2**63 - 1
    buf = bytes(disk_records(top - 1, [3, 3]))
    pos, txid, found = native.scan_disk(buf, 0, top - 1, 0)
    assert (pos, txid, len(found)) == (43, top, 8)  # stops before the record of the last ID
    assert native.scan_disk(buf, 43, top, 0)[:2] == (43, top)
    # The whole scan still accepts it, through Python's loop.
    contents = bytes(disk_records(top - 1, [3, 3]))
    results = both(segment_module, lambda: scan_file(contents, top - 1, 4096))
    assert results[0] == results[1]
    assert results[0][1][0] == [128, 171] and results[0][1][2] is None


def test_scan_disk_the_same_with_the_gil_released():
    """Past 256 KiB the loop runs with the GIL released; the result is the same."""
    buf = bytes(disk_records(0, [1000] * 400))  # 416,000 bytes
    whole = native.scan_disk(buf, 0, 0, 0)
    assert whole[:2] == (len(buf), 400)
    pieces = []
    pos, txid = 0, 0
    while pos < len(buf):
        step = native.scan_disk(buf[: pos + 1040], pos, txid, 0)
        pieces.append(step[2])
        pos, txid = step[0], step[1]
    assert b"".join(pieces) == whole[2]


# --- the storage node's append -----------------------------------------------------------


def test_first_gap():
    spans = [(5, 0, 0), (6, 0, 0), (8, 0, 0)]
    assert native.first_gap(spans, 5) == 2
    assert native.first_gap(spans, 4) == 0
    assert native.first_gap(spans[:2], 5) == 2
    assert native.first_gap([], 5) == 0
    assert native.first_gap([(2**70, 0, 0)], 5) == 0
    top = 2**63 - 1  # the last i64 ID: the one after it is a gap, not a wrap to -2**63
    assert native.first_gap([(top, 0, 0), (-(2**63), 0, 0)], top) == 1


def test_disk_records_past_the_last_id_are_left_to_python():
    batch = make_batch(2**63 - 1, [3])
    out = bytearray()
    ends = [sum(wire_to_disk(batch, 0, 1, out))]
    assert native.disk_to_wire(bytes(out), 2**63 - 1, ends) is not None
    assert native.disk_to_wire(bytes(out) * 2, 2**63 - 1, [ends[0], 2 * ends[0]]) is None


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "pure"])
def test_an_append_out_of_order_names_the_record(monkeypatch, tmp_path, compiled):
    if not compiled:
        monkeypatch.setattr(partition_module, "native", None)
    log = PartitionLog.open(str(tmp_path), 0, uuid.uuid4())
    log.append(make_batch(0, [5, 6]))
    first, second = make_batch(2, [1]), make_batch(4, [1])  # 3 is missing
    gapped = RecordBatch(
        first.buf + second.buf, [*first.spans, (4, len(first.buf), 1)], first.format
    )
    with pytest.raises(NonContiguousAppend, match=r"expected transaction 3, got 4 \(record 1"):
        log.append(gapped)
    log.close()


@pytest.mark.parametrize("fmt", [FORMAT_1, FORMAT_2], ids=["format1", "format2"])
def test_an_append_of_spans_in_a_tuple_takes_the_python_path(tmp_path, fmt):
    """Batches built elsewhere may carry their spans in any sequence: the compiled
    loops take lists only, and anything else goes the Python way, with the same result.
    (A batch of format 1, an older server's, is stored in format 2, without commit times.)"""
    log = PartitionLog.open(str(tmp_path), 0, uuid.uuid4())
    listed = make_batch(0, [5, 6], fmt=fmt)
    log.append(RecordBatch(listed.buf, tuple(listed.spans), listed.format))  # type: ignore[arg-type]
    log.sync()
    stored = log.read(0, 10, 1 << 20)
    assert stored.format is FORMAT_2
    assert stored.buf == listed.convert(FORMAT_2).buf
    assert list(stored.records()) == list(listed.records())  # times too, where known
    log.close()
