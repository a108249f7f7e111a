"""Sealed segments read their record offsets from their index files, not from memory:
after a roll and after an open, reads, truncation into a sealed segment, retention, an
index that disagreed at open, and an index damaged while the node runs."""

from __future__ import annotations

import os
import struct
from array import array
from pathlib import Path

import pytest
from test_partition_log import (
    EVERYTHING,
    HEADER_BYTES,
    append_synced,
    check_segments,
    expected_read,
    make_records,
    open_log,
)

from waltz_storage.errors import CorruptSegment
from waltz_storage.index_offsets import IndexedOffsets
from waltz_storage.recovery import scan_partition


def offsets_of(log) -> list[list[int]]:
    return [list(seg.offsets) for seg in log.segments]


def assert_reads(log, recs, start: int = 0) -> None:
    for txid in range(start, len(recs), 7):
        got = log.read(txid, 5, EVERYTHING[1])
        assert [r.data for r in got.records()] == [
            r.data for r in expected_read(recs, txid, 5, 1 << 40)
        ]


def filled_log(tmp_path: Path, count: int = 300):
    """A partition of ``count`` records over several small segments: (log, records)."""
    recs = make_records(0, count)
    log = open_log(tmp_path)
    append_synced(log, recs)
    return log, recs


def test_sealed_segments_keep_their_offsets_in_their_index_files(tmp_path: Path) -> None:
    log, recs = filled_log(tmp_path)
    assert len(log.segments) > 3
    # Every sealed segment reads its offsets from its .idx; the active one holds its own.
    assert all(isinstance(s.offsets, IndexedOffsets) for s in log.segments[:-1])
    assert isinstance(log.segments[-1].offsets, array)
    in_memory = offsets_of(log)
    check_segments(log, tmp_path)
    assert_reads(log, recs)
    log.close()

    reopened = open_log(tmp_path)
    assert offsets_of(reopened) == in_memory
    assert all(isinstance(s.offsets, IndexedOffsets) for s in reopened.segments[:-1])
    assert_reads(reopened, recs)
    more = make_records(300, 120, seed="more")
    append_synced(reopened, more)  # rolls on, sealing the segment that was active
    check_segments(reopened, tmp_path)
    assert_reads(reopened, recs + more)
    reopened.close()


def test_an_open_scan_holds_no_offsets_of_segments_whose_index_is_exact(tmp_path: Path) -> None:
    log, _ = filled_log(tmp_path)
    counts = [s.count for s in log.segments]
    log.close()
    scan = scan_partition(str(tmp_path), 1, None, max_torn_bytes=1 << 20)
    assert scan.problem is None
    assert [s.count for s in scan.segments] == counts
    assert [s.in_index for s in scan.segments] == [True] * (len(counts) - 1) + [False]
    assert all(len(s.offsets) == len(s.hints) == 0 for s in scan.segments[:-1])
    assert len(scan.segments[-1].offsets) == counts[-1]


def test_an_index_that_disagreed_at_open_is_rewritten_then_read(tmp_path: Path) -> None:
    log, recs = filled_log(tmp_path)
    expected = offsets_of(log)
    second = log.segments[1]
    log.close()
    index = tmp_path / f"{second.first_txid:019d}.idx"
    with open(index, "r+b") as f:  # a wrong entry, and the last one cut in half
        f.seek(HEADER_BYTES + 8 * 2)
        f.write(struct.pack(">q", 5))
        f.truncate(index.stat().st_size - 4)
    scan = scan_partition(str(tmp_path), 1, None, max_torn_bytes=1 << 20)
    assert not scan.segments[1].in_index and scan.segments[0].in_index
    reopened = open_log(tmp_path)
    assert offsets_of(reopened) == expected
    assert isinstance(reopened.segments[1].offsets, IndexedOffsets)
    assert index.stat().st_size == HEADER_BYTES + 8 * len(expected[1])
    assert_reads(reopened, recs)
    reopened.close()


def test_a_part_written_entry_after_an_exact_index_is_dropped_at_open(tmp_path: Path) -> None:
    log, _ = filled_log(tmp_path)
    first = log.segments[0]
    count = first.count
    log.close()
    index = tmp_path / f"{first.first_txid:019d}.idx"
    with open(index, "ab") as f:
        f.write(b"\x00\x00\x01")
    reopened = open_log(tmp_path)
    assert isinstance(reopened.segments[0].offsets, IndexedOffsets)
    assert index.stat().st_size == HEADER_BYTES + 8 * count
    reopened.close()


def test_truncating_into_a_sealed_segment_brings_its_offsets_back(tmp_path: Path) -> None:
    log, recs = filled_log(tmp_path)
    target = log.segments[1]
    keep_until = target.first_txid + 2
    log.truncate(keep_until)
    assert log.segments[-1] is target and isinstance(target.offsets, array)
    assert log.max_txid == keep_until
    more = make_records(keep_until + 1, 200, seed="after")
    append_synced(log, more)
    kept = recs[: keep_until + 1] + more
    assert_reads(log, kept)
    check_segments(log, tmp_path)
    log.close()
    reopened = open_log(tmp_path)
    assert_reads(reopened, kept)
    reopened.close()


def test_retention_deletes_sealed_segments_whose_offsets_are_in_their_index(tmp_path: Path) -> None:
    log, recs = filled_log(tmp_path)
    third = log.segments[2].first_txid
    sizes = sum(s.size for s in log.segments[:2])
    assert log.advance_log_start(third) == sizes
    assert log.segments[0].first_txid == third
    assert_reads(log, recs, start=third)
    log.close()
    reopened = open_log(tmp_path)
    assert all(isinstance(s.offsets, IndexedOffsets) for s in reopened.segments[:-1])
    assert_reads(reopened, recs, start=third)
    reopened.close()


def test_an_index_damaged_while_serving_is_refused_on_read(tmp_path: Path) -> None:
    log, recs = filled_log(tmp_path)
    first = log.segments[0]
    index = tmp_path / f"{first.first_txid:019d}.idx"
    for garbage in (10**12, 3, first.offsets[1] + 1):
        with open(index, "r+b") as f:
            f.seek(HEADER_BYTES + 8 * 1)
            good = f.read(8)
            f.seek(HEADER_BYTES + 8 * 1)
            f.write(struct.pack(">q", garbage))
        with pytest.raises(CorruptSegment):
            log.read(1, 1, 1 << 20)  # the entry is where the record starts
        with pytest.raises(CorruptSegment):
            log.read(0, 1, 1 << 20)  # ... and where the one before it ends
        with open(index, "r+b") as f:
            f.seek(HEADER_BYTES + 8 * 1)
            f.write(good)
    assert_reads(log, recs)
    log.close()


def test_indexed_offsets_reads_entries_like_an_array(tmp_path: Path) -> None:
    values = array("q", [128, 300, 10**12, 2**63 - 1])
    path = tmp_path / "x.idx"
    big_endian = array("q", values)
    big_endian.byteswap()
    path.write_bytes(bytes(HEADER_BYTES) + big_endian.tobytes() + b"\x01\x02")
    fd = os.open(path, os.O_RDONLY)
    try:
        indexed = IndexedOffsets(fd, 4, HEADER_BYTES, str(path))
        assert len(indexed) == 4 and list(indexed) == list(values)
        assert indexed[-1] == values[-1] and indexed[-4] == values[0]
        assert indexed[1:3] == values[1:3] and indexed[::2] == values[::2]
        assert indexed[3:1] == array("q") and indexed.to_array() == values
        for bad in (4, -5):
            with pytest.raises(IndexError):
                indexed[bad]
        with pytest.raises(ValueError, match="not the"):
            IndexedOffsets(fd, 5, HEADER_BYTES, str(path))
        os.truncate(path, HEADER_BYTES + 8 * 2 + 3)  # cut short under it: an error, no crash
        assert indexed[1] == values[1]
        with pytest.raises(CorruptSegment, match="cut short"):
            indexed[2]
        with pytest.raises(CorruptSegment, match="cut short"):
            indexed[:]
        indexed.forget_file()
        assert len(indexed) == 4
        with pytest.raises(OSError):
            indexed[0]
    finally:
        os.close(fd)


def test_a_read_of_a_sealed_segment_reads_its_index_entries_at_once(tmp_path: Path, monkeypatch):
    log, recs = filled_log(tmp_path)
    sealed = log.segments[1]
    assert isinstance(sealed.offsets, IndexedOffsets) and sealed.count > 12
    reads = []
    real = IndexedOffsets._read

    def counted(self, first: int, n: int) -> bytes:
        reads.append((first, n))
        return real(self, first, n)

    monkeypatch.setattr(IndexedOffsets, "_read", counted)
    txid = sealed.first_txid + 1
    batch = sealed.read_batch(txid, 10, 1 << 20)
    assert [r.data for r in batch.records()] == [r.data for r in recs[txid : txid + 10]]
    assert reads == [(1, 11)]  # the 10 records' entries and the one after them
    reads.clear()
    batch = sealed.read_batch(txid, 10, 100)  # fewer fit: no more entries read than can
    assert len(batch.spans) >= 1 and reads == [(1, min(11, 100 // 40 + 2))]
