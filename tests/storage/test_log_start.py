"""Retention on a storage node: Set Log Start deletes whole segments below the log start,
reads below it fail, a replica skips ahead past its end, the log start survives a restart
and a crash in the middle of a deletion, and it moves only as far as the cluster metadata
records. Real files; small segments force many of them."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from test_service import make_records

from waltz_client.wire.records import RecordBatch
from waltz_client.wire.storage_messages import (
    AppendRequest,
    FailureResponse,
    LogInfoRequest,
    LogInfoResponse,
    RecordListRequest,
    RecordListResponse,
    SetLogStartRequest,
    SetLowWaterMarkRequest,
    StorageError,
    SuccessResponse,
    TruncateRequest,
)
from waltz_storage.errors import CorruptSegment, TransactionNotFound
from waltz_storage.log_start import LOG_START_FILE, leftover_segments, read_log_start
from waltz_storage.partition import PartitionLog
from waltz_storage.service import EngineSettings, StorageNode

KEY = uuid.UUID("c0ffee00-1111-4222-8333-444455556677")
SESSION = 5


def open_log(directory: Path) -> PartitionLog:
    return PartitionLog.open(str(directory), 0, KEY, segment_bytes=2048, max_torn_bytes=1 << 20)


def filled_log(directory: Path, count: int = 300) -> PartitionLog:
    log = open_log(directory)
    for first in range(0, count, 25):
        log.append(RecordBatch.from_records(make_records(first, 25, size=60)))
        log.sync()
    assert len(log.segments) >= count // 100 * 5
    return log


def segment_files(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(".seg"))


def test_leftover_segments_are_those_wholly_below_the_log_start():
    assert leftover_segments([0, 100, 200, 300], 200) == [0, 100]
    assert leftover_segments([0, 100, 200, 300], 199) == [0]
    assert leftover_segments([0, 100], 5000) == [0]  # the last one always stays
    assert leftover_segments([0], 5000) == []
    assert leftover_segments([], 7) == []


def test_advancing_the_log_start_deletes_whole_segments_below_it(tmp_path: Path):
    log = filled_log(tmp_path)
    firsts = [s.first_txid for s in log.segments]
    target = firsts[3] + 2  # inside the fourth segment: that one stays
    size_before = log.size_bytes
    freed = log.advance_log_start(target)
    assert [s.first_txid for s in log.segments] == firsts[3:]
    assert freed == size_before - log.size_bytes > 0
    assert len(segment_files(tmp_path)) == len(firsts) - 3
    assert log.first_txid == target
    with pytest.raises(TransactionNotFound, match=f"below the log start {target}"):
        log.read(target - 1, 10, 1 << 20)
    assert log.read(target, 1, 1 << 20).first_txid == target
    assert log.advance_log_start(target - 50) == 0  # never down
    assert log.first_txid == target
    log.close()

    reopened = open_log(tmp_path)
    assert (reopened.first_txid, reopened.max_txid) == (target, 299)
    assert list(reopened.read(target, 5, 1 << 20).records()) == make_records(target, 5, size=60)
    with pytest.raises(TransactionNotFound):
        reopened.read(target - 1, 1, 1 << 20)
    reopened.close()


def test_a_deletion_interrupted_by_a_crash_is_finished_at_the_next_open(tmp_path: Path):
    log = filled_log(tmp_path)
    firsts = [s.first_txid for s in log.segments]
    log.close()
    # The crash: the new log start is durable, no segment was deleted yet; and one
    # segment lost its .idx before its .seg (the order deletion uses).
    from waltz_storage.log_start import write_log_start

    write_log_start(str(tmp_path), firsts[4])
    os.unlink(tmp_path / f"{firsts[0]:019d}.idx")
    reopened = open_log(tmp_path)
    assert [s.first_txid for s in reopened.segments] == firsts[4:]
    assert segment_files(tmp_path) == [f"{f:019d}.seg" for f in firsts[4:]]
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".idx") and int(n[:19]) < firsts[4]]
    assert reopened.first_txid == firsts[4] and reopened.max_txid == 299
    reopened.close()


def test_a_replica_skips_ahead_past_its_end(tmp_path: Path):
    log = filled_log(tmp_path, count=100)
    log.advance_log_start(5000)
    assert (log.first_txid, log.max_txid) == (5000, 4999)
    assert segment_files(tmp_path) == [f"{5000:019d}.seg"]
    log.append(RecordBatch.from_records(make_records(5000, 3)))
    log.sync()
    log.close()
    reopened = open_log(tmp_path)
    assert (reopened.first_txid, reopened.max_txid) == (5000, 5002)
    assert list(reopened.read(5000, 3, 1 << 20).records()) == make_records(5000, 3)
    reopened.close()


def test_a_skip_ahead_interrupted_by_a_crash_is_finished_at_the_next_open(tmp_path: Path):
    filled_log(tmp_path, count=100).close()
    from waltz_storage.log_start import write_log_start

    write_log_start(str(tmp_path), 5000)  # the crash: before the new segment existed
    reopened = open_log(tmp_path)
    assert (reopened.first_txid, reopened.max_txid) == (5000, 4999)
    assert segment_files(tmp_path) == [f"{5000:019d}.seg"]
    reopened.append(RecordBatch.from_records(make_records(5000, 2)))
    reopened.sync()
    reopened.close()


def test_a_damaged_log_start_file_refuses_the_partition_and_says_so(tmp_path: Path):
    filled_log(tmp_path).close()
    (tmp_path / LOG_START_FILE).write_bytes(b"\x00" * 12)
    with pytest.raises(CorruptSegment, match="checksum mismatch"):
        read_log_start(str(tmp_path))
    with pytest.raises(CorruptSegment, match="log-start"):
        open_log(tmp_path)


# --- through the request handling of a node --------------------------------------------


def node_with_log(directory: Path, count: int = 300) -> StorageNode:
    settings = EngineSettings(segment_bytes=2048)
    node = StorageNode.open(str(directory), KEY, 1, {0}, settings)
    svc = node.partitions[0]
    requests = [
        AppendRequest(SESSION, i, 0, RecordBatch.from_records(make_records(first, 25, size=60)))
        for i, first in enumerate(range(0, count, 25))
    ]
    assert all(isinstance(r, SuccessResponse) for r in svc.process(requests))
    return node


def test_log_info_and_set_log_start_requests(tmp_path: Path):
    node = node_with_log(tmp_path)
    svc = node.partitions[0]
    (info,) = svc.process([LogInfoRequest(SESSION, 1, 0)])
    assert isinstance(info, LogInfoResponse)
    assert (info.log_start, info.max_transaction_id) == (0, 299)
    assert sum(s.records for s in info.segments) == 300
    assert info.segments[0].first_txid == 0 and info.segments[-1].last_txid == 299
    assert all(s.size_bytes > 128 and s.modified_ms > 0 for s in info.segments)

    start = info.segments[2].first_txid
    (ok, read_below, read_at, after) = svc.process(
        [
            SetLogStartRequest(SESSION, 2, 0, start),
            RecordListRequest(SESSION, 3, 0, start - 1, 5),
            RecordListRequest(SESSION, 4, 0, start, 5),
            LogInfoRequest(SESSION, 5, 0),
        ]
    )
    assert isinstance(ok, SuccessResponse)
    assert isinstance(read_below, FailureResponse)
    assert read_below.error == StorageError.TRANSACTION_NOT_FOUND
    assert f"below the log start {start}" in read_below.message
    assert isinstance(read_at, RecordListResponse) and read_at.records.first_txid == start
    assert isinstance(after, LogInfoResponse)
    assert after.log_start == start and after.segments[0].first_txid == start
    deleted = node.metrics.retention_deleted_bytes.labels("0")._value.get()
    assert deleted == sum(s.size_bytes for s in info.segments[:2])
    node.close()


def test_the_log_start_moves_only_as_far_as_the_metadata_records(tmp_path: Path):
    node = node_with_log(tmp_path)
    recorded = {0: 100}
    node.verify_sessions_with(lambda p: SESSION, lambda p: recorded[p])
    svc = node.partitions[0]
    (refused,) = svc.process([SetLogStartRequest(SESSION, 1, 0, 250)])
    assert isinstance(refused, FailureResponse)
    assert refused.error == StorageError.TRUNCATE_REFUSED
    assert "beyond the one the cluster metadata records (100)" in refused.message
    assert svc.log is not None and svc.log.first_txid == 0
    (ok,) = svc.process([SetLogStartRequest(SESSION, 2, 0, 100)])
    assert isinstance(ok, SuccessResponse) and svc.log.first_txid == 100
    node.close()


def test_a_session_that_appended_may_not_skip_a_replica_ahead(tmp_path: Path):
    node = node_with_log(tmp_path, count=50)
    svc = node.partitions[0]
    (refused,) = svc.process([SetLogStartRequest(SESSION, 1, 0, 1000)])
    assert isinstance(refused, FailureResponse)
    assert refused.error == StorageError.TRUNCATE_REFUSED
    # A newer session (recovery, before it appends) may: it then copies from 1000.
    (ok, mark, cut) = svc.process(
        [
            SetLogStartRequest(SESSION + 1, 2, 0, 1000),
            SetLowWaterMarkRequest(SESSION + 1, 3, 0, 999),
            TruncateRequest(SESSION + 1, 4, 0, 999),
        ]
    )
    assert isinstance(ok, SuccessResponse), ok
    assert isinstance(mark, SuccessResponse) and isinstance(cut, SuccessResponse)
    assert svc.log is not None and (svc.log.first_txid, svc.log.max_txid) == (1000, 999)
    node.close()
