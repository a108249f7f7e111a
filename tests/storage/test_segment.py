"""Segment files: byte layout, index checkpoints and recovery, torn tails versus corruption.

Every test works on real files in ``tmp_path``. Damage is made the way a
crash or a bad disk would make it (a cut file, bytes appended, a flipped
byte), and the log is reopened as a restarted node would reopen it.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import random
import shutil
import struct
import uuid
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_client.cluster.metadata import key_fingerprint
from waltz_client.wire.records import NO_TIMESTAMP, Record, RecordBatch, ReqId
from waltz_storage import admin
from waltz_storage import segment as segmod
from waltz_storage.errors import CorruptSegment
from waltz_storage.inspect import read_records, verify_segment
from waltz_storage.partition import PartitionLog

KEY = uuid.UUID("5eed5eed-0000-4000-8000-00000000c0de")
OTHER_KEY = uuid.UUID("0ddba11d-0000-4000-8000-000000000000")
PARTITION = 3

# The documented layout, independent of the module's constants.
HEADER_BYTES = 128
HEADER = struct.Struct(">iq16siq")  # + u32 CRC of these 40 bytes, then 84 zero bytes
# Segment format 2 (what this build writes; format 1 is in test_format_1_segments.py).
RECORD_HEAD = struct.Struct(">qiiiiiiqI")  # txid, reqid x4, header, length, time, data crc
HEAD_BYTES = 44
OVERHEAD = 48  # head + u32 record CRC
TIME = 1_767_225_600_000  # 2026-01-01 UTC: records' commit times count up from it
CHECKPOINT = 1000
WHOLE_LOG = (10**9, 1 << 40)  # max_records, max_bytes for "read everything"


# --- helpers --------------------------------------------------------------------------------


def make_records(
    first: int, n: int, *, seed: int | str = 0, max_size: int = 48, size: int | None = None
) -> list[Record]:
    """Deterministic records with varied ReqIds, headers and data (0..max_size bytes)."""
    out = []
    for t in range(first, first + n):
        rng = random.Random(f"{seed}:{t}")
        length = size if size is not None else rng.randrange(max_size + 1)
        req = ReqId(rng.randrange(-(2**31), 2**31), rng.randrange(9), PARTITION, t)
        header, data = rng.randrange(-(2**31), 2**31), rng.randbytes(length)
        out.append(Record(t, req, header, data, TIME + 7 * t))
    return out


def disk_record(rec: Record) -> bytes:
    """A record in its on-disk layout, encoded independently of the module under test."""
    q = rec.req_id
    head = RECORD_HEAD.pack(
        rec.transaction_id,
        q.client_id,
        q.generation,
        q.partition_id,
        q.seq,
        rec.header,
        len(rec.data),
        rec.timestamp,
        zlib.crc32(rec.data),
    )
    return head + rec.data + struct.pack(">I", zlib.crc32(head))


def open_log(directory: Path, **kwargs) -> PartitionLog:
    kwargs.setdefault("segment_bytes", 1 << 20)
    kwargs.setdefault("max_torn_bytes", 1 << 20)
    return PartitionLog.open(str(directory), PARTITION, KEY, **kwargs)


def build_log(
    directory: Path, recs: list[Record], *, batch: int = 250, segment_bytes: int = 1 << 20
) -> list[list[int]]:
    """Append ``recs`` in synced batches; return each segment's record offsets."""
    log = open_log(directory, segment_bytes=segment_bytes)
    try:
        for i in range(0, len(recs), batch):
            log.append(RecordBatch.from_records(recs[i : i + batch]))
            log.sync()
        return [list(seg.offsets) for seg in log.segments]
    finally:
        log.close()


def seg_paths(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.seg"))


def seg_path(directory: Path, first: int) -> Path:
    return directory / f"{first:019d}.seg"


def idx_path(directory: Path, first: int) -> Path:
    return directory / f"{first:019d}.idx"


def expected_offsets(recs: list[Record]) -> list[int]:
    offsets, pos = [], HEADER_BYTES
    for rec in recs:
        offsets.append(pos)
        pos += OVERHEAD + len(rec.data)
    return offsets


def expected_index(seg: Path, offsets: list[int]) -> bytes:
    header = seg.read_bytes()[:HEADER_BYTES]
    return header + b"".join(struct.pack(">q", off) for off in offsets)


def flip_byte(path: Path, offset: int, mask: int = 0x10) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        (b,) = f.read(1)
        f.seek(offset)
        f.write(bytes([b ^ mask]))


def read_all(log: PartitionLog) -> RecordBatch:
    return log.read(0, *WHOLE_LOG)


def assert_log_holds(log: PartitionLog, recs: list[Record]) -> None:
    """The log holds exactly ``recs``, byte for byte on the wire."""
    assert log.max_txid == len(recs) - 1
    got = read_all(log)
    assert got.buf == RecordBatch.from_records(recs).buf
    assert list(got.records()) == recs


def assert_all_segments_verify(directory: Path) -> None:
    for path in seg_paths(directory):
        report = verify_segment(str(path))
        assert report.ok, report.problems
        assert report.index_entries == report.records


def spy_scan(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record (start offset, expected txid) of every recovery scan."""
    calls: list[tuple[int, int]] = []
    real = segmod.scan_records

    def spy(fd, pos, size, expected, fmt):
        calls.append((pos, expected))
        return real(fd, pos, size, expected, fmt)

    monkeypatch.setattr(segmod, "scan_records", spy)
    return calls


# --- layout ---------------------------------------------------------------------------------


def test_segment_and_index_files_have_the_documented_bytes(tmp_path: Path) -> None:
    recs = [
        *make_records(0, 40, max_size=30),
        Record(40, ReqId(-1, -2, -3, -4), -5, b"", 2**63 - 1),
        Record(41, ReqId(2**31 - 1, 0, 0, 0), 2**31 - 1, bytes(range(256)), -(2**63)),
        Record(42, ReqId(1, 1, 1, 1), 0, b"no time", NO_TIMESTAMP),
    ]
    build_log(tmp_path, recs, batch=7)
    assert sorted(os.listdir(tmp_path)) == ["0000000000000000000.idx", "0000000000000000000.seg"]

    data = seg_path(tmp_path, 0).read_bytes()
    version, created, key, partition, first = HEADER.unpack_from(data)
    assert (version, uuid.UUID(bytes=key), partition, first) == (2, KEY, PARTITION, 0)
    assert created > 1_600_000_000_000  # milliseconds
    assert struct.unpack_from(">I", data, 40) == (zlib.crc32(data[:40]),)
    assert data[44:HEADER_BYTES] == bytes(84)
    assert data[HEADER_BYTES:] == b"".join(disk_record(r) for r in recs)

    index = idx_path(tmp_path, 0).read_bytes()
    assert index == expected_index(seg_path(tmp_path, 0), expected_offsets(recs))


def test_segments_are_named_by_their_first_transaction_id(tmp_path: Path) -> None:
    recs = make_records(0, 300, size=32)  # 80 bytes per record
    offsets = build_log(tmp_path, recs, batch=13, segment_bytes=2000)
    firsts = [0]
    for seg_offsets in offsets[:-1]:
        firsts.append(firsts[-1] + len(seg_offsets))
    assert len(firsts) > 10
    names = sorted(os.listdir(tmp_path))
    assert names == sorted(f"{f:019d}{ext}" for f in firsts for ext in (".seg", ".idx"))
    for f, seg_offsets in zip(firsts, offsets, strict=True):
        data = seg_path(tmp_path, f).read_bytes()
        assert HEADER.unpack_from(data)[4] == f
        assert idx_path(tmp_path, f).read_bytes()[:HEADER_BYTES] == data[:HEADER_BYTES]
        assert data[HEADER_BYTES:] == b"".join(
            disk_record(r) for r in recs[f : f + len(seg_offsets)]
        )


# --- index checkpoints and recovery ---------------------------------------------------------


@pytest.mark.parametrize("count", [999, 1000, 1500, 2000, 2345])
def test_recovery_checks_every_record_whatever_the_index_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    """The index is evidence of what was synced, never a reason to skip a record: damage
    anywhere must be found on open, not by a read much later."""
    recs = make_records(0, count, max_size=12)
    (before,) = build_log(tmp_path, recs, batch=700)
    seg = seg_path(tmp_path, 0)
    index_before = idx_path(tmp_path, 0).read_bytes()
    calls = spy_scan(monkeypatch)

    log = open_log(tmp_path)
    try:
        (segment,) = log.segments
        assert list(segment.offsets) == before == expected_offsets(recs)
        assert calls == [(HEADER_BYTES, 0)]  # from the first record, checkpoints or not
        assert_log_holds(log, recs)
    finally:
        log.close()
    assert idx_path(tmp_path, 0).read_bytes() == index_before == expected_index(seg, before)
    assert_all_segments_verify(tmp_path)


def test_checkpoints_fsync_the_index_every_1000_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log(tmp_path)
    index_ino = os.stat(idx_path(tmp_path, 0)).st_ino
    synced: list[int] = []
    data_synced: list[int] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def counting_fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    def counting_fdatasync(fd: int) -> None:
        data_synced.append(os.fstat(fd).st_ino)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    monkeypatch.setattr(os, "fdatasync", counting_fdatasync)
    index_syncs = []
    try:
        recs = make_records(0, 2600, size=0)
        for i in range(0, 2600, 200):
            log.append(RecordBatch.from_records(recs[i : i + 200]))
            log.sync()
            index_syncs.append(synced.count(index_ino))
    finally:
        log.close()
    # One data fdatasync per sync; the index is fsync'd when the count reaches 1000 and 2000.
    assert len(data_synced) == 13 and index_ino not in data_synced
    assert synced == [index_ino] * 2
    assert index_syncs == [0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2]


def _damage_index(kind: str, idx: Path, seg: Path, offsets: list[int]) -> None:
    data = bytearray(idx.read_bytes())
    entries = list(struct.unpack_from(f">{len(offsets)}q", data, HEADER_BYTES))
    if kind == "deleted":
        idx.unlink()
        return
    if kind == "empty":
        data = bytearray()
    elif kind == "random garbage":
        data = bytearray(random.Random(7).randbytes(9000))
    elif kind == "header of another time":
        header = bytearray(seg.read_bytes()[:HEADER_BYTES])
        struct.pack_into(">q", header, 4, 1)
        struct.pack_into(">I", header, 40, zlib.crc32(bytes(header[:40])))
        data[:HEADER_BYTES] = header
    elif kind == "entries zeroed":
        data[HEADER_BYTES:] = bytes(len(data) - HEADER_BYTES)
    elif kind == "entries shifted":
        data[HEADER_BYTES:] = b"".join(struct.pack(">q", e + 1) for e in entries)
    elif kind == "middle page zeroed":
        # The last trusted entry (999) is still right; entries 300..699 are a lost page.
        data[HEADER_BYTES + 8 * 300 : HEADER_BYTES + 8 * 700] = bytes(8 * 400)
    elif kind == "entries past the data":
        end = seg.stat().st_size
        data += b"".join(struct.pack(">q", end + 1 + 40 * k) for k in range(1000))
    elif kind == "torn last entry":
        data = data[: len(data) - 5]
    elif kind == "last trusted entry points at the wrong record":
        struct.pack_into(">q", data, HEADER_BYTES + 8 * 999, entries[998])
    else:  # pragma: no cover
        raise AssertionError(kind)
    idx.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "kind",
    [
        "deleted",
        "empty",
        "random garbage",
        "header of another time",
        "entries zeroed",
        "entries shifted",
        "middle page zeroed",
        "entries past the data",
        "torn last entry",
        "last trusted entry points at the wrong record",
    ],
)
def test_a_missing_or_damaged_index_is_rebuilt_from_the_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    recs = make_records(0, 1200, max_size=10)
    (before,) = build_log(tmp_path, recs, batch=600)
    seg, idx = seg_path(tmp_path, 0), idx_path(tmp_path, 0)
    _damage_index(kind, idx, seg, before)
    calls = spy_scan(monkeypatch)

    log = open_log(tmp_path)
    try:
        assert list(log.segments[0].offsets) == before
        assert_log_holds(log, recs)
        assert calls == [(HEADER_BYTES, 0)]  # every record is checked
        log.append(RecordBatch.from_records(make_records(1200, 5, seed="more")))
        log.sync()
    finally:
        log.close()
    recs += make_records(1200, 5, seed="more")
    assert idx.read_bytes() == expected_index(seg, expected_offsets(recs))
    assert_all_segments_verify(tmp_path)
    log = open_log(tmp_path)
    try:
        assert_log_holds(log, recs)
    finally:
        log.close()


def test_a_wrong_checkpointed_entry_is_never_used(tmp_path: Path) -> None:
    """An index entry before the checkpoint that points at the wrong record: the offsets come
    from the records themselves, and the entry is rewritten."""
    recs = make_records(0, 1100, size=8)
    (offsets,) = build_log(tmp_path, recs, batch=1100)
    idx = idx_path(tmp_path, 0)
    data = bytearray(idx.read_bytes())
    struct.pack_into(">q", data, HEADER_BYTES + 8 * 500, offsets[500] + 1)
    idx.write_bytes(bytes(data))
    report = verify_segment(str(seg_path(tmp_path, 0)))
    assert not report.ok
    assert "entry 500 (transaction 500)" in report.problems[0]
    log = open_log(tmp_path)
    try:
        assert log.read(500, 1, 1 << 20).buf == RecordBatch.from_records([recs[500]]).buf
        assert_log_holds(log, recs)
    finally:
        log.close()
    assert_all_segments_verify(tmp_path)


@pytest.mark.parametrize("chunk", [1, 37, 64, 200])
def test_recovery_scan_across_small_read_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    recs = make_records(0, 150, max_size=300)
    (before,) = build_log(tmp_path, recs, batch=40)
    idx_path(tmp_path, 0).unlink()
    with open(seg_path(tmp_path, 0), "ab") as f:
        f.write(disk_record(recs[-1])[:-9])  # a torn copy of a record
    monkeypatch.setattr(segmod, "SCAN_CHUNK_BYTES", chunk)
    log = open_log(tmp_path)
    try:
        assert list(log.segments[0].offsets) == before
        assert_log_holds(log, recs)
    finally:
        log.close()
    assert_all_segments_verify(tmp_path)


# --- torn tails -----------------------------------------------------------------------------

TORN_SCENARIOS = {
    # name: (record count, segment_bytes, batch)
    "one segment, no checkpoint": (12, 1 << 20, 5),
    "checkpoint covers the last record": (1000, 1 << 20, 500),
    "last record right after a checkpoint": (1001, 1 << 20, 1001),
    "last of several segments": (120, 1500, 9),
    "only record of the last segment": (None, 1500, 1),
}


def _torn_fixture(tmp_path: Path, name: str) -> tuple[Path, list[Record], int, int]:
    """Build the log of scenario ``name``; return its directory, its records, the last
    segment's first transaction ID and the offset of the last record in that segment."""
    count, segment_bytes, batch = TORN_SCENARIOS[name]
    recs = make_records(0, count or 400, max_size=20)
    if count is None:
        # Keep the records up to the first one of the third segment.
        probe = tmp_path / "probe"
        offsets = build_log(probe, recs, batch=batch, segment_bytes=segment_bytes)
        recs = recs[: len(offsets[0]) + len(offsets[1]) + 1]
        shutil.rmtree(probe)
    src = tmp_path / "src"
    offsets = build_log(src, recs, batch=batch, segment_bytes=segment_bytes)
    if name == "only record of the last segment":
        assert len(offsets) == 3 and len(offsets[-1]) == 1
    if name == "last of several segments":
        assert len(offsets) > 3 and len(offsets[-1]) > 1
    return src, recs, len(recs) - len(offsets[-1]), offsets[-1][-1]


@pytest.mark.parametrize("name", list(TORN_SCENARIOS))
def test_a_cut_at_every_byte_of_the_last_record_recovers_to_the_record_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    src, recs, first, last_offset = _torn_fixture(tmp_path, name)
    _, segment_bytes, _ = TORN_SCENARIOS[name]
    end = seg_path(src, first).stat().st_size
    assert end - last_offset == OVERHEAD + len(recs[-1].data)
    replacement = make_records(len(recs) - 1, 2, seed="after the cut", size=5)

    for cut in range(last_offset, end):
        work = tmp_path / f"cut{cut}"
        shutil.copytree(src, work)
        os.truncate(seg_path(work, first), cut)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="waltz_storage.segment"):
            log = open_log(work, segment_bytes=segment_bytes, max_torn_bytes=200)
        try:
            assert_log_holds(log, recs[:-1])
            assert seg_path(work, first).stat().st_size == last_offset
            # Zeros after the records are free space (the first bytes of a head are the
            # transaction ID's zero high bytes): the torn tail ends at the last non-zero.
            torn = len(seg_path(src, first).read_bytes()[last_offset:cut].rstrip(b"\0"))
            if torn:
                (message,) = [r.getMessage() for r in caplog.records if "torn" in r.getMessage()]
                assert f"cutting {torn} bytes of torn tail" in message
                assert f"now ends at transaction {len(recs) - 2}" in message
                assert f"transaction {len(recs) - 1}" in message
            else:  # a cut exactly between records (or zeros after them) is a clean end
                assert not [r for r in caplog.records if "torn" in r.getMessage()]
            # Appending continues with the next transaction ID.
            log.append(RecordBatch.from_records(replacement))
            log.sync()
        finally:
            log.close()
        log = open_log(work, segment_bytes=segment_bytes, max_torn_bytes=200)
        try:
            assert_log_holds(log, recs[:-1] + replacement)
        finally:
            log.close()
        assert_all_segments_verify(work)
        shutil.rmtree(work)


@pytest.mark.parametrize(
    "tail",
    [
        b"\x00",
        bytes(HEAD_BYTES - 1),
        bytes(HEAD_BYTES),
        bytes(OVERHEAD - 1),
        bytes(OVERHEAD),
        bytes(4096),
        random.Random(1).randbytes(1),
        random.Random(2).randbytes(77),
        random.Random(3).randbytes(3000),
        b"\xff" * 100,
        "duplicate of the last record",
        "next record with a bad data checksum",
        "next record cut short",
    ],
    ids=lambda t: t if isinstance(t, str) else f"{len(t)} bytes of {t[:1].hex() or 'nothing'}",
)
def test_bytes_after_the_last_record_are_cut(tmp_path: Path, tail: bytes | str) -> None:
    recs = make_records(0, 30)
    build_log(tmp_path, recs, batch=10)
    seg = seg_path(tmp_path, 0)
    clean = seg.read_bytes()
    if tail == "duplicate of the last record":
        tail = disk_record(recs[-1])
    elif tail == "next record with a bad data checksum":
        rec = bytearray(disk_record(make_records(30, 1, size=20)[0]))
        rec[HEAD_BYTES + 3] ^= 1
        tail = bytes(rec)
    elif tail == "next record cut short":
        tail = disk_record(make_records(30, 1, size=20)[0])[:-1]
    with open(seg, "ab") as f:
        f.write(tail)

    log = open_log(tmp_path, max_torn_bytes=4096)
    try:
        assert_log_holds(log, recs)
        log.append(RecordBatch.from_records(make_records(30, 3, seed="x")))
        log.sync()
    finally:
        log.close()
    assert seg.read_bytes()[: len(clean)] == clean
    assert_all_segments_verify(tmp_path)


def test_a_whole_valid_record_after_the_index_is_kept(tmp_path: Path) -> None:
    """A record that made it to disk before a crash is not a torn tail, even if never indexed."""
    recs = make_records(0, 31)
    build_log(tmp_path, recs[:30], batch=10)
    with open(seg_path(tmp_path, 0), "ab") as f:
        f.write(disk_record(recs[30]))
    log = open_log(tmp_path, max_torn_bytes=0)
    try:
        assert_log_holds(log, recs)
    finally:
        log.close()
    assert_all_segments_verify(tmp_path)


def drop_index_entries(directory: Path, first: int, keep: int) -> None:
    """Leave only the first ``keep`` entries in a segment's index, as after a crash that
    came before the entries of the last write group were written (they follow its fsync)."""
    idx = idx_path(directory, first)
    os.truncate(idx, HEADER_BYTES + 8 * keep)


LENGTH_FIELD = range(28, 32)  # bytes of the i32 data length in a record's head


def test_every_flipped_byte_of_an_unsynced_last_record_is_cut_as_a_torn_tail(
    tmp_path: Path,
) -> None:
    recs = make_records(0, 20, size=24)
    src = tmp_path / "src"
    (offsets,) = build_log(src, recs, batch=20)
    drop_index_entries(src, 0, 19)  # the last record's entry was never written
    last, end = offsets[-1], offsets[-1] + OVERHEAD + 24
    for position in range(last, end):
        work = tmp_path / f"flip{position}"
        shutil.copytree(src, work)
        flip_byte(seg_path(work, 0), position)
        log = open_log(work, max_torn_bytes=OVERHEAD + 24)
        try:
            assert_log_holds(log, recs[:-1])
        finally:
            log.close()
        assert seg_path(work, 0).stat().st_size == last
        assert_all_segments_verify(work)
        shutil.rmtree(work)


def test_damage_to_a_record_the_index_shows_as_synced_is_corruption(tmp_path: Path) -> None:
    """An index entry is written only after its record's fsync: that record was acknowledged,
    so damage to it is corruption even inside the torn window."""
    recs = make_records(0, 20, size=24)
    src = tmp_path / "src"
    (offsets,) = build_log(src, recs, batch=20)
    last, end = offsets[-1], offsets[-1] + OVERHEAD + 24
    for position in range(last, end):
        if position - last in LENGTH_FIELD:
            continue  # a length that runs past the end: see the length-field test below
        work = tmp_path / f"flip{position}"
        shutil.copytree(src, work)
        flip_byte(seg_path(work, 0), position)
        damaged = seg_path(work, 0).read_bytes()
        with pytest.raises(CorruptSegment, match=r"\(transaction 19\).*synced"):
            open_log(work, max_torn_bytes=1 << 20)
        assert seg_path(work, 0).read_bytes() == damaged
        shutil.rmtree(work)


def test_a_flipped_byte_before_the_torn_window_refuses_to_open(tmp_path: Path) -> None:
    """Damage with more than one write group after it cannot be a torn write."""
    recs = make_records(0, 20, size=24)
    src = tmp_path / "src"
    (offsets,) = build_log(src, recs, batch=20)
    drop_index_entries(src, 0, 0)  # no index entry to tell: only the window decides
    k = 10
    max_torn = 4 * (OVERHEAD + 24)  # records 16..19 fit; record 10 has 10 records after it
    for position in range(offsets[k], offsets[k + 1]):
        if position - offsets[k] in LENGTH_FIELD:
            continue  # see test_a_damaged_length_field_is_not_mistaken_for_a_torn_tail
        work = tmp_path / f"flip{position}"
        shutil.copytree(src, work)
        flip_byte(seg_path(work, 0), position)
        damaged = seg_path(work, 0).read_bytes()
        with pytest.raises(CorruptSegment) as excinfo:
            open_log(work, max_torn_bytes=max_torn)
        message = str(excinfo.value)
        assert f"(transaction {k})" in message
        assert f"partition {PARTITION}" in message
        assert "refusing to open" in message
        assert seg_path(work, 0).read_bytes() == damaged  # nothing was cut
        shutil.rmtree(work)


@pytest.mark.parametrize("index", ["index entries written", "index entries lost"])
def test_a_damaged_length_field_is_not_mistaken_for_a_torn_tail(tmp_path: Path, index: str) -> None:
    """A flipped high byte of a middle record's data length makes the record seem to run
    past the end of the file. It is still damage with ten acknowledged records after it
    (and, with the index entries written, a record the index shows as synced): the
    partition must refuse to open rather than cut them."""
    recs = make_records(0, 20, size=24)
    src = tmp_path / "src"
    (offsets,) = build_log(src, recs, batch=20)
    if index == "index entries lost":
        drop_index_entries(src, 0, 0)
    k = 10
    max_torn = 4 * (OVERHEAD + 24)
    cut_as_torn = []
    for byte in (28, 29, 30):  # the three high bytes of the i32 length
        work = tmp_path / f"byte{byte}"
        shutil.copytree(src, work)
        flip_byte(seg_path(work, 0), offsets[k] + byte)
        damaged = seg_path(work, 0).read_bytes()
        try:
            log = open_log(work, max_torn_bytes=max_torn)
        except CorruptSegment as e:
            assert f"(transaction {k})" in str(e)
            assert seg_path(work, 0).read_bytes() == damaged
        else:
            cut_as_torn.append((byte, log.max_txid))
            log.close()
    assert cut_as_torn == [], (
        f"flipped length bytes of transaction {k} (with {len(damaged) - offsets[k]} bytes after "
        f"it, max_torn_bytes {max_torn}) were cut as a torn tail; (head byte, max txid after "
        f"open): {cut_as_torn}"
    )


def zero_from(path: Path, offset: int) -> None:
    """Zeros from ``offset`` to the end of the file: pages of a write that never reached
    the disk (the file's size did)."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(size - offset))


def test_the_torn_window_is_measured_from_the_damage_to_the_last_non_zero_byte(
    tmp_path: Path,
) -> None:
    recs = make_records(0, 20, size=24)
    (offsets,) = build_log(tmp_path, recs, batch=20)
    drop_index_entries(tmp_path, 0, 15)  # records 15.. were the last, unindexed write group
    seg = seg_path(tmp_path, 0)
    pristine = seg.read_bytes()
    zero_from(seg, offsets[15] + HEAD_BYTES + 1)
    with open(seg, "r+b") as f:  # one byte of the write group's end reached the disk
        f.seek(len(pristine) - 1)
        f.write(b"\xff")
    after = len(pristine) - offsets[15]  # 5 records
    with pytest.raises(CorruptSegment, match=f"with {after} bytes after it"):
        open_log(tmp_path, max_torn_bytes=after - 1)
    log = open_log(tmp_path, max_torn_bytes=after)
    try:
        assert_log_holds(log, recs[:15])
    finally:
        log.close()

    # Zeros to the end of the file are space written ahead of the records, not part of
    # the window: it ends at the last non-zero byte, in the head of transaction 15.
    seg.write_bytes(pristine)
    zero_from(seg, offsets[15] + HEAD_BYTES + 1)
    head_end = len(pristine[offsets[15] : offsets[15] + HEAD_BYTES + 1].rstrip(b"\0"))
    with pytest.raises(CorruptSegment, match=f"with {head_end} bytes after it"):
        open_log(tmp_path, max_torn_bytes=head_end - 1)
    log = open_log(tmp_path, max_torn_bytes=head_end)
    try:
        assert_log_holds(log, recs[:15])
        assert seg.stat().st_size == offsets[15]
    finally:
        log.close()


def test_index_entries_that_disagree_with_the_scan_prove_nothing(tmp_path: Path) -> None:
    """Entries past the checkpoint are hints: only ones matching the scanned records count."""
    recs = make_records(0, 20, size=24)
    (offsets,) = build_log(tmp_path, recs, batch=20)
    idx = idx_path(tmp_path, 0)
    data = bytearray(idx.read_bytes())
    struct.pack_into(">q", data, HEADER_BYTES + 8 * 3, offsets[3] + 1)  # a wrong early entry
    idx.write_bytes(bytes(data))
    flip_byte(seg_path(tmp_path, 0), offsets[19] + HEAD_BYTES + 2)
    log = open_log(tmp_path, max_torn_bytes=1 << 20)
    try:
        assert_log_holds(log, recs[:19])
    finally:
        log.close()
    assert_all_segments_verify(tmp_path)


@pytest.mark.parametrize("where", ["last record", "first record", "head byte", "record crc"])
def test_damage_in_a_segment_before_the_last_is_corruption(tmp_path: Path, where: str) -> None:
    recs = make_records(0, 60, size=40)
    offsets = build_log(tmp_path, recs, batch=60, segment_bytes=1000)
    assert len(offsets) >= 3
    first_of_second = len(offsets[0])
    target = {
        "last record": offsets[1][-1] + HEAD_BYTES + 5,
        "first record": offsets[1][0] + HEAD_BYTES,
        "head byte": offsets[1][2] + 9,
        "record crc": offsets[1][-1] + OVERHEAD + 40 - 1,
    }[where]
    flip_byte(seg_path(tmp_path, first_of_second), target)
    with pytest.raises(CorruptSegment, match="a segment before the last cannot have a torn tail"):
        open_log(tmp_path, segment_bytes=1000, max_torn_bytes=1 << 30)


def test_a_missing_middle_segment_is_corruption(tmp_path: Path) -> None:
    recs = make_records(0, 60, size=40)
    offsets = build_log(tmp_path, recs, batch=60, segment_bytes=1000)
    second = len(offsets[0])
    third = second + len(offsets[1])
    seg_path(tmp_path, second).unlink()
    idx_path(tmp_path, second).unlink()
    with pytest.raises(
        CorruptSegment, match=f"ends at transaction {second - 1} but the next segment starts at"
    ):
        open_log(tmp_path, segment_bytes=1000)
    assert seg_path(tmp_path, third).exists()


# --- headers --------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [0, 5, 13, 30, 33, 39, 40, 43])
def test_a_damaged_segment_header_refuses_to_open(tmp_path: Path, offset: int) -> None:
    build_log(tmp_path, make_records(0, 5))
    flip_byte(seg_path(tmp_path, 0), offset)
    with pytest.raises(CorruptSegment, match="header checksum mismatch"):
        open_log(tmp_path)


def test_a_segment_of_another_cluster_or_name_refuses_to_open(tmp_path: Path) -> None:
    build_log(tmp_path, make_records(0, 5))
    with pytest.raises(
        CorruptSegment, match=f"belongs to the cluster whose key is {key_fingerprint(KEY)}"
    ):
        PartitionLog.open(str(tmp_path), PARTITION, OTHER_KEY)
    with pytest.raises(CorruptSegment, match="header says partition 3"):
        PartitionLog.open(str(tmp_path), 4, KEY)
    for ext in (".seg", ".idx"):
        os.rename(tmp_path / f"{0:019d}{ext}", tmp_path / f"{7:019d}{ext}")
    with pytest.raises(CorruptSegment, match="first transaction 0, file name says"):
        open_log(tmp_path)


def test_a_torn_segment_creation_is_recreated_only_in_the_last_segment(tmp_path: Path) -> None:
    recs = make_records(0, 60, size=40)
    offsets = build_log(tmp_path, recs, batch=60, segment_bytes=1000)
    first_of_last = 60 - len(offsets[-1])
    # A new segment whose header never reached the disk, after the last one.
    (tmp_path / f"{60:019d}.seg").write_bytes(b"\x00" * 50)
    log = open_log(tmp_path, segment_bytes=1000)
    try:
        assert log.segments[-1].first_txid == 60
        assert_log_holds(log, recs)
        log.append(RecordBatch.from_records(make_records(60, 2)))
        log.sync()
    finally:
        log.close()
    assert_all_segments_verify(tmp_path)
    # The same in a segment before the last is corruption.
    os.truncate(seg_path(tmp_path, first_of_last), 50)
    with pytest.raises(CorruptSegment, match="header is 50 bytes"):
        open_log(tmp_path, segment_bytes=1000)


# --- flipped bytes: verify and reads --------------------------------------------------------


@pytest.mark.parametrize("part", ["head", "data", "record crc"])
def test_verify_reports_a_flipped_byte_naming_the_transaction(tmp_path: Path, part: str) -> None:
    recs = make_records(0, 30, size=16)
    (offsets,) = build_log(tmp_path, recs, batch=30)
    seg = seg_path(tmp_path, 0)
    clean = verify_segment(str(seg))
    assert clean.ok and (clean.first_txid, clean.last_txid) == (0, 29)
    assert (clean.records, clean.index_entries) == (30, 30)
    k = 12
    positions = {
        "head": range(offsets[k], offsets[k] + HEAD_BYTES),
        "data": range(offsets[k] + HEAD_BYTES, offsets[k] + HEAD_BYTES + 16),
        "record crc": range(offsets[k] + HEAD_BYTES + 16, offsets[k + 1]),
    }[part]
    for position in positions:
        flip_byte(seg, position)
        before = seg.read_bytes()
        report = verify_segment(str(seg))
        assert not report.ok
        assert report.records == k
        assert f"transaction {k} at offset {offsets[k]}" in report.problems[0]
        if part == "data":
            assert f"data checksum mismatch in transaction {k}" in report.problems[0]
        assert seg.read_bytes() == before  # read-only
        flip_byte(seg, position)  # undo
    assert verify_segment(str(seg)).ok


def test_reads_of_a_damaged_record_raise_instead_of_returning_bad_data(tmp_path: Path) -> None:
    recs = make_records(0, 30, size=16)
    (offsets,) = build_log(tmp_path, recs, batch=30)
    log = open_log(tmp_path)
    try:
        seg = seg_path(tmp_path, 0)
        for position, what in (
            (offsets[12] + HEAD_BYTES + 3, "data checksum mismatch in transaction 12"),
            (offsets[12] + 2, "record checksum mismatch"),
            (offsets[12] + HEAD_BYTES + 16 + 1, "record checksum mismatch"),
        ):
            flip_byte(seg, position)  # behind the open log's back
            for start, count in ((12, 1), (10, 5), (0, 30)):
                with pytest.raises(CorruptSegment, match=what):
                    log.read(start, count, 1 << 20)
            with pytest.raises(CorruptSegment, match="transaction 12"):
                log.read_headers(12, 1, 1 << 20)
            assert log.read(13, 17, 1 << 20).buf == RecordBatch.from_records(recs[13:]).buf
            assert log.read(0, 12, 1 << 20).buf == RecordBatch.from_records(recs[:12]).buf
            flip_byte(seg, position)
        assert_log_holds(log, recs)
    finally:
        log.close()


def test_a_read_refuses_an_index_that_disagrees_with_a_record_or_a_file_cut_short(
    tmp_path: Path,
) -> None:
    """Reads take each record's extent from the index: a record whose head says another
    length, or a data file shorter than the index, is corruption, never bad data."""
    recs = make_records(0, 30, size=16)
    build_log(tmp_path, recs, batch=30)
    log = open_log(tmp_path)
    try:
        offsets = log.segments[0].offsets
        offsets[13] += 4  # record 12 now "ends" 4 bytes late
        with pytest.raises(CorruptSegment, match=r"transaction 12 .*index puts its end"):
            log.read(10, 5, 1 << 20)
        offsets[13] -= 4
        assert log.read(0, 30, 1 << 20).buf == RecordBatch.from_records(recs).buf
        with open(seg_path(tmp_path, 0), "r+b") as f:
            f.truncate(offsets[20] + 3)  # behind the open log's back
        with pytest.raises(CorruptSegment, match="cut short"):
            log.read(15, 10, 1 << 20)
        assert log.read(0, 20, 1 << 20).buf == RecordBatch.from_records(recs[:20]).buf
    finally:
        log.close()


def test_verify_flags_index_entries_that_disagree_with_the_records(tmp_path: Path) -> None:
    recs = make_records(0, 10)
    (offsets,) = build_log(tmp_path, recs)
    idx = idx_path(tmp_path, 0)
    good = idx.read_bytes()
    idx.write_bytes(good + struct.pack(">q", 99999))
    report = verify_segment(str(seg_path(tmp_path, 0)))
    assert report.problems == [f"{idx.name}: 1 entries past the last record"]
    data = bytearray(good)
    struct.pack_into(">q", data, HEADER_BYTES + 8 * 4, offsets[4] + 8)
    idx.write_bytes(bytes(data))
    report = verify_segment(str(seg_path(tmp_path, 0)))
    assert report.problems == [
        f"{idx.name}: entry 4 (transaction 4) is {offsets[4] + 8}, the record is at {offsets[4]}"
    ]
    idx.unlink()
    assert "missing" in verify_segment(str(seg_path(tmp_path, 0))).problems[0]


def test_verify_and_dump_commands(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    recs = make_records(0, 40, size=10)
    offsets = build_log(tmp_path, recs, batch=40, segment_bytes=1000)
    assert len(offsets) > 1
    ns = argparse.Namespace
    assert admin.cmd_verify(ns(paths=[str(tmp_path)], json=True)) == 0
    reports = json.loads(capsys.readouterr().out)
    firsts = [sum(len(o) for o in offsets[:k]) for k in range(len(offsets))]
    assert [r["first_txid"] for r in reports] == firsts
    assert all(r["ok"] for r in reports)
    assert all(r["format_version"] == 2 for r in reports)
    assert sum(r["records"] for r in reports) == 40

    assert (
        admin.cmd_dump(
            ns(segment=str(seg_path(tmp_path, 0)), from_txid=3, count=2, data=True, json=True)
        )
        == 0
    )
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["transaction_id"] for r in rows] == [3, 4]
    assert rows[0]["offset"] == offsets[0][3]
    assert bytes.fromhex(rows[1]["data_hex"]) == recs[4].data
    assert rows[1]["req_id"] == list(struct.unpack(">iiii", recs[4].req_id.encode()))
    assert rows[1]["crc32"] == zlib.crc32(recs[4].data)
    assert rows[1]["commit_time_ms"] == recs[4].timestamp == TIME + 28
    assert rows[1]["commit_time"] == "2026-01-01T00:00:00.028Z"
    assert (
        admin.cmd_dump(
            ns(segment=str(seg_path(tmp_path, 0)), from_txid=4, count=1, data=False, json=False)
        )
        == 0
    )
    assert " time=2026-01-01T00:00:00.028Z " in capsys.readouterr().out

    flip_byte(seg_path(tmp_path, 0), offsets[0][5] + HEAD_BYTES)
    assert admin.cmd_verify(ns(paths=[str(tmp_path)], json=False)) == 1
    out = capsys.readouterr().out
    assert "CORRUPT" in out and "data checksum mismatch in transaction 5" in out
    rows = read_records(str(seg_path(tmp_path, 0)))
    assert [rec.transaction_id for _, rec, _ in rows[:-1]] == [0, 1, 2, 3, 4]
    assert rows[-1][1] is None and "transaction 5" in rows[-1][2]


# --- property: any cut of the file recovers a prefix ----------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 60), min_size=1, max_size=25),
    cut_fraction=st.floats(0, 1),
    chunk=st.sampled_from([16, 100, 4 * 1024 * 1024]),
)
def test_any_cut_recovers_the_whole_records_before_it(
    tmp_path_factory: pytest.TempPathFactory, sizes, cut_fraction, chunk
) -> None:
    directory = tmp_path_factory.mktemp("cut")
    recs = [make_records(t, 1, size=s, seed="p")[0] for t, s in enumerate(sizes)]
    (offsets,) = build_log(directory, recs, batch=max(1, len(recs) // 3))
    seg = seg_path(directory, 0)
    size = seg.stat().st_size
    cut = HEADER_BYTES + int(cut_fraction * (size - HEADER_BYTES))
    os.truncate(seg, cut)
    # A crash can only tear what was never synced, and so never indexed: keep the index
    # entries of the whole records only (with them all, a deep cut is corruption).
    whole = sum(1 for k, off in enumerate(offsets) if off + OVERHEAD + sizes[k] <= cut)
    idx = idx_path(directory, 0)
    os.truncate(idx, min(idx.stat().st_size, HEADER_BYTES + 8 * whole))
    old_chunk = segmod.SCAN_CHUNK_BYTES
    segmod.SCAN_CHUNK_BYTES = chunk
    try:
        log = open_log(directory, max_torn_bytes=size)
        try:
            assert_log_holds(log, recs[:whole])
        finally:
            log.close()
    finally:
        segmod.SCAN_CHUNK_BYTES = old_chunk
    assert_all_segments_verify(directory)


def test_a_cut_through_several_synced_records_is_corruption(tmp_path: Path) -> None:
    """The index shows records after the cut were synced: refuse instead of dropping them."""
    recs = make_records(0, 20, size=24)
    (offsets,) = build_log(tmp_path, recs, batch=5)
    os.truncate(seg_path(tmp_path, 0), offsets[10] + 7)
    with pytest.raises(CorruptSegment, match="synced"):
        open_log(tmp_path, max_torn_bytes=1 << 20)


# --- zeros written ahead of the records -----------------------------------------------------


def test_the_active_segment_has_zeros_ahead_and_a_clean_close_cuts_them(tmp_path: Path) -> None:
    recs = make_records(0, 300, max_size=40)
    log = open_log(tmp_path, segment_bytes=1 << 30)
    try:
        log.append(RecordBatch.from_records(recs))
        log.sync()
        end = expected_offsets(recs)[-1] + OVERHEAD + len(recs[-1].data)
        data = seg_path(tmp_path, 0).read_bytes()
        assert len(data) - end >= segmod.PREALLOCATE_AHEAD
        assert data[end:] == bytes(len(data) - end)
        report = verify_segment(str(seg_path(tmp_path, 0)))  # verify reads it open, too
        assert report.ok and report.records == 300, report.problems
        dumped = read_records(str(seg_path(tmp_path, 0)))  # and so does dump
        assert [(record, problem) for _, record, problem in dumped] == [(r, None) for r in recs]
    finally:
        log.close()
    assert seg_path(tmp_path, 0).stat().st_size == end
    assert_all_segments_verify(tmp_path)


def test_zeros_a_crash_left_after_the_records_are_free_space(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A node killed with zeros ahead of its records reopens with every record, warns of no
    damage, cuts the zeros and appends where the records end."""
    recs = make_records(0, 120, max_size=40)
    log = open_log(tmp_path / "live")
    try:
        log.append(RecordBatch.from_records(recs[:100]))
        log.sync()
        shutil.copytree(tmp_path / "live", tmp_path / "crashed")  # the files, unclosed
    finally:
        log.close()
    crashed = tmp_path / "crashed"
    end = expected_offsets(recs)[100]
    assert seg_path(crashed, 0).stat().st_size > end
    with caplog.at_level(logging.INFO, logger="waltz_storage"):
        log = open_log(crashed, max_torn_bytes=64)
    try:
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert_log_holds(log, recs[:100])
        assert seg_path(crashed, 0).stat().st_size == end
        log.append(RecordBatch.from_records(recs[100:]))
        log.sync()
        assert_log_holds(log, recs)
    finally:
        log.close()
    assert_all_segments_verify(crashed)


def test_synced_records_that_read_as_zeros_are_still_corruption(tmp_path: Path) -> None:
    """Zeros are free space only after the records: three records the index shows were
    synced, zeroed to the end of the file, are acknowledged data gone missing."""
    recs = make_records(0, 20, size=24)
    (offsets,) = build_log(tmp_path, recs, batch=5)
    zero_from(seg_path(tmp_path, 0), offsets[17])
    with pytest.raises(CorruptSegment, match="3 entries past it"):
        open_log(tmp_path, max_torn_bytes=1 << 20)


def test_a_full_disk_stops_the_zeros_but_not_the_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Zeros ahead are only a speed-up: when they cannot be written the file ends at its
    records, appends extend it, and the next try waits for another step of records."""
    real_pwrite = os.pwrite
    zero_writes = []

    def no_room_for_zeros(fd: int, data, offset: int) -> int:
        if isinstance(data, memoryview) and data.obj is segmod._ZEROS.obj:
            zero_writes.append(offset)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    recs = make_records(0, 400, size=100)
    log = open_log(tmp_path)
    try:
        monkeypatch.setattr(os, "pwrite", no_room_for_zeros)
        with caplog.at_level(logging.INFO, logger="waltz_storage.segment"):
            for i in range(0, 400, 20):
                log.append(RecordBatch.from_records(recs[i : i + 20]))
                log.sync()
        assert_log_holds(log, recs)
        end = expected_offsets(recs)[-1] + OVERHEAD + 100
        assert seg_path(tmp_path, 0).stat().st_size == end
        assert len(zero_writes) == 1  # 40 KiB of records: under a step, so no second try
        assert "cannot write zeros ahead" in caplog.text
    finally:
        log.close()
    assert_all_segments_verify(tmp_path)


def test_zeros_stop_where_the_segment_will_roll(tmp_path: Path) -> None:
    """A small segment gets zeros only up to its size limit, so retention's arithmetic
    over segment sizes holds for the files on disk too."""
    recs = make_records(0, 60, size=100)
    log = open_log(tmp_path, segment_bytes=4096)
    try:
        for i in range(0, 60, 6):
            log.append(RecordBatch.from_records(recs[i : i + 6]))
            log.sync()
            active = seg_path(tmp_path, log.segments[-1].first_txid)
            assert active.stat().st_size == max(4096, log.segments[-1].size)
        assert len(log.segments) > 1
        assert_log_holds(log, recs)
    finally:
        log.close()
    assert_all_segments_verify(tmp_path)


def test_a_large_write_adds_no_zeros_after_it(tmp_path: Path) -> None:
    """A write group of ZEROS_FOR_WRITES_UNDER bytes or more is appended as it is: the
    next such group would overwrite zeros written after it at once."""
    large = make_records(0, 300, size=1000)  # about 312 KiB on disk
    small = make_records(300, 10, size=100)
    assert sum(OVERHEAD + len(r.data) for r in large) >= segmod.ZEROS_FOR_WRITES_UNDER
    log = open_log(tmp_path, segment_bytes=1 << 30)
    try:
        log.append(RecordBatch.from_records(large))
        log.sync()
        assert seg_path(tmp_path, 0).stat().st_size == log.segments[-1].size
        log.append(RecordBatch.from_records(small))
        log.sync()
        assert seg_path(tmp_path, 0).stat().st_size > log.segments[-1].size  # zeros ahead
        assert_log_holds(log, large + small)
    finally:
        log.close()


def test_records_written_after_a_failed_write_are_past_the_durable_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed write cuts the file back to its last record, freeing the blocks after it,
    so what is written there next needs an fdatasync of its own (group_sync.py), not just
    its pages written back."""
    recs = make_records(0, 30, size=100)
    log = open_log(tmp_path)
    try:
        log.append(RecordBatch.from_records(recs[:20]))
        segment = log.segments[-1]
        assert not segment.overwrites_durable_blocks  # nothing fdatasync'd by us yet
        log.sync()
        assert segment.overwrites_durable_blocks  # the zeros ahead are durable now
        real_pwrite = os.pwrite

        def disk_full(fd: int, data, offset: int) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "pwrite", disk_full)
        with pytest.raises(OSError, match="No space left"):
            log.append(RecordBatch.from_records(recs[20:]))
        monkeypatch.setattr(os, "pwrite", real_pwrite)
        log.append(RecordBatch.from_records(recs[20:]))
        assert not segment.overwrites_durable_blocks
        log.sync()
        assert segment.overwrites_durable_blocks
        assert_log_holds(log, recs)
    finally:
        log.close()
