"""New nodes' directories written from restored records (waltz_storage/restore.py), then
opened by the storage engine as a node starting on them would. The whole ``waltz
restore``, with ZooKeeper and a server's recovery, is tests/backup/test_backup_restore.py."""

from __future__ import annotations

import os
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from waltz_client.wire.records import FORMAT_1, NO_TIMESTAMP, Record, RecordBatch, ReqId
from waltz_storage.control_file import PartitionInfo
from waltz_storage.log_start import LOG_START_FILE
from waltz_storage.restore import RestoredLogMismatch, RestoredPartition, write_restored_nodes
from waltz_storage.service import StorageNode

KEY = uuid.UUID("0e5704e0-0000-4000-8000-000000000001")
SESSION = 0


def records(first: int, last: int) -> list[Record]:
    return [
        Record(t, ReqId(1, 2, 3, t), t * 3, f"record {t}".encode()) for t in range(first, last + 1)
    ]


class OneShot:
    """Batches that can be read once only, as the restore reads its chunk files."""

    def __init__(self, batches: list[RecordBatch]) -> None:
        self._batches = batches
        self.reads = 0

    def __iter__(self) -> Iterator[RecordBatch]:
        self.reads += 1
        assert self.reads == 1, "the batches were read twice"
        yield from self._batches


def restored(
    partition_id: int, first: int, last: int, holders: list[Path], batch: int = 4
) -> RestoredPartition:
    recs = records(first, last)
    batches = [RecordBatch.from_records(recs[i : i + batch]) for i in range(0, len(recs), batch)]
    return RestoredPartition(partition_id, first, last, [str(h) for h in holders], OneShot(batches))


def test_each_holder_gets_the_records_its_log_start_and_the_marks_of_a_recovery(
    tmp_path: Path,
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    partitions = [
        restored(0, 0, 9, [a, b]),
        restored(1, 5, 7, [b]),  # retention had deleted 0..4: the log starts at 5
        restored(2, 0, -1, [a]),  # nothing was ever written
    ]
    seen: list[int] = []
    written = write_restored_nodes(
        [str(a), str(b)],
        KEY,
        3,
        iter(partitions),
        session=SESSION,
        segment_bytes=300,  # a few records a segment: the restored log spans several
        on_written=lambda partition: seen.append(partition.partition_id),
    )
    assert written == {str(a): [0, 2], str(b): [0, 1]}
    assert seen == [0, 1, 2]
    assert os.path.exists(b / "1" / LOG_START_FILE)
    assert not os.path.exists(a / "0" / LOG_START_FILE)
    assert len(os.listdir(a / "0")) > 2  # several segments

    for directory, held in ((a, {0, 2}), (b, {0, 1})):
        node = StorageNode.open(str(directory), KEY, 3, held)
        try:
            for p in held:
                partition = partitions[p]
                service = node.partitions[p]
                assert service.unavailable is None
                assert service.info == PartitionInfo(
                    sequence=service.info.sequence,
                    fence_session_id=SESSION,
                    session_id=SESSION,
                    low_water_mark=partition.high_water_mark,
                    local_low_water_mark=partition.high_water_mark,
                )
                assert service.log is not None
                assert service.log.first_txid == partition.first
                assert service.log.max_txid == partition.high_water_mark
                read = service.log.read(partition.first, 100, 1 << 20)
                assert list(read.records()) == records(partition.first, partition.high_water_mark)
            # A partition the node does not hold keeps the control file's initial struct.
            unheld = ({0, 1, 2} - held).pop()
            assert node.control.read_partition(unheld).session_id == -1
        finally:
            node.close()


def test_a_log_short_of_its_range_is_refused_before_its_marks_are_written(
    tmp_path: Path,
) -> None:
    a = tmp_path / "a"
    a.mkdir()
    short = restored(0, 0, 9, [a])
    short = RestoredPartition(0, 0, 10, short.holders, short.batches)  # one record missing
    with pytest.raises(
        RestoredLogMismatch, match=r"partition 0: .* holds 0\.\.9, expected 0\.\.10"
    ):
        write_restored_nodes([str(a)], KEY, 1, [short], session=SESSION)
    node = StorageNode.open(str(a), KEY, 1, {0})
    try:
        assert node.partitions[0].info.local_low_water_mark == -1
        assert node.partitions[0].info.session_id == -1
    finally:
        node.close()


def test_restored_records_go_to_format_2_segments_with_their_times_if_they_had_any(
    tmp_path: Path,
) -> None:
    """A backup of records with commit times (format 2) and one made before them (format
    1): both are written in this build's segment format, the times as the records had."""
    a = tmp_path / "a"
    a.mkdir()
    timed = [
        Record(r.transaction_id, r.req_id, r.header, r.data, 1_767_225_600_000 + r.header)
        for r in records(0, 9)
    ]
    batches = {
        0: [RecordBatch.from_records(timed[:5]), RecordBatch.from_records(timed[5:])],
        1: [RecordBatch.from_records(records(0, 9), FORMAT_1)],
    }
    partitions = [RestoredPartition(p, 0, 9, [str(a)], OneShot(batches[p])) for p in (0, 1)]
    write_restored_nodes([str(a)], KEY, 2, partitions, session=SESSION)
    for p in (0, 1):
        for seg in (a / str(p)).glob("*.seg"):
            assert struct.unpack_from(">i", seg.read_bytes()) == (2,)  # the format version
    node = StorageNode.open(str(a), KEY, 2, {0, 1})
    try:
        for p, expected in ((0, timed), (1, records(0, 9))):
            log = node.partitions[p].log
            assert log is not None
            read = log.read(0, 100, 1 << 20)
            assert list(read.records()) == expected
            assert read.timestamps() == [r.timestamp for r in expected]
        assert node.partitions[1].log.read(0, 1, 100).timestamps() == [NO_TIMESTAMP]
    finally:
        node.close()
