"""Segments an older node left (segment format 1: records without commit times) beside the
format-2 segments this build writes, on real files.

The old directories are made as an older node made them: ``Segment.create(fmt=FORMAT_1)``
and format-1 batches written directly; their bytes are checked here against the
documented layout first. Then: they open and read back with ``NO_TIMESTAMP``; the first
append seals the last one and starts a format-2 segment whose records keep their times
(an empty format-1 last segment is replaced by a format-2 one of the same name, safely
at every point a crash or a full disk can stop it); reads span both formats; truncation,
retention and the undo of an append work across them; torn tails are cut in either
format; the old files are never rewritten; and a model-based property holds all of it
over random interleavings.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import random
import struct
import uuid
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_client.wire.records import (
    DEFAULT_FORMAT,
    FORMAT_1,
    FORMAT_2,
    NO_TIMESTAMP,
    Record,
    RecordBatch,
    RecordHeader,
    ReqId,
)
from waltz_storage import admin
from waltz_storage import segment as segmod
from waltz_storage.errors import CorruptSegment, OutOfSpace
from waltz_storage.inspect import read_records, verify_segment
from waltz_storage.partition import PartitionLog
from waltz_storage.segment import Segment

KEY = uuid.UUID("0f0f0f0f-1111-4222-8333-000000000001")
PARTITION = 5
HEADER_BYTES = 128
HEADER = struct.Struct(">iq16siq")  # version, created, key, partition, first txid
# The documented record heads (docs/on-disk.md): the wire head, then the data CRC.
HEAD_1 = struct.Struct(">qiiiiiiI")  # format 1: no commit time
HEAD_2 = struct.Struct(">qiiiiiiqI")  # format 2: the commit time after the length
OVERHEAD = {1: HEAD_1.size + 4, 2: HEAD_2.size + 4}  # 40 and 48 bytes besides the data
WIRE_OVERHEAD = 44  # a record read back (format 2) on the wire, besides its data
TIME = 1_767_225_600_000  # 2026-01-01 UTC
EVERYTHING = (10**9, 1 << 40)
SEGMENT_BYTES = 1 << 20


# --- helpers --------------------------------------------------------------------------------


def make_records(first: int, n: int, *, timed: bool, seed: int | str = 0) -> list[Record]:
    """Records ``first..first+n-1``; ``timed``: with commit times (else as format 1 has them)."""
    out = []
    for t in range(first, first + n):
        rng = random.Random(f"{seed}:{t}")
        req = ReqId(rng.randrange(1 << 20), 1, PARTITION, t)
        data = rng.randbytes(rng.randrange(60))
        out.append(Record(t, req, rng.randrange(-(2**31), 2**31), data, _time(t, timed)))
    return out


def _time(txid: int, timed: bool) -> int:
    return TIME + 3 * txid if timed else NO_TIMESTAMP


def untimed(recs: list[Record]) -> list[Record]:
    """``recs`` as a format-1 log returns them: without their times."""
    return [Record(r.transaction_id, r.req_id, r.header, r.data, NO_TIMESTAMP) for r in recs]


def write_format_1_segments(directory: Path, recs: list[Record], splits: list[int]) -> None:
    """A partition directory as a node before commit times left it: format-1 segments
    starting at 0 and at each of ``splits``, holding ``recs``, sealed and closed."""
    directory.mkdir(parents=True, exist_ok=True)
    starts = [0, *splits]
    ends = [*splits, len(recs)]
    for first, end in zip(starts, ends, strict=True):
        seg = Segment.create(str(directory), PARTITION, KEY, first, fmt=FORMAT_1)
        try:
            if end > first:
                batch = RecordBatch.from_records(recs[first:end], FORMAT_1)
                seg.write_batch(batch, 0, len(batch))
            seg.seal()
        finally:
            seg.close()


def seg_path(directory: Path, first: int) -> Path:
    return directory / f"{first:019d}.seg"


def idx_path(directory: Path, first: int) -> Path:
    return directory / f"{first:019d}.idx"


def segment_versions(directory: Path) -> dict[int, int]:
    """First transaction -> the header's format version, of every .seg file."""
    return {
        int(p.stem): HEADER.unpack_from(p.read_bytes())[0] for p in sorted(directory.glob("*.seg"))
    }


def documented_record(rec: Record, version: int) -> bytes:
    """A record in the documented on-disk layout of segment format ``version``."""
    q = rec.req_id
    fields = (rec.transaction_id, q.client_id, q.generation, q.partition_id, q.seq, rec.header)
    if version == 1:
        head = HEAD_1.pack(*fields, len(rec.data), zlib.crc32(rec.data))
    else:
        head = HEAD_2.pack(*fields, len(rec.data), rec.timestamp, zlib.crc32(rec.data))
    return head + rec.data + struct.pack(">I", zlib.crc32(head))


def snapshot(directory: Path, firsts: list[int]) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for first in firsts
        for p in (seg_path(directory, first), idx_path(directory, first))
    }


def open_log(directory: Path, **kwargs) -> PartitionLog:
    kwargs.setdefault("segment_bytes", SEGMENT_BYTES)
    kwargs.setdefault("max_torn_bytes", 1 << 20)
    return PartitionLog.open(str(directory), PARTITION, KEY, **kwargs)


def append_synced(log: PartitionLog, recs: list[Record]) -> None:
    log.append(RecordBatch.from_records(recs))
    log.sync()


def assert_holds(log: PartitionLog, expected: list[Record], first: int = 0) -> None:
    """The log holds exactly ``expected`` from ``first``, read back as one format-2 batch."""
    assert log.max_txid == first + len(expected) - 1
    got = log.read(first, *EVERYTHING)
    assert got.format == FORMAT_2
    assert list(got.records()) == expected
    assert got.buf == RecordBatch.from_records(expected, FORMAT_2).buf


def assert_all_verify(directory: Path) -> None:
    for path in sorted(directory.glob("*.seg")):
        report = verify_segment(str(path))
        assert report.ok, report.problems
        assert report.records == report.index_entries


# --- the old layout, as older nodes wrote it ------------------------------------------------


def test_format_1_segments_have_the_documented_bytes(tmp_path: Path) -> None:
    recs = make_records(0, 12, timed=False)
    write_format_1_segments(tmp_path, recs, [5])
    assert segment_versions(tmp_path) == {0: 1, 5: 1}
    for first, part in ((0, recs[:5]), (5, recs[5:])):
        data = seg_path(tmp_path, first).read_bytes()
        version, _, key, partition, stored_first = HEADER.unpack_from(data)
        assert (version, uuid.UUID(bytes=key), partition, stored_first) == (
            1,
            KEY,
            PARTITION,
            first,
        )
        assert data[HEADER_BYTES:] == b"".join(documented_record(r, 1) for r in part)
        assert idx_path(tmp_path, first).read_bytes()[:HEADER_BYTES] == data[:HEADER_BYTES]
    # A segment takes only batches of its own format.
    (tmp_path / "new").mkdir()
    seg = Segment.create(str(tmp_path / "new"), PARTITION, KEY, 0)  # format 2
    try:
        with pytest.raises(ValueError, match="a batch of record format 1 cannot be written to a"):
            seg.write_batch(RecordBatch.from_records(recs[:1], FORMAT_1), 0, 1)
    finally:
        seg.close()


# --- open, read, the roll at the first append -----------------------------------------------


def test_format_1_segments_open_and_read_back_without_times_and_are_never_rewritten(
    tmp_path: Path,
) -> None:
    recs = make_records(0, 30, timed=False)
    write_format_1_segments(tmp_path, recs, [10, 20])
    before = snapshot(tmp_path, [0, 10, 20])
    log = open_log(tmp_path)
    try:
        assert [s.format.version for s in log.segments] == [1, 1, 1]
        assert_holds(log, recs)
        # Reads that start inside, and cross, the old segments.
        assert list(log.read(7, 6, 1 << 20).records()) == recs[7:13]
        headers = log.read_headers(8, 5, 1 << 20)
        assert headers == [RecordHeader(r.transaction_id, r.req_id, r.header) for r in recs[8:13]]
        assert all(h.timestamp == NO_TIMESTAMP for h in headers)
    finally:
        log.close()
    assert snapshot(tmp_path, [0, 10, 20]) == before
    assert segment_versions(tmp_path) == {0: 1, 10: 1, 20: 1}


def test_the_first_append_seals_the_format_1_segment_and_starts_a_format_2_one(
    tmp_path: Path,
) -> None:
    old = make_records(0, 25, timed=False)
    write_format_1_segments(tmp_path, old, [10])
    before = snapshot(tmp_path, [0, 10])
    new = make_records(25, 15, timed=True)
    log = open_log(tmp_path)
    try:
        append_synced(log, new[:5])
        append_synced(log, new[5:])  # into the same, new segment
        assert [(s.first_txid, s.format.version) for s in log.segments] == [
            (0, 1),
            (10, 1),
            (25, 2),
        ]
        assert_holds(log, old + new)
        # One read across the boundary: old records without times, new ones with theirs.
        across = log.read(20, 10, 1 << 20)
        assert across.timestamps() == [NO_TIMESTAMP] * 5 + [TIME + 3 * t for t in range(25, 30)]
        assert [h.timestamp for h in log.read_headers(23, 4, 1 << 20)] == [
            NO_TIMESTAMP,
            NO_TIMESTAMP,
            TIME + 75,
            TIME + 78,
        ]
    finally:
        log.close()
    assert snapshot(tmp_path, [0, 10]) == before  # sealed as they were, never rewritten
    data = seg_path(tmp_path, 25).read_bytes()
    assert HEADER.unpack_from(data)[0] == 2
    assert data[HEADER_BYTES:] == b"".join(documented_record(r, 2) for r in new)
    log = open_log(tmp_path)
    try:
        assert_holds(log, old + new)
    finally:
        log.close()
    assert_all_verify(tmp_path)


def test_an_older_servers_batch_is_stored_in_format_2_without_times(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    try:
        recs = make_records(0, 4, timed=True)
        log.append(RecordBatch.from_records(recs, FORMAT_1))  # format 1 drops the times
        log.sync()
        assert_holds(log, untimed(recs))
        assert [s.format.version for s in log.segments] == [2]
    finally:
        log.close()
    assert segment_versions(tmp_path) == {0: 2}


@pytest.mark.parametrize("layout", ["only segment", "after a full one"])
def test_an_empty_format_1_last_segment_is_replaced_by_a_format_2_one(
    tmp_path: Path, layout: str
) -> None:
    old = make_records(0, 8, timed=False) if layout == "after a full one" else []
    write_format_1_segments(tmp_path, old, [len(old)] if old else [])
    first = len(old)
    assert segment_versions(tmp_path) == ({0: 1, 8: 1} if old else {0: 1})
    keep = snapshot(tmp_path, [0]) if old else {}
    new = make_records(first, 6, timed=True)
    log = open_log(tmp_path)
    try:
        assert log.segments[-1].count == 0 and log.segments[-1].format == FORMAT_1
        append_synced(log, new)
        assert [(s.first_txid, s.format.version) for s in log.segments] == (
            [(0, 1), (8, 2)] if old else [(0, 2)]
        )
        assert_holds(log, old + new)
    finally:
        log.close()
    assert segment_versions(tmp_path) == ({0: 1, 8: 2} if old else {0: 2})
    if old:
        assert snapshot(tmp_path, [0]) == keep  # the full old segment: sealed as it was
    assert seg_path(tmp_path, first).read_bytes()[HEADER_BYTES:] == b"".join(
        documented_record(r, 2) for r in new
    )
    log = open_log(tmp_path)
    try:
        assert_holds(log, old + new)
    finally:
        log.close()
    assert_all_verify(tmp_path)


# --- crashes and a full disk during the replacement -----------------------------------------


def _format_2_header(directory: Path, first: int) -> bytes:
    """The header a replacement format-2 segment would write (read from a real one)."""
    other = directory.parent / f"{directory.name}-model"
    other.mkdir()
    seg = Segment.create(str(other), PARTITION, KEY, first)
    seg.close()
    return seg_path(other, first).read_bytes()[:HEADER_BYTES]


@pytest.mark.parametrize(
    "state",
    [
        "index emptied",
        "index rewritten, data file untouched",
        "index rewritten, data file emptied",
        "index rewritten, data file cut in its header",
        "both rewritten",
        "both deleted",
    ],
)
def test_every_state_a_crash_in_the_replacement_leaves_opens(tmp_path: Path, state: str) -> None:
    """Segment.create rewrites the .idx header (fsync), then the .seg's (fsync): a crash
    can stop it after any of these steps, or a full disk make it delete both files."""
    directory = tmp_path / str(PARTITION)
    old = make_records(0, 8, timed=False)
    write_format_1_segments(directory, old, [8])  # segment 8: empty, format 1
    header_2 = _format_2_header(directory, 8)
    seg, idx = seg_path(directory, 8), idx_path(directory, 8)
    if state == "index emptied":
        idx.write_bytes(b"")
    elif state == "index rewritten, data file untouched":
        idx.write_bytes(header_2)
    elif state == "index rewritten, data file emptied":
        idx.write_bytes(header_2)
        seg.write_bytes(b"")
    elif state == "index rewritten, data file cut in its header":
        idx.write_bytes(header_2)
        seg.write_bytes(header_2[:60])
    elif state == "both rewritten":
        idx.write_bytes(header_2)
        seg.write_bytes(header_2)
    else:
        idx.unlink()
        seg.unlink()
    new = make_records(8, 5, timed=True)
    log = open_log(directory, floor=7)
    try:
        assert log.max_txid == 7
        assert_holds(log, old)
        append_synced(log, new)
        assert [(s.first_txid, s.format.version) for s in log.segments] == [(0, 1), (8, 2)]
        assert_holds(log, old + new)
    finally:
        log.close()
    assert_all_verify(directory)


def test_a_full_disk_during_the_replacement_fails_the_append_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = make_records(0, 8, timed=False)
    write_format_1_segments(tmp_path, old, [8])
    new = make_records(8, 5, timed=True)
    log = open_log(tmp_path)
    real_write_all = segmod._write_all

    def no_room_for_the_data_header(fd: int, data, offset: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".seg") and offset == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write_all(fd, data, offset)

    try:
        monkeypatch.setattr(segmod, "_write_all", no_room_for_the_data_header)
        with pytest.raises(OutOfSpace, match="creating"):
            log.append(RecordBatch.from_records(new))
        log.undo_after(7)  # what the partition service does next
        assert_holds(log, old)
        # Both files of the replacement are gone: the log on disk ends at 7 all the same.
        assert sorted(segment_versions(tmp_path)) == [0]
        reopened = open_log(tmp_path, floor=7)
        try:
            assert_holds(reopened, old)
        finally:
            reopened.close()
        monkeypatch.setattr(segmod, "_write_all", real_write_all)
        append_synced(log, new)  # room again: the same log goes on
        assert [(s.first_txid, s.format.version) for s in log.segments] == [(0, 1), (8, 2)]
        assert_holds(log, old + new)
    finally:
        log.close()
    log = open_log(tmp_path, floor=12)
    try:
        assert_holds(log, old + new)
    finally:
        log.close()
    assert_all_verify(tmp_path)


# --- truncation, undo, retention across formats ---------------------------------------------


def test_truncate_into_the_format_1_segments_and_append_again(tmp_path: Path) -> None:
    old = make_records(0, 30, timed=False)
    write_format_1_segments(tmp_path, old, [10, 20])
    log = open_log(tmp_path)
    try:
        model = list(old)
        more = make_records(30, 10, timed=True, seed="a")
        append_synced(log, more)
        model += more
        log.truncate(24)  # drops the format-2 segment and cuts into the last old one
        del model[25:]
        assert [(s.first_txid, s.format.version) for s in log.segments] == [
            (0, 1),
            (10, 1),
            (20, 1),
        ]
        assert_holds(log, model)
        again = make_records(25, 7, timed=True, seed="b")
        append_synced(log, again)  # seals the cut old segment, a new one from 25
        model += again
        assert [(s.first_txid, s.format.version) for s in log.segments] == [
            (0, 1),
            (10, 1),
            (20, 1),
            (25, 2),
        ]
        assert_holds(log, model)
        log.truncate(19)  # at a boundary: segment 20 (format 1) stays, empty
        del model[20:]
        assert [(s.first_txid, s.count) for s in log.segments] == [(0, 10), (10, 10), (20, 0)]
        log.close()
        log = open_log(tmp_path)
        assert_holds(log, model)
        tail = make_records(20, 4, timed=True, seed="c")
        append_synced(log, tail)  # the empty format-1 segment 20 becomes a format-2 one
        model += tail
        assert [(s.first_txid, s.format.version) for s in log.segments] == [
            (0, 1),
            (10, 1),
            (20, 2),
        ]
        assert_holds(log, model)
        log.truncate(-1)  # everything: segment 0 (format 1) stays, empty
        assert log.max_txid == -1 and [s.first_txid for s in log.segments] == [0]
        first = make_records(0, 3, timed=True, seed="d")
        append_synced(log, first)
        assert [(s.first_txid, s.format.version) for s in log.segments] == [(0, 2)]
        assert_holds(log, first)
    finally:
        log.close()
    assert segment_versions(tmp_path) == {0: 2}
    assert_all_verify(tmp_path)


def test_undoing_the_append_that_rolled_past_the_format_1_segment(tmp_path: Path) -> None:
    old = make_records(0, 10, timed=False)
    write_format_1_segments(tmp_path, old, [])
    log = open_log(tmp_path)
    try:
        log.append(RecordBatch.from_records(make_records(10, 5, timed=True)))
        log.undo_after(9)  # the append found no room (as partition_service undoes it)
        assert_holds(log, old)
        new = make_records(10, 5, timed=True, seed="again")
        append_synced(log, new)
        assert [(s.first_txid, s.format.version) for s in log.segments] == [(0, 1), (10, 2)]
        assert_holds(log, old + new)
    finally:
        log.close()
    log = open_log(tmp_path)
    try:
        assert_holds(log, old + new)
    finally:
        log.close()


def test_retention_deletes_the_format_1_segments(tmp_path: Path) -> None:
    old = make_records(0, 20, timed=False)
    write_format_1_segments(tmp_path, old, [10])
    new = make_records(20, 10, timed=True)
    log = open_log(tmp_path)
    try:
        append_synced(log, new)
        assert log.advance_log_start(15) > 0  # segment 0 goes; segment 10 holds 15
        assert segment_versions(tmp_path) == {10: 1, 20: 2}
        assert_holds(log, (old + new)[15:], first=15)
        assert log.advance_log_start(22) > 0  # the last format-1 segment goes too
        assert segment_versions(tmp_path) == {20: 2}
        assert_holds(log, new[2:], first=22)
    finally:
        log.close()
    log = open_log(tmp_path)
    try:
        assert_holds(log, new[2:], first=22)
    finally:
        log.close()


def test_a_skip_ahead_past_format_1_segments_starts_a_format_2_one(tmp_path: Path) -> None:
    old = make_records(0, 10, timed=False)
    write_format_1_segments(tmp_path, old, [])
    log = open_log(tmp_path)
    try:
        log.advance_log_start(50)  # past the end: the replica starts empty at 50
        assert segment_versions(tmp_path) == {50: 2}
        new = make_records(50, 3, timed=True)
        append_synced(log, new)
        assert_holds(log, new, first=50)
    finally:
        log.close()


# --- torn tails and damage in either format -------------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
def test_a_torn_tail_is_cut_in_either_format(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, version: int
) -> None:
    old = make_records(0, 20, timed=False)
    write_format_1_segments(tmp_path, old, [10])
    model = list(old)
    if version == 2:
        log = open_log(tmp_path)
        new = make_records(20, 10, timed=True)
        append_synced(log, new)
        log.close()
        model += new
    last = max(segment_versions(tmp_path))
    assert segment_versions(tmp_path)[last] == version
    seg, idx = seg_path(tmp_path, last), idx_path(tmp_path, last)
    size = seg.stat().st_size
    os.truncate(seg, size - 10)  # the last record torn
    os.truncate(idx, idx.stat().st_size - 8)  # and its index entry never written
    torn = OVERHEAD[version] + len(model[-1].data) - 10
    with caplog.at_level(logging.WARNING):
        log = open_log(tmp_path)
    try:
        assert f"cutting {torn} bytes of torn tail" in caplog.text
        assert_holds(log, model[:-1])
        more = make_records(len(model) - 1, 3, timed=True, seed="after")
        append_synced(log, more)
        assert log.segments[-1].format == FORMAT_2
        assert_holds(log, model[:-1] + more)
    finally:
        log.close()
    assert_all_verify(tmp_path)


def test_damage_in_a_sealed_format_1_segment_is_corruption(tmp_path: Path) -> None:
    old = make_records(0, 20, timed=False)
    write_format_1_segments(tmp_path, old, [10])
    log = open_log(tmp_path)
    append_synced(log, make_records(20, 3, timed=True))
    log.close()
    offsets = read_records(str(seg_path(tmp_path, 10)))
    with open(seg_path(tmp_path, 10), "r+b") as f:  # a data byte of transaction 15
        where = offsets[5][0] + HEAD_1.size + 1
        f.seek(where)
        (b,) = f.read(1)
        f.seek(where)
        f.write(bytes([b ^ 1]))
    with pytest.raises(CorruptSegment, match="data checksum mismatch in transaction 15"):
        open_log(tmp_path)


# --- the offline tools ----------------------------------------------------------------------


def test_verify_and_dump_show_the_format_and_the_times(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    old = make_records(0, 5, timed=False)
    write_format_1_segments(tmp_path, old, [])
    log = open_log(tmp_path)
    new = make_records(5, 3, timed=True)
    append_synced(log, new)
    log.close()
    ns = argparse.Namespace
    assert admin.cmd_verify(ns(paths=[str(tmp_path)], json=False)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"OK      {seg_path(tmp_path, 0)}: format 1, transactions 0..4")
    assert lines[1].startswith(f"OK      {seg_path(tmp_path, 5)}: format 2, transactions 5..7")
    assert admin.cmd_verify(ns(paths=[str(tmp_path)], json=True)) == 0
    assert [r["format_version"] for r in json.loads(capsys.readouterr().out)] == [1, 2]

    def dump(first: int, as_json: bool) -> list[str]:
        args = ns(segment=str(seg_path(tmp_path, first)), from_txid=None, count=None)
        assert admin.cmd_dump(ns(**vars(args), data=False, json=as_json)) == 0
        return capsys.readouterr().out.splitlines()

    assert all(" time=- " in line for line in dump(0, False))
    assert [f"time={t}" for t in ("2026-01-01T00:00:00.015Z", "2026-01-01T00:00:00.018Z")] == [
        line.split()[3] for line in dump(5, False)[:2]
    ]
    rows = [json.loads(line) for line in dump(0, True)]
    assert [(r["commit_time_ms"], r["commit_time"]) for r in rows] == [(None, None)] * 5
    rows = [json.loads(line) for line in dump(5, True)]
    assert [r["commit_time_ms"] for r in rows] == [r.timestamp for r in new]
    assert rows[2]["commit_time"] == "2026-01-01T00:00:00.021Z"
    # The records dump reads, in either format.
    assert [rec for _, rec, _ in read_records(str(seg_path(tmp_path, 0)))] == old
    assert [rec for _, rec, _ in read_records(str(seg_path(tmp_path, 5)))] == new


# --- a model-based property -----------------------------------------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 30)),
        st.tuples(st.just("truncate"), st.floats(0, 1)),
        st.tuples(st.just("reopen")),
        st.tuples(st.just("read"), st.floats(0, 1), st.integers(1, 40), st.integers(1, 3000)),
    ),
    max_size=14,
)


def expected_read(model: list[Record], txid: int, max_records: int, max_bytes: int):
    """A maximal run from ``txid`` within both bounds (wire size, format 2), at least one."""
    out: list[Record] = []
    size = 0
    for rec in model[txid : txid + max_records]:
        size += WIRE_OVERHEAD + len(rec.data)
        if out and size > max_bytes:
            break
        out.append(rec)
    return out


@settings(max_examples=40, deadline=None)
@given(
    old_count=st.integers(0, 40),
    split_fractions=st.lists(st.floats(0, 1), max_size=3),
    ops=OPS,
    segment_bytes=st.sampled_from([600, 2000, 1 << 20]),
)
def test_random_appends_truncates_reopens_over_a_format_1_start_match_a_model(
    tmp_path_factory: pytest.TempPathFactory,
    old_count: int,
    split_fractions: list[float],
    ops,
    segment_bytes: int,
) -> None:
    directory = tmp_path_factory.mktemp("model")
    model = make_records(0, old_count, timed=False, seed="old")
    splits = sorted({int(f * old_count) for f in split_fractions} - {0})
    write_format_1_segments(directory, model, splits)
    old_firsts = [0, *splits]
    old_files = {  # the old segments never truncated: never changed, byte for byte
        first: seg_path(directory, first).read_bytes() for first in old_firsts
    }
    log = open_log(directory, segment_bytes=segment_bytes)
    try:
        for k, op in enumerate(ops):
            if op[0] == "append":
                new = make_records(len(model), op[1], timed=True, seed=k)
                append_synced(log, new)
                model += new
                assert log.segments[-1].format == DEFAULT_FORMAT
            elif op[0] == "truncate":
                txid = int(op[1] * (len(model) + 1)) - 1
                log.truncate(txid)
                del model[txid + 1 :]
            elif op[0] == "reopen":
                log.close()
                log = open_log(directory, segment_bytes=segment_bytes)
            else:
                _, frac, max_records, max_bytes = op
                start = int(frac * len(model))
                got = log.read(start, max_records, max_bytes)
                assert list(got.records()) == expected_read(model, start, max_records, max_bytes)
            assert log.max_txid == len(model) - 1
            # Format-1 segments first, then format-2 ones only.
            versions = [s.format.version for s in log.segments]
            assert versions == sorted(versions)
        assert_holds(log, model)
        log.close()
        log = open_log(directory, segment_bytes=segment_bytes)
        assert_holds(log, model)
    finally:
        log.close()
    for first, data in old_files.items():
        path = seg_path(directory, first)
        if path.exists() and HEADER.unpack_from(path.read_bytes())[0] == 1:
            assert data.startswith(path.read_bytes())  # at most cut by a truncation
    assert_all_verify(directory)
