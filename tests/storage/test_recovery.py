"""Recovery decisions on open: torn tail or corruption, and the local low-water mark floor.

The decision functions are checked as a table; the rest on real files written
by ``PartitionLog`` and damaged in ``tmp_path``. A refused open must leave
every file exactly as it found it.
"""

from __future__ import annotations

import logging
import os
import random
import struct
import uuid
import zlib
from array import array
from pathlib import Path

import pytest

from waltz_client.wire.records import FORMAT_1, FORMAT_2, Record, RecordBatch, ReqId
from waltz_storage.errors import CorruptSegment, PartitionRefused
from waltz_storage.partition import PartitionLog
from waltz_storage.recovery import (
    PartitionScan,
    intact_record_after,
    refusal,
    torn_tail_reason,
)

KEY = uuid.UUID("7ec0ffee-0000-4000-8000-00000000beef")
PARTITION = 2
HEADER_BYTES = 128
HEAD_BYTES = 44  # segment format 2, what the log writes
OVERHEAD = 48
DATA = 24  # data bytes per record: a record takes 72 bytes on disk


def make_records(first: int, n: int, size: int = DATA) -> list[Record]:
    rng = random.Random(f"recovery:{first}:{n}")
    return [
        Record(t, ReqId(1, 2, PARTITION, t), t, rng.randbytes(size))
        for t in range(first, first + n)
    ]


def open_log(
    directory: Path, *, floor: int = -1, max_torn_bytes: int = 1 << 20, **kw
) -> PartitionLog:
    return PartitionLog.open(
        str(directory),
        PARTITION,
        KEY,
        segment_bytes=kw.get("segment_bytes", 1 << 20),
        max_torn_bytes=max_torn_bytes,
        floor=floor,
    )


def build(
    directory: Path, n: int, *, segment_bytes: int = 1 << 20, batch: int = 50
) -> list[Record]:
    recs = make_records(0, n)
    log = open_log(directory, segment_bytes=segment_bytes)
    try:
        for i in range(0, n, batch):
            log.append(RecordBatch.from_records(recs[i : i + batch]))
            log.sync()
    finally:
        log.close()
    return recs


def seg(directory: Path, first: int = 0) -> Path:
    return directory / f"{first:019d}.seg"


def idx(directory: Path, first: int = 0) -> Path:
    return directory / f"{first:019d}.idx"


def offset(txid: int) -> int:
    return HEADER_BYTES + txid * (OVERHEAD + DATA)


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def patch(path: Path, at: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


def flip(path: Path, at: int) -> None:
    with open(path, "rb") as f:
        f.seek(at)
        (b,) = f.read(1)
    patch(path, at, bytes([b ^ 0x08]))


def refused(directory: Path, match: str, **kw) -> PartitionRefused:
    before = files(directory)
    with pytest.raises(PartitionRefused, match=match) as info:
        open_log(directory, **kw)
    assert files(directory) == before, "a refused open changed the files"
    return info.value


# --- the decisions ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("is_last", "synced", "cut_short_last_hint", "cut", "expected"),
    [
        (True, False, False, 100, None),
        (True, False, False, 101, "more than one write group"),
        (False, False, False, 1, "a segment before the last"),
        (True, True, False, 1, "synced"),
        (True, True, True, 1, None),  # the last record, synced, cut short by the end of the file
        (True, True, True, 101, "more than one write group"),
    ],
)
def test_torn_tail_reason(is_last, synced, cut_short_last_hint, cut, expected) -> None:
    reason = torn_tail_reason(
        is_last=is_last,
        synced=synced,
        cut_short_last_hint=cut_short_last_hint,
        cut=cut,
        max_torn_bytes=100,
    )
    assert reason is None if expected is None else expected in reason


def _scan(end: int, problem: str | None = None) -> PartitionScan:
    return PartitionScan("/d/4", 4, [], end, problem, None, [])


@pytest.mark.parametrize(
    ("end", "floor", "problem", "words"),
    [
        (10, 10, None, None),
        (11, 10, None, None),
        (-1, -1, None, None),
        (9, 10, None, ["ends at transaction 9", "local low-water mark 10", "no segment file"]),
        (-1, 0, None, ["ends at transaction -1", "local low-water mark 0"]),
        (9, 10, "bad record", ["ends at transaction 9", "local low-water mark 10", "bad record"]),
        (12, 10, "bad record", ["bad record", "ends at transaction 12", "low-water mark 10"]),
    ],
)
def test_refusal(end: int, floor: int, problem: str | None, words: list[str] | None) -> None:
    reason = refusal(_scan(end, problem), floor)
    if words is None:
        assert reason is None
        return
    assert reason is not None
    for word in [*words, "partition 4", "refusing to open", "move /d/4 aside"]:
        assert word in reason, reason


@pytest.mark.parametrize("fmt", [FORMAT_1, FORMAT_2], ids=["format 1", "format 2"])
def test_intact_record_after_finds_the_next_intact_record_past_a_zeroed_run(fmt) -> None:
    recs = make_records(250, 30, size=0)  # IDs cross a 256 boundary of the last ID byte
    size = {1: 40, 2: 48}[fmt.version]  # a record without data, in the segment's format
    buf = bytearray(b"".join(_disk(r, fmt.version) for r in recs))
    buf[0 : size * 12 + 7] = bytes(size * 12 + 7)  # records 250..262 destroyed, 263 intact
    assert intact_record_after(bytes(buf), 250, fmt) == (263, size * 13)
    assert intact_record_after(bytes(buf[: size * 13]), 250, fmt) is None  # only zeros after
    assert intact_record_after(bytes(4096), 250, fmt) is None
    # Looked for in the other format, the intact records are not found.
    other = FORMAT_2 if fmt is FORMAT_1 else FORMAT_1
    assert intact_record_after(bytes(buf), 250, other) is None


def _disk(rec: Record, version: int = 2) -> bytes:
    """A record in its documented on-disk layout (docs/on-disk.md), encoded here: segment
    format 1 without the commit time, 2 with it (after the length)."""
    q = rec.req_id
    fields = (rec.transaction_id, q.client_id, q.generation, q.partition_id, q.seq, rec.header)
    if version == 1:
        head = struct.pack(">qiiiiiiI", *fields, len(rec.data), zlib.crc32(rec.data))
    else:
        head = struct.pack(
            ">qiiiiiiqI", *fields, len(rec.data), rec.timestamp, zlib.crc32(rec.data)
        )
    return head + rec.data + struct.pack(">I", zlib.crc32(head))


# --- the local low-water mark -----------------------------------------------------------------


def test_a_torn_tail_at_or_below_the_floor_is_refused_and_above_it_cut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recs = build(tmp_path, 100)
    os.truncate(seg(tmp_path), seg(tmp_path).stat().st_size - 10)
    idx(tmp_path).write_bytes(b"")  # no index entry to show the last record was synced
    e = refused(tmp_path, "ends at transaction 98, below the local low-water mark 99", floor=99)
    assert (e.recovered_end, e.floor) == (98, 99)
    with caplog.at_level(logging.WARNING):
        log = open_log(tmp_path, floor=98)
    try:
        assert log.max_txid == 98
        assert list(log.read(0, 1000, 1 << 20).records()) == recs[:99]
    finally:
        log.close()
    assert f"cutting {OVERHEAD + DATA - 10} bytes of torn tail" in caplog.text


def test_a_missing_last_segment_below_the_floor_is_refused(tmp_path: Path) -> None:
    build(tmp_path, 100, segment_bytes=1024)
    firsts = sorted(int(p.stem) for p in tmp_path.glob("*.seg"))
    assert len(firsts) > 3
    seg(tmp_path, firsts[-1]).unlink()
    e = refused(
        tmp_path,
        f"ends at transaction {firsts[-1] - 1}, below the local low-water mark 99",
        floor=99,
    )
    assert f"{firsts[-1]:019d}.idx" in str(e)  # the index left behind is named
    log = open_log(tmp_path, floor=firsts[-1] - 1)  # a log that still reaches the floor opens
    log.close()


@pytest.mark.parametrize("floor", [-1, 5])
def test_a_missing_first_segment_is_refused_whatever_the_floor(tmp_path: Path, floor: int) -> None:
    build(tmp_path, 100, segment_bytes=1024)
    seg(tmp_path).unlink()
    idx(tmp_path).unlink()
    e = refused(tmp_path, "the segments before transaction", floor=floor)
    assert e.recovered_end == -1


def test_a_header_cut_short_with_records_in_the_index_is_not_an_interrupted_creation(
    tmp_path: Path,
) -> None:
    build(tmp_path, 30)
    os.truncate(seg(tmp_path), 70)
    refused(tmp_path, "index holds 30 entries")
    # Without the index entries nothing shows records were written: an interrupted
    # creation, recreated empty, unless the floor says this replica held transactions.
    idx(tmp_path).write_bytes(idx(tmp_path).read_bytes()[:HEADER_BYTES])
    refused(tmp_path, "ends at transaction -1, below the local low-water mark 0", floor=0)
    log = open_log(tmp_path)
    try:
        assert log.max_txid == -1 and seg(tmp_path).stat().st_size == HEADER_BYTES
    finally:
        log.close()


# --- torn tail or corruption ------------------------------------------------------------------


def _damage(kind: str, path: Path) -> None:
    k = 40
    if kind == "data byte":
        flip(path, offset(k) + HEAD_BYTES + 3)
    elif kind == "transaction id byte":
        flip(path, offset(k) + 7)
    elif kind == "length field":
        flip(path, offset(k) + 29)
    elif kind == "record checksum":
        flip(path, offset(k) + HEAD_BYTES + DATA + 1)
    elif kind == "zeroed run of several records":
        patch(path, offset(k) + 5, bytes(64 * 7))
    else:  # pragma: no cover
        raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind",
    [
        "data byte",
        "transaction id byte",
        "length field",
        "record checksum",
        "zeroed run of several records",
    ],
)
def test_damage_followed_by_an_intact_record_is_corruption_even_inside_the_window(
    tmp_path: Path, kind: str
) -> None:
    """The index is gone and the window covers the whole file: only the intact records after
    the damage show it is not a torn write, which damages nothing but the end of the file."""
    build(tmp_path, 100)
    idx(tmp_path).unlink()
    _damage(kind, seg(tmp_path))
    e = refused(tmp_path, r"\(transaction 40\).*after it is intact", max_torn_bytes=1 << 30)
    assert e.recovered_end == 39


def test_a_tail_of_zeros_is_still_a_torn_tail(tmp_path: Path) -> None:
    """A crash can leave the file longer than what reached the disk: zeros to the end."""
    recs = build(tmp_path, 100)
    idx(tmp_path).write_bytes(idx(tmp_path).read_bytes()[: HEADER_BYTES + 8 * 90])
    patch(seg(tmp_path), offset(90) + 11, bytes(offset(100) - offset(90) - 11))
    log = open_log(tmp_path, floor=89)
    try:
        assert log.max_txid == 89
        assert list(log.read(85, 10, 1 << 20).records()) == recs[85:90]
    finally:
        log.close()


def test_index_entries_past_the_end_of_the_data_are_synced_records_gone_missing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The file was cut at a record boundary after those records were synced: the index,
    written only after each fsync, shows it. One entry is the last record cut whole, let
    pass like a last record cut short."""
    build(tmp_path, 100)
    os.truncate(seg(tmp_path), offset(97))
    refused(tmp_path, r"\(transaction 97\).*3 entries past it")
    os.truncate(idx(tmp_path), HEADER_BYTES + 8 * 98)
    with caplog.at_level(logging.WARNING):
        log = open_log(tmp_path)
    try:
        assert log.max_txid == 96
    finally:
        log.close()
    assert "1 entries past the last record" in caplog.text
    assert idx(tmp_path).stat().st_size == HEADER_BYTES + 8 * 97


def test_truncate_cuts_the_index_before_the_data(tmp_path: Path, monkeypatch) -> None:
    """A crash between the two cuts must not leave index entries past the end of the data
    (they would read as synced records gone missing)."""
    build(tmp_path, 100)
    log = open_log(tmp_path)
    cuts: list[str] = []
    real = os.ftruncate

    def spy(fd: int, length: int) -> None:
        cuts.append(Path(os.readlink(f"/proc/self/fd/{fd}")).suffix)
        real(fd, length)

    monkeypatch.setattr(os, "ftruncate", spy)
    try:
        log.truncate(49)
    finally:
        monkeypatch.undo()
        log.close()
    assert cuts[:2] == [".idx", ".seg"]
    log = open_log(tmp_path, floor=49)
    try:
        assert log.max_txid == 49
    finally:
        log.close()


def test_a_refused_segment_is_left_for_inspection_and_corrupt_segment_still_names_it(
    tmp_path: Path,
) -> None:
    build(tmp_path, 100)
    flip(seg(tmp_path), offset(60) + HEAD_BYTES)
    with pytest.raises(
        CorruptSegment, match=f"partition {PARTITION} segment 0000000000000000000.seg"
    ):
        open_log(tmp_path)
    assert array("q", struct.unpack(">100q", idx(tmp_path).read_bytes()[HEADER_BYTES:])) == array(
        "q", [offset(t) for t in range(100)]
    )
