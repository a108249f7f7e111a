"""Finding a transaction by its commit time on a storage node (``PartitionLog.find_time``):
the first transaction committed at or after a time, through the segments' last times and
a binary search in one segment, equal to a scan of the log in every case: ties, times
before and after everything, a start in format-1 segments (no times), retention, a
reopen (sealed segments' offsets read from their index files) and a truncation."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_client.wire.records import FORMAT_1, NO_TIMESTAMP, Record, RecordBatch, ReqId
from waltz_storage.partition import PartitionLog
from waltz_storage.segment import Segment

KEY = uuid.UUID("0f0f0f0f-1111-4222-8333-000000000002")
PARTITION = 3
BASE = 1_800_000_000_000


def records(first: int, times: list[int]) -> list[Record]:
    return [
        Record(first + i, ReqId(7, 1, PARTITION, first + i), i, b"x" * (i % 50), t)
        for i, t in enumerate(times)
    ]


def expected(times: list[int], log_start: int, time_ms: int) -> int:
    """The scan the search must agree with."""
    for txid in range(log_start, len(times)):
        if times[txid] >= time_ms:
            return txid
    return len(times)


def open_log(directory: Path, segment_bytes: int) -> PartitionLog:
    return PartitionLog.open(str(directory), PARTITION, KEY, segment_bytes=segment_bytes)


def write_format_1(directory: Path, count: int) -> None:
    """``count`` records without commit times, as a node before them wrote them."""
    directory.mkdir(parents=True, exist_ok=True)
    seg = Segment.create(str(directory), PARTITION, KEY, 0, fmt=FORMAT_1)
    try:
        if count:
            batch = RecordBatch.from_records(records(0, [NO_TIMESTAMP] * count), FORMAT_1)
            seg.write_batch(batch, 0, len(batch))
        seg.seal()
    finally:
        seg.close()


def test_the_search_agrees_with_a_scan_across_segments_and_ties(tmp_path: Path) -> None:
    rng = random.Random(1)
    times = []
    t = BASE
    for _ in range(700):
        t += rng.choice((0, 0, 1, 5, 1000))  # ties, as a clock standing still gives
        times.append(t)
    log = open_log(tmp_path / "p", segment_bytes=4096)
    for i in range(0, 700, 37):
        log.append(RecordBatch.from_records(records(i, times[i : i + 37])))
    log.sync()
    assert len(log.segments) > 5
    probes = [BASE - 1, BASE, times[-1], times[-1] + 1, *rng.sample(times, 50)]
    probes += [x + 1 for x in probes] + [x - 1 for x in probes]
    for probe in probes:
        assert log.find_time(probe) == expected(times, 0, probe), probe
    log.close()
    reopened = open_log(tmp_path / "p", segment_bytes=4096)  # sealed: offsets in .idx files
    for probe in probes:
        assert reopened.find_time(probe) == expected(times, 0, probe), probe
    reopened.truncate(400)
    for probe in probes:
        assert reopened.find_time(probe) == expected(times[:401], 0, probe), probe
    reopened.close()


def test_records_without_times_count_as_earlier_than_any(tmp_path: Path) -> None:
    write_format_1(tmp_path / "p", 30)
    log = open_log(tmp_path / "p", segment_bytes=1 << 20)
    assert log.find_time(0) == 30  # nothing committed with a time yet
    log.append(RecordBatch.from_records(records(30, [BASE + 10 * i for i in range(20)])))
    log.sync()
    times = [NO_TIMESTAMP] * 30 + [BASE + 10 * i for i in range(20)]
    for probe in (0, BASE - 5, BASE, BASE + 5, BASE + 190, BASE + 191):
        assert log.find_time(probe) == expected(times, 0, probe)
    log.close()


def test_nothing_below_the_log_start_is_found(tmp_path: Path) -> None:
    times = [BASE + i for i in range(300)]
    log = open_log(tmp_path / "p", segment_bytes=2048)
    log.append(RecordBatch.from_records(records(0, times)))
    log.sync()
    log.advance_log_start(150)  # inside a segment: the segment stays, its head is not served
    for probe in (BASE - 100, BASE, BASE + 100, BASE + 150, BASE + 299, BASE + 300):
        assert log.find_time(probe) == expected(times, 150, probe)
    log.close()


def test_an_empty_log_answers_its_next_transaction(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", segment_bytes=1 << 20)
    assert log.find_time(BASE) == 0
    log.close()


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(st.integers(0, 3), min_size=1, max_size=120),
    old=st.integers(0, 20),
    start=st.integers(0, 200),
    probes=st.lists(st.integers(-2, 130), min_size=1, max_size=12),
)
def test_any_log_agrees_with_the_scan(tmp_path_factory, steps, old, start, probes) -> None:
    directory = tmp_path_factory.mktemp("p")
    write_format_1(directory, old)
    log = open_log(directory, segment_bytes=1024)
    new = []
    t = 0
    for step in steps:
        t += step
        new.append(BASE + t)
    log.append(RecordBatch.from_records(records(old, new)))
    log.sync()
    times = [NO_TIMESTAMP] * old + new
    log_start = min(start, len(times))
    log.advance_log_start(log_start)
    for p in probes:
        probe = BASE + p
        assert log.find_time(probe) == expected(times, log.log_start, probe), (probe, times)
    log.close()
