"""PartitionLog: appends with the contiguity check, segment rolls, reads and truncation
across segments, and reopening (recovery) in between. Small segments force many rolls."""

from __future__ import annotations

import itertools
import random
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_client.wire.records import Record, RecordBatch, RecordHeader, ReqId
from waltz_storage.errors import NonContiguousAppend, TransactionNotFound, TruncateRefused
from waltz_storage.inspect import verify_segment
from waltz_storage.partition import PartitionLog

KEY = uuid.UUID("a1b2c3d4-0000-4000-8000-0000000000aa")
PARTITION = 1
HEADER_BYTES = 128
OVERHEAD = 48  # bytes a record takes on disk besides its data (segment format 2)
WIRE_OVERHEAD = 44  # bytes a record takes on the wire besides its data (record format 2)
TIME = 1_767_225_600_000  # records' commit times count up from it
EVERYTHING = (10**9, 1 << 40)


# --- helpers --------------------------------------------------------------------------------


def make_records(first: int, n: int, *, seed: int | str = 0, max_size: int = 100) -> list[Record]:
    out = []
    for t in range(first, first + n):
        rng = random.Random(f"{seed}:{t}")
        req = ReqId(rng.randrange(1 << 20), rng.randrange(5), PARTITION, rng.randrange(1 << 30))
        header, data = rng.randrange(-(2**31), 2**31), rng.randbytes(rng.randrange(max_size + 1))
        out.append(Record(t, req, header, data, TIME + t))
    return out


def wire(recs: list[Record]) -> bytes:
    return RecordBatch.from_records(recs).buf


def open_log(directory: Path, segment_bytes: int = 4096) -> PartitionLog:
    return PartitionLog.open(
        str(directory), PARTITION, KEY, segment_bytes=segment_bytes, max_torn_bytes=1 << 20
    )


def append_synced(log: PartitionLog, recs: list[Record], batches: list[int] | None = None) -> None:
    i = 0
    sizes = iter(batches or [])
    while i < len(recs):
        n = next(sizes, 50)
        log.append(RecordBatch.from_records(recs[i : i + n]))
        log.sync()
        i += n


def segment_files(directory: Path) -> list[int]:
    """First transaction IDs of the .seg files present, sorted."""
    firsts = sorted(int(p.stem) for p in directory.glob("*.seg"))
    assert firsts == sorted(int(p.stem) for p in directory.glob("*.idx"))
    return firsts


def expected_read(recs: list[Record], txid: int, max_records: int, max_bytes: int) -> list[Record]:
    """The records a read must return: a maximal prefix from ``txid`` within both bounds,
    but at least one record when there is one."""
    if txid >= len(recs) or max_records <= 0:
        return []
    out, size = [], 0
    for rec in recs[txid : txid + max_records]:
        size += WIRE_OVERHEAD + len(rec.data)
        if out and size > max_bytes:
            break
        out.append(rec)
    return out


def check_segments(log: PartitionLog, directory: Path) -> None:
    """Contiguous segments, rolled only once they passed segment_bytes, all verifying."""
    segs = log.segments
    assert segs[0].first_txid == 0
    for a, b in itertools.pairwise(segs):
        assert b.first_txid == a.last_txid + 1
        assert a.count >= 1
        # Rolled after passing the size, and not before: its last record started below it.
        assert a.size >= log.segment_bytes
        assert a.offsets[-1] < log.segment_bytes or a.count == 1
    assert segment_files(directory) == [s.first_txid for s in segs]
    files = [directory / f"{s.first_txid:019d}.seg" for s in segs]
    # Sealed segments are cut to their records; the active one has zeros written ahead.
    assert [f.stat().st_size for f in files[:-1]] == [s.size for s in segs[:-1]]
    ahead = files[-1].read_bytes()[segs[-1].size :]
    assert ahead == bytes(len(ahead))
    assert log.size_bytes == sum(s.size for s in segs)
    for s in segs:
        report = verify_segment(str(directory / f"{s.first_txid:019d}.seg"))
        assert report.ok, report.problems
        assert report.records == report.index_entries == s.count


# --- appends and reads across rolls ---------------------------------------------------------


def test_a_new_partition_starts_empty_with_segment_zero(tmp_path: Path) -> None:
    directory = tmp_path / "new" / "1"
    log = open_log(directory)
    try:
        assert (log.first_txid, log.max_txid) == (0, -1)
        assert segment_files(directory) == [0]
        assert len(log.read(0, 10, 1000)) == 0
        with pytest.raises(TransactionNotFound):
            log.read(-1, 10, 1000)
        log.append(RecordBatch(b"", []))  # an empty batch is a no-op
        assert log.max_txid == -1
    finally:
        log.close()


def test_append_and_read_across_many_segment_rolls(tmp_path: Path) -> None:
    recs = make_records(0, 1500)
    rng = random.Random(5)
    log = open_log(tmp_path, segment_bytes=4096)
    try:
        append_synced(log, recs, [rng.randrange(1, 97) for _ in range(200)])
        assert len(log.segments) > 25
        check_segments(log, tmp_path)
        assert log.read(0, *EVERYTHING).buf == wire(recs)
        # Reads starting anywhere, spanning several segments.
        for seg in log.segments:
            for start in (seg.first_txid, seg.last_txid):
                for count in (1, 2, 37, 400):
                    got = log.read(start, count, 1 << 30)
                    assert got.buf == wire(recs[start : start + count])
                    assert list(got.records()) == recs[start : start + count]
        assert log.read_headers(100, 3, 1 << 30) == [
            RecordHeader(r.transaction_id, r.req_id, r.header, r.timestamp) for r in recs[100:103]
        ]
    finally:
        log.close()
    log = open_log(tmp_path, segment_bytes=4096)
    try:
        assert log.read(0, *EVERYTHING).buf == wire(recs)
        check_segments(log, tmp_path)
        more = make_records(1500, 300, seed="more")
        append_synced(log, more, [300])  # one batch spanning several new segments
        assert log.read(0, *EVERYTHING).buf == wire(recs + more)
        check_segments(log, tmp_path)
    finally:
        log.close()


def test_a_batch_larger_than_a_segment_rolls_in_the_middle(tmp_path: Path) -> None:
    recs = make_records(0, 200, max_size=60)
    log = open_log(tmp_path, segment_bytes=1000)
    try:
        log.append(RecordBatch.from_records(recs))
        log.sync()
        assert len(log.segments) > 8
        check_segments(log, tmp_path)
        assert log.read(0, *EVERYTHING).buf == wire(recs)
    finally:
        log.close()


def test_a_record_larger_than_a_segment_gets_a_segment_of_its_own(tmp_path: Path) -> None:
    big = Record(1, ReqId(1, 1, 1, 1), 0, bytes(3000))
    recs = [Record(0, ReqId(0, 0, 0, 0), 0, b"a"), big, Record(2, ReqId(2, 2, 2, 2), 0, b"b")]
    log = open_log(tmp_path, segment_bytes=1000)
    try:
        for rec in recs:
            log.append(RecordBatch.from_records([rec]))
            log.sync()
        assert [(s.first_txid, s.count) for s in log.segments] == [(0, 2), (2, 1)]
        assert log.read(0, *EVERYTHING).buf == wire(recs)
    finally:
        log.close()


@pytest.fixture(scope="module")
def spanning_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PartitionLog, list]]:
    directory = tmp_path_factory.mktemp("spanning")
    recs = make_records(0, 400, max_size=120)
    log = open_log(directory, segment_bytes=2048)
    append_synced(log, recs, [random.Random(9).randrange(1, 40) for _ in range(100)])
    assert len(log.segments) > 10
    yield log, recs
    log.close()


@settings(max_examples=300, deadline=None)
@given(
    txid=st.integers(-3, 405),
    max_records=st.integers(-1, 450),
    max_bytes=st.one_of(st.integers(1, 400), st.integers(400, 60_000)),
)
def test_reads_are_bounded_by_max_records_and_max_bytes(
    spanning_log: tuple[PartitionLog, list], txid: int, max_records: int, max_bytes: int
) -> None:
    log, recs = spanning_log
    if txid < 0 and max_records > 0:
        with pytest.raises(TransactionNotFound, match=f"transaction {txid} is not stored"):
            log.read(txid, max_records, max_bytes)
        return
    expected = expected_read(recs, txid, max_records, max_bytes)
    got = log.read(txid, max_records, max_bytes)
    assert got.buf == wire(expected)
    assert [span[0] for span in got.spans] == [r.transaction_id for r in expected]
    assert log.read_headers(txid, max_records, max_bytes) == [
        RecordHeader(r.transaction_id, r.req_id, r.header, r.timestamp) for r in expected
    ]


# --- the contiguity check -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad_at", "bad_txid", "message"),
    [
        (0, 41, "expected transaction 40, got 41$"),  # a gap
        (0, 39, "expected transaction 40, got 39$"),  # a duplicate
        (0, 0, "expected transaction 40, got 0$"),
        (0, -1, "expected transaction 40, got -1$"),
        (3, 44, r"expected transaction 43, got 44 \(record 3 of the batch\)"),
        (3, 42, r"expected transaction 43, got 42 \(record 3 of the batch\)"),
        (29, 70, r"expected transaction 69, got 70 \(record 29 of the batch\)"),
    ],
)
def test_a_non_contiguous_append_is_refused_and_writes_nothing(
    tmp_path: Path, bad_at: int, bad_txid: int, message: str
) -> None:
    recs = make_records(0, 40)
    log = open_log(tmp_path, segment_bytes=1500)
    try:
        append_synced(log, recs)
        sizes = {p.name: p.stat().st_size for p in tmp_path.iterdir()}
        batch = make_records(40, 30, seed="next")  # would roll a segment or two
        batch[bad_at] = Record(bad_txid, batch[bad_at].req_id, 0, b"x")
        with pytest.raises(NonContiguousAppend, match=message):
            log.append(RecordBatch.from_records(batch))
        log.sync()
        assert log.max_txid == 39
        assert {p.name: p.stat().st_size for p in tmp_path.iterdir()} == sizes
        assert log.read(0, *EVERYTHING).buf == wire(recs)
        # The right next batch is still accepted.
        good = make_records(40, 30, seed="next")
        append_synced(log, good)
        assert log.read(0, *EVERYTHING).buf == wire(recs + good)
    finally:
        log.close()


# --- truncation -----------------------------------------------------------------------------


def _truncation_points(firsts: list[int], max_txid: int) -> dict[str, int]:
    second, third = firsts[1], firsts[2]
    return {
        "middle of the first segment": second // 2,
        "middle of a middle segment": (second + third) // 2,
        "last record of a segment": third - 1,
        "second-to-last record of a segment": third - 2,
        "first record of a segment": third,
        "middle of the last segment": (firsts[-1] + max_txid) // 2,
        "last record of the second-to-last segment": firsts[-1] - 1,
        "everything (first txid - 1)": -1,
        "only the first record": 0,
        "one before the max": max_txid - 1,
    }


TRUNCATION_CASES = [
    "middle of the first segment",
    "middle of a middle segment",
    "last record of a segment",
    "second-to-last record of a segment",
    "first record of a segment",
    "middle of the last segment",
    "last record of the second-to-last segment",
    "everything (first txid - 1)",
    "only the first record",
    "one before the max",
]


@pytest.mark.parametrize("case", TRUNCATION_CASES)
def test_truncate_across_segments_then_reopen_and_append(tmp_path: Path, case: str) -> None:
    recs = make_records(0, 300, max_size=80)
    log = open_log(tmp_path, segment_bytes=2000)
    try:
        append_synced(log, recs, [7] * 100)
        firsts = [s.first_txid for s in log.segments]
        assert len(firsts) > 6
        txid = _truncation_points(firsts, log.max_txid)[case]

        log.truncate(txid)
        assert log.max_txid == txid
        assert log.read(0, *EVERYTHING).buf == wire(recs[: txid + 1])
        # Segments wholly after txid + 1 are gone; the one holding txid + 1 (if any) is cut.
        assert segment_files(tmp_path) == [f for f in firsts if f <= txid + 1]
        assert log.segments[-1].last_txid == txid
        if txid + 1 in firsts:
            assert log.segments[-1].count == 0  # cut exactly at a segment boundary
        assert len(log.read(txid + 1, 10, 1 << 20)) == 0
        # Appending continues right after, before and after a reopen.
        first_new = make_records(txid + 1, 20, seed="new")
        append_synced(log, first_new, [20])
    finally:
        log.close()
    log = open_log(tmp_path, segment_bytes=2000)
    try:
        expected = recs[: txid + 1] + first_new
        assert log.max_txid == len(expected) - 1
        assert log.read(0, *EVERYTHING).buf == wire(expected)
        second_new = make_records(len(expected), 60, seed="newer")
        append_synced(log, second_new, [60])
        expected += second_new
        assert log.read(0, *EVERYTHING).buf == wire(expected)
        check_segments(log, tmp_path)
    finally:
        log.close()
    log = open_log(tmp_path, segment_bytes=2000)
    try:
        assert log.read(0, *EVERYTHING).buf == wire(expected)
    finally:
        log.close()


def test_truncate_beyond_the_end_is_a_no_op_and_below_the_start_is_refused(tmp_path: Path) -> None:
    recs = make_records(0, 100)
    log = open_log(tmp_path, segment_bytes=2000)
    try:
        append_synced(log, recs)
        files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
        for txid in (99, 100, 10**12):
            log.truncate(txid)
            assert log.max_txid == 99
        with pytest.raises(TruncateRefused, match="starts at transaction 0"):
            log.truncate(-2)
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files
    finally:
        log.close()


def test_truncate_an_empty_log(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    try:
        log.truncate(-1)
        log.truncate(5)
        assert log.max_txid == -1
        with pytest.raises(TruncateRefused):
            log.truncate(-2)
    finally:
        log.close()


@pytest.mark.parametrize("keep", [0, 499, 999, 1000, 1001, 1500, 2001])
def test_truncate_around_index_checkpoints(tmp_path: Path, keep: int) -> None:
    recs = make_records(0, 2500, max_size=4)
    log = open_log(tmp_path, segment_bytes=1 << 20)
    try:
        append_synced(log, recs, [1250, 1250])
        log.truncate(keep - 1)
        assert log.max_txid == keep - 1
        more = make_records(keep, 1100, seed="more", max_size=4)  # passes another checkpoint
        append_synced(log, more, [600, 500])
    finally:
        log.close()
    idx = (tmp_path / f"{0:019d}.idx").read_bytes()
    entries = struct.unpack(f">{(len(idx) - HEADER_BYTES) // 8}q", idx[HEADER_BYTES:])
    assert len(entries) == keep + 1100
    log = open_log(tmp_path, segment_bytes=1 << 20)
    try:
        assert list(log.segments[0].offsets) == list(entries)
        assert log.read(0, *EVERYTHING).buf == wire(recs[:keep] + more)
        check_segments(log, tmp_path)
    finally:
        log.close()


# --- a model-based property -----------------------------------------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 40), st.integers(0, 150)),
        st.tuples(st.just("truncate"), st.floats(0, 1)),
        st.tuples(st.just("reopen")),
        st.tuples(st.just("read"), st.floats(0, 1), st.integers(1, 60), st.integers(1, 4000)),
    ),
    max_size=18,
)


@settings(max_examples=40, deadline=None)
@given(ops=OPS, segment_bytes=st.sampled_from([700, 2500, 1 << 20]))
def test_random_appends_truncates_reopens_and_reads_match_a_model(
    tmp_path_factory: pytest.TempPathFactory, ops, segment_bytes: int
) -> None:
    directory = tmp_path_factory.mktemp("model")
    model: list[Record] = []
    log = open_log(directory, segment_bytes)
    try:
        for k, op in enumerate(ops):
            if op[0] == "append":
                _, n, max_size = op
                new = make_records(len(model), n, seed=k, max_size=max_size)
                log.append(RecordBatch.from_records(new))
                log.sync()
                model += new
            elif op[0] == "truncate":
                txid = int(op[1] * (len(model) + 1)) - 1
                log.truncate(txid)
                del model[txid + 1 :]
            elif op[0] == "reopen":
                log.close()
                log = open_log(directory, segment_bytes)
            else:
                _, frac, max_records, max_bytes = op
                start = int(frac * len(model))
                got = log.read(start, max_records, max_bytes)
                assert got.buf == wire(expected_read(model, start, max_records, max_bytes))
            assert log.max_txid == len(model) - 1
            assert log.size_bytes == sum(s.size for s in log.segments)  # kept, not summed
        assert log.read(0, *EVERYTHING).buf == wire(model)
        log.close()
        log = open_log(directory, segment_bytes)
        assert log.read(0, *EVERYTHING).buf == wire(model)
        check_segments(log, directory)
    finally:
        log.close()
