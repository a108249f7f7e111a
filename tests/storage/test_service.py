"""Request handling of a storage node (PartitionService.process, StorageNode.open/check_open):
session fencing, low-water marks, group commit, reads, and what a failed fsync does."""

from __future__ import annotations

import errno
import os
import random
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from waltz_client.wire.records import FORMAT_2, Record, RecordBatch, RecordHeader, ReqId
from waltz_client.wire.storage_messages import (
    AppendRequest,
    FailureResponse,
    LastSessionInfoRequest,
    LastSessionInfoResponse,
    MaxTransactionIdRequest,
    MaxTransactionIdResponse,
    OpenRequest,
    RecordHeaderListRequest,
    RecordHeaderListResponse,
    RecordHeaderRequest,
    RecordHeaderResponse,
    RecordListRequest,
    RecordListResponse,
    RecordRequest,
    RecordResponse,
    SetLowWaterMarkRequest,
    StorageError,
    SuccessResponse,
    TruncateRequest,
)
from waltz_storage.control_file import ControlFile
from waltz_storage.inspect import segment_paths, verify_segment
from waltz_storage.segment import HEADER_BYTES, scan_records
from waltz_storage.service import EngineSettings, PartitionService, StorageNode

KEY = uuid.UUID("c0ffee00-1111-4222-8333-444455556666")
OTHER_KEY = uuid.UUID("deadbeef-1111-4222-8333-444455556666")
TIME = 1_767_225_600_000  # records' commit times count up from it


# --- helpers --------------------------------------------------------------------------------


def make_records(first: int, n: int, *, seed: int | str = 0, size: int = 20) -> list[Record]:
    out = []
    for t in range(first, first + n):
        rng = random.Random(f"{seed}:{t}")
        data = rng.randbytes(size)
        out.append(Record(t, ReqId(rng.randrange(1000), 1, 0, t), t % 7, data, TIME + t))
    return out


def append(session: int, seq: int, partition: int, first: int, n: int, **kw) -> AppendRequest:
    return AppendRequest(
        session, seq, partition, RecordBatch.from_records(make_records(first, n, **kw))
    )


def wire(recs: list[Record]) -> bytes:
    return RecordBatch.from_records(recs).buf


def headers(recs: list[Record]) -> tuple[RecordHeader, ...]:
    return tuple(RecordHeader(r.transaction_id, r.req_id, r.header, r.timestamp) for r in recs)


def open_node(
    directory: Path,
    partitions: frozenset[int] | set[int] = frozenset({0, 1}),
    *,
    num: int = 2,
    segment_bytes: int = 4096,
    max_response_bytes: int = 1 << 20,
) -> StorageNode:
    settings = EngineSettings(segment_bytes=segment_bytes, max_response_bytes=max_response_bytes)
    return StorageNode.open(str(directory), KEY, num, set(partitions), settings)


def fsync_metric(node: StorageNode, partition: int) -> float:
    value = node.metrics.registry.get_sample_value(
        "waltz_storage_fsyncs_total", {"partition": str(partition)}
    )
    return value or 0.0


def error_metric(node: StorageNode, error: StorageError) -> float:
    value = node.metrics.registry.get_sample_value(
        "waltz_storage_errors_total", {"error": error.name}
    )
    return value or 0.0


def count_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Count os.fsync and os.fdatasync calls (by the name of the file synced) from now on."""
    calls: list[str] = []

    def counting(real: Callable[[int], None]) -> Callable[[int], None]:
        def sync(fd: int) -> None:
            calls.append(os.readlink(f"/proc/self/fd/{fd}"))
            real(fd)

        return sync

    monkeypatch.setattr(os, "fsync", counting(os.fsync))
    monkeypatch.setattr(os, "fdatasync", counting(os.fdatasync))
    return calls


def fail_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make every os.fsync and os.fdatasync fail with EIO from now on (until
    monkeypatch.undo)."""
    calls: list[int] = []

    def failing(fd: int) -> None:
        calls.append(fd)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    monkeypatch.setattr(os, "fdatasync", failing)
    return calls


def assert_failure(response, error: StorageError, *fragments: str) -> None:
    assert isinstance(response, FailureResponse), response
    assert response.error == error, response
    for fragment in fragments:
        assert fragment in response.message


def read_back(svc: PartitionService, session: int, first: int, n: int) -> RecordListResponse:
    (response,) = svc.process([RecordListRequest(session, 999, svc.partition_id, first, n)])
    assert isinstance(response, RecordListResponse), response
    return response


def control_info(directory: Path, partition: int):
    ctl = ControlFile.open(str(directory))
    try:
        return ctl.read_partition(partition)
    finally:
        ctl.close()


# --- Open -----------------------------------------------------------------------------------


def test_check_open_compares_cluster_key_and_partition_count(tmp_path: Path) -> None:
    node = open_node(tmp_path)
    try:
        assert node.check_open(OpenRequest(-1, 1, -1, KEY, 2)) == SuccessResponse(-1, 1, -1)

        response = node.check_open(OpenRequest(-1, 2, -1, OTHER_KEY, 2))
        assert_failure(response, StorageError.CLUSTER_KEY_MISMATCH, "does not match")
        assert "deadbeef" not in response.message and "c0ffee00" not in response.message
        assert (response.session_id, response.seq, response.partition_id) == (-1, 2, -1)

        response = node.check_open(OpenRequest(-1, 3, -1, KEY, 3))
        assert_failure(response, StorageError.PARTITION_COUNT_MISMATCH, "3 partitions", "2 by")
        assert error_metric(node, StorageError.CLUSTER_KEY_MISMATCH) == 1
        assert error_metric(node, StorageError.PARTITION_COUNT_MISMATCH) == 1
        # An Open is not a partition request.
        (response,) = node.partitions[0].process([OpenRequest(-1, 4, 0, KEY, 2)])
        assert_failure(response, StorageError.MALFORMED_REQUEST)
    finally:
        node.close()


# --- session fencing ------------------------------------------------------------------------


def test_an_older_session_is_fenced_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = open_node(tmp_path)
    try:
        svc = node.partitions[0]
        assert svc.process([append(5, 1, 0, 0, 10), SetLowWaterMarkRequest(5, 2, 0, 8)]) == [
            SuccessResponse(5, 1, 0),
            SuccessResponse(5, 2, 0),
        ]
        files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
        syncs = count_fsyncs(monkeypatch)
        requests = [
            append(4, 3, 0, 10, 5),
            TruncateRequest(4, 4, 0, 8),
            SetLowWaterMarkRequest(4, 5, 0, 1),
            MaxTransactionIdRequest(4, 6, 0),
            LastSessionInfoRequest(4, 7, 0),
            RecordRequest(4, 8, 0, 0),
            RecordListRequest(4, 9, 0, 0, 10),
            RecordHeaderRequest(-1, 10, 0, 0),
        ]
        responses = svc.process(requests)
        for request, response in zip(requests, responses, strict=True):
            assert_failure(
                response, StorageError.SESSION_FENCED, "older than the current session 5"
            )
            assert (response.session_id, response.seq, response.partition_id) == (
                request.session_id,
                request.seq,
                0,
            )
        assert syncs == []
        assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == files
        assert svc.process(
            [MaxTransactionIdRequest(5, 11, 0), LastSessionInfoRequest(5, 12, 0)]
        ) == [
            MaxTransactionIdResponse(5, 11, 0, 9),
            LastSessionInfoResponse(5, 12, 0, 5, 8, 8),
        ]
        assert error_metric(node, StorageError.SESSION_FENCED) == len(requests)
    finally:
        node.close()


def test_a_newer_session_is_persisted_before_its_request_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = open_node(tmp_path)
    try:
        svc = node.partitions[0]
        seen_on_disk: list[int] = []
        real_append = svc.log.append

        def spying_append(batch):
            seen_on_disk.append(control_info(tmp_path, 0).fence_session_id)
            return real_append(batch)

        monkeypatch.setattr(svc.log, "append", spying_append)
        assert svc.process([append(9, 1, 0, 0, 3)]) == [SuccessResponse(9, 1, 0)]
        assert seen_on_disk == [9]
        assert svc.info.fence_session_id == 9
        # A newer session whose request fails is still adopted.
        (response,) = svc.process([RecordRequest(12, 2, 0, 50)])
        assert_failure(response, StorageError.TRANSACTION_NOT_FOUND)
        assert control_info(tmp_path, 0).fence_session_id == 12
        # The other partition's session is separate.
        assert control_info(tmp_path, 1).fence_session_id == -1
        assert svc.snapshot()["session_id"] == 12
    finally:
        node.close()

    node = open_node(tmp_path)
    try:
        svc = node.partitions[0]
        assert svc.info.fence_session_id == 12
        (response,) = svc.process([append(9, 3, 0, 3, 1)])
        assert_failure(response, StorageError.SESSION_FENCED)
        assert svc.process([MaxTransactionIdRequest(12, 4, 0)]) == [
            MaxTransactionIdResponse(12, 4, 0, 2)
        ]
        assert node.partitions[1].process([append(1, 5, 1, 0, 1)]) == [SuccessResponse(1, 5, 1)]
    finally:
        node.close()


# --- low-water marks and truncation ---------------------------------------------------------


def test_last_session_info_reports_the_session_that_set_the_low_water_mark(
    tmp_path: Path,
) -> None:
    node = open_node(tmp_path)
    try:
        svc = node.partitions[0]
        assert svc.process([LastSessionInfoRequest(1, 1, 0)]) == [
            LastSessionInfoResponse(1, 1, 0, -1, -1, -1)
        ]
        assert svc.process(
            [
                append(3, 2, 0, 0, 10),
                SetLowWaterMarkRequest(3, 3, 0, 5),
                LastSessionInfoRequest(3, 4, 0),
            ]
        ) == [
            SuccessResponse(3, 2, 0),
            SuccessResponse(3, 3, 0),
            LastSessionInfoResponse(3, 4, 0, 3, 5, 5),
        ]
        # Session 4 is adopted by its first request, but session 3 set the marks.
        assert svc.process([LastSessionInfoRequest(4, 5, 0)]) == [
            LastSessionInfoResponse(4, 5, 0, 3, 5, 5)
        ]
        # A mark above this node's max: the local low-water mark is the max transaction ID.
        assert svc.process(
            [SetLowWaterMarkRequest(4, 6, 0, 20), LastSessionInfoRequest(4, 7, 0)]
        ) == [
            SuccessResponse(4, 6, 0),
            LastSessionInfoResponse(4, 7, 0, 4, 20, 9),
        ]
        # Appends in the same call are counted: they commit before the mark is set.
        assert svc.process(
            [
                append(4, 8, 0, 10, 5),
                SetLowWaterMarkRequest(4, 9, 0, 30),
                LastSessionInfoRequest(4, 10, 0),
            ]
        ) == [
            SuccessResponse(4, 8, 0),
            SuccessResponse(4, 9, 0),
            LastSessionInfoResponse(4, 10, 0, 4, 30, 14),
        ]
        snap = svc.snapshot()
        assert (snap["low_water_mark"], snap["local_low_water_mark"], snap["session_id"]) == (
            30,
            14,
            4,
        )
    finally:
        node.close()

    info = control_info(tmp_path, 0)
    assert (
        info.fence_session_id,
        info.session_id,
        info.low_water_mark,
        info.local_low_water_mark,
    ) == (
        4,
        4,
        30,
        14,
    )
    node = open_node(tmp_path)
    try:
        assert node.partitions[0].process([LastSessionInfoRequest(7, 1, 0)]) == [
            LastSessionInfoResponse(7, 1, 0, 4, 30, 14)
        ]
        assert node.partitions[1].process([LastSessionInfoRequest(7, 2, 1)]) == [
            LastSessionInfoResponse(7, 2, 1, -1, -1, -1)
        ]
    finally:
        node.close()


def test_truncate_below_the_local_low_water_mark_is_refused(tmp_path: Path) -> None:
    node = open_node(tmp_path, segment_bytes=600)
    try:
        svc = node.partitions[0]
        svc.process([append(2, 1, 0, 0, 60), SetLowWaterMarkRequest(2, 2, 0, 25)])
        assert len(svc.log.segments) > 4
        (response,) = svc.process([TruncateRequest(3, 3, 0, 24)])
        assert_failure(response, StorageError.TRUNCATE_REFUSED, "local low-water mark 25")
        assert svc.log.max_txid == 59
        (response,) = svc.process([TruncateRequest(3, 4, 0, -1)])
        assert_failure(response, StorageError.TRUNCATE_REFUSED)
        # (A recovery truncates in its new session 3, before appending.)
        # At the mark (across segments) is allowed; beyond the max is a no-op success.
        assert svc.process(
            [
                TruncateRequest(3, 5, 0, 100),
                TruncateRequest(3, 6, 0, 25),
                MaxTransactionIdRequest(3, 7, 0),
            ]
        ) == [
            SuccessResponse(3, 5, 0),
            SuccessResponse(3, 6, 0),
            MaxTransactionIdResponse(3, 7, 0, 25),
        ]
        assert read_back(svc, 3, 0, 100).records.buf == wire(make_records(0, 26))
        assert svc.process([append(3, 8, 0, 26, 3, seed="new")]) == [SuccessResponse(3, 8, 0)]
    finally:
        node.close()
    node = open_node(tmp_path, segment_bytes=600)
    try:
        expected = make_records(0, 26) + make_records(26, 3, seed="new")
        assert read_back(node.partitions[0], 3, 0, 100).records.buf == wire(expected)
    finally:
        node.close()


def test_truncate_with_no_low_water_mark_can_empty_the_log(tmp_path: Path) -> None:
    node = open_node(tmp_path, segment_bytes=600)
    try:
        svc = node.partitions[1]
        assert svc.process([append(1, 1, 1, 0, 30)]) == [SuccessResponse(1, 1, 1)]
        assert svc.process([TruncateRequest(2, 2, 1, -1), MaxTransactionIdRequest(2, 3, 1)]) == [
            SuccessResponse(2, 2, 1),
            MaxTransactionIdResponse(2, 3, 1, -1),
        ]
        assert sorted(p.name for p in (tmp_path / "1").iterdir()) == [
            "0000000000000000000.idx",
            "0000000000000000000.seg",
        ]
    finally:
        node.close()


def test_a_session_may_not_truncate_after_it_appended(tmp_path: Path) -> None:
    """Whoever holds the current session (a buggy owner, or a stranger replaying its ID)
    cannot cut what that session appended: a store session truncates only before it
    appends (recovery), and never continues on a replica after losing it."""
    node = open_node(tmp_path)
    try:
        svc = node.partitions[0]
        assert svc.process([append(4, 1, 0, 0, 10)]) == [SuccessResponse(4, 1, 0)]
        (response,) = svc.process([TruncateRequest(4, 2, 0, 4)])
        assert_failure(response, StorageError.TRUNCATE_REFUSED, "session 4 may not truncate")
        # A no-op truncate (at or beyond the end) drops nothing and is allowed.
        assert svc.process([TruncateRequest(4, 3, 0, 9)]) == [SuccessResponse(4, 3, 0)]
        assert svc.log.max_txid == 9
    finally:
        node.close()
    # After a restart the session current at open is sealed too.
    node = open_node(tmp_path)
    try:
        svc = node.partitions[0]
        (response,) = svc.process([TruncateRequest(4, 4, 0, 4)])
        assert_failure(response, StorageError.TRUNCATE_REFUSED)
        assert read_back(svc, 4, 0, 100).records.buf == wire(make_records(0, 10))
        # The next session (a recovery) may truncate its uncommitted tail.
        assert svc.process([TruncateRequest(5, 5, 0, 4)]) == [SuccessResponse(5, 5, 0)]
        assert svc.log.max_txid == 4
    finally:
        node.close()


def test_the_local_low_water_mark_never_moves_down(tmp_path: Path) -> None:
    node = open_node(tmp_path)
    try:
        svc = node.partitions[0]
        svc.process([append(1, 1, 0, 0, 30), SetLowWaterMarkRequest(1, 2, 0, 20)])
        (response,) = svc.process([SetLowWaterMarkRequest(2, 3, 0, 5)])
        assert_failure(
            response, StorageError.TRUNCATE_REFUSED, "lower the local low-water mark from 20 to 5"
        )
        assert control_info(tmp_path, 0).local_low_water_mark == 20
        # With the mark still at 20, a truncation below it stays refused.
        (response,) = svc.process([TruncateRequest(2, 4, 0, 5)])
        assert_failure(response, StorageError.TRUNCATE_REFUSED, "local low-water mark 20")
        assert svc.process([SetLowWaterMarkRequest(2, 5, 0, 25)]) == [SuccessResponse(2, 5, 0)]
        assert svc.log.max_txid == 29
    finally:
        node.close()


def test_a_newer_session_is_adopted_only_once_the_metadata_records_it(tmp_path: Path) -> None:
    recorded = {0: 3}
    node = open_node(tmp_path)
    node.verify_sessions_with(lambda p: recorded[p])
    try:
        svc = node.partitions[0]
        assert svc.process([append(3, 1, 0, 0, 5)]) == [SuccessResponse(3, 1, 0)]
        # A stranger's jump to the largest session ID fences nobody.
        huge = 2**63 - 1
        (response,) = svc.process([MaxTransactionIdRequest(huge, 2, 0)])
        assert_failure(
            response, StorageError.SESSION_UNKNOWN, f"session {huge} is newer", "records (3)"
        )
        assert svc.info.fence_session_id == 3
        assert control_info(tmp_path, 0).fence_session_id == 3
        assert svc.process([append(3, 3, 0, 5, 1)]) == [SuccessResponse(3, 3, 0)]
        # Once the owner records session 4, it is adopted (and fences session 3).
        recorded[0] = 4
        assert svc.process([MaxTransactionIdRequest(4, 4, 0)]) == [
            MaxTransactionIdResponse(4, 4, 0, 5)
        ]
        (response,) = svc.process([append(3, 5, 0, 6, 1)])
        assert_failure(response, StorageError.SESSION_FENCED)

        def unreachable(_p: int) -> int:
            raise TimeoutError("ZooKeeper did not answer")

        # When the metadata cannot be read, refuse (and say why) rather than guess.
        node.verify_sessions_with(unreachable)
        (response,) = svc.process([MaxTransactionIdRequest(5, 6, 0)])
        assert_failure(response, StorageError.SESSION_UNKNOWN, "ZooKeeper did not answer", "retry")
        assert svc.info.fence_session_id == 4
        # The current session needs no check.
        assert svc.process([MaxTransactionIdRequest(4, 7, 0)]) == [
            MaxTransactionIdResponse(4, 7, 0, 5)
        ]
        # A partition opened later is checked too.
        node.verify_sessions_with(lambda p: recorded.get(p, -1))
        (response,) = node.partitions[1].process([MaxTransactionIdRequest(1, 8, 1)])
        assert_failure(response, StorageError.SESSION_UNKNOWN)
    finally:
        node.close()


# --- group commit ---------------------------------------------------------------------------


def test_consecutive_appends_share_one_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = open_node(tmp_path, segment_bytes=1 << 20)
    try:
        svc = node.partitions[0]
        svc.process([MaxTransactionIdRequest(6, 0, 0)])  # adopt session 6 first
        syncs = count_fsyncs(monkeypatch)
        responses = svc.process(
            [append(6, 1, 0, 0, 4), append(6, 2, 0, 4, 1), append(6, 3, 0, 5, 20)]
        )
        assert responses == [
            SuccessResponse(6, 1, 0),
            SuccessResponse(6, 2, 0),
            SuccessResponse(6, 3, 0),
        ]
        assert syncs == [str(tmp_path / "0" / "0000000000000000000.seg")]
        assert fsync_metric(node, 0) == 1
        records = node.metrics.registry.get_sample_value(
            "waltz_storage_appended_records_total", {"partition": "0"}
        )
        data_bytes = node.metrics.registry.get_sample_value(
            "waltz_storage_appended_bytes_total", {"partition": "0"}
        )
        assert (records, data_bytes) == (25, 25 * 20)
        assert read_back(svc, 6, 0, 100).records.buf == wire(make_records(0, 25))
    finally:
        node.close()


def test_a_non_contiguous_append_fails_alone_within_a_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = open_node(tmp_path)
    try:
        svc = node.partitions[0]
        svc.process([MaxTransactionIdRequest(1, 0, 0)])
        syncs = count_fsyncs(monkeypatch)
        responses = svc.process(
            [
                append(1, 1, 0, 0, 5),
                append(1, 2, 0, 10, 3),
                append(1, 3, 0, 5, 5),
                append(1, 4, 0, 9, 1),
            ]
        )
        assert responses[0] == SuccessResponse(1, 1, 0)
        assert_failure(responses[1], StorageError.NON_CONTIGUOUS, "expected transaction 5, got 10")
        assert responses[2] == SuccessResponse(1, 3, 0)
        assert_failure(responses[3], StorageError.NON_CONTIGUOUS, "expected transaction 10, got 9")
        assert len(syncs) == 1
        assert read_back(svc, 1, 0, 100).records.buf == wire(make_records(0, 10))
        assert error_metric(node, StorageError.NON_CONTIGUOUS) == 2
    finally:
        node.close()


def test_requests_after_appends_in_the_same_call_see_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = open_node(tmp_path, segment_bytes=1 << 20)
    try:
        svc = node.partitions[0]
        svc.process([MaxTransactionIdRequest(1, 0, 0)])
        syncs = count_fsyncs(monkeypatch)
        recs = make_records(0, 30)
        responses = svc.process(
            [
                append(1, 1, 0, 0, 10),
                RecordRequest(1, 2, 0, 9),
                append(1, 3, 0, 10, 10),
                append(1, 4, 0, 20, 10),
                MaxTransactionIdRequest(1, 5, 0),
                RecordHeaderRequest(1, 6, 0, 29),
                RecordListRequest(1, 7, 0, 5, 20),
                RecordHeaderListRequest(1, 8, 0, 8, 15),
            ]
        )
        assert responses == [
            SuccessResponse(1, 1, 0),
            RecordResponse(1, 2, 0, recs[9]),
            SuccessResponse(1, 3, 0),
            SuccessResponse(1, 4, 0),
            MaxTransactionIdResponse(1, 5, 0, 29),
            RecordHeaderResponse(1, 6, 0, headers(recs)[29]),
            RecordListResponse(1, 7, 0, RecordBatch.from_records(recs[5:25])),
            RecordHeaderListResponse(1, 8, 0, headers(recs[8:23])),
        ]
        # Two groups: the record read ended the first.
        assert syncs == [str(tmp_path / "0" / "0000000000000000000.seg")] * 2
        assert fsync_metric(node, 0) == 2
    finally:
        node.close()


# --- reads ----------------------------------------------------------------------------------


def test_reads_across_segments_and_their_bounds(tmp_path: Path) -> None:
    node = open_node(tmp_path, segment_bytes=1000, max_response_bytes=64 * 10)
    try:
        svc = node.partitions[1]
        recs = make_records(0, 100)
        svc.process([append(1, k, 1, 10 * k, 10) for k in range(10)])
        assert len(svc.log.segments) > 5
        for first in (0, 13, 17, 50, 95):
            (response,) = svc.process([RecordListRequest(1, 1, 1, first, 7)])
            assert response == RecordListResponse(
                1, 1, 1, RecordBatch.from_records(recs[first : first + 7])
            )
            (response,) = svc.process([RecordRequest(1, 2, 1, first)])
            assert response == RecordResponse(1, 2, 1, recs[first])
            (response,) = svc.process([RecordHeaderRequest(1, 3, 1, first)])
            assert response == RecordHeaderResponse(1, 3, 1, headers(recs)[first])
        # max_response_bytes (640 = ten 64-byte wire records) bounds a list.
        (response,) = svc.process([RecordListRequest(1, 4, 1, 3, 1000)])
        assert list(response.records.records()) == recs[3:13]
        (response,) = svc.process([RecordHeaderListRequest(1, 5, 1, 3, 1000)])
        assert response.headers == headers(recs[3:13])
        (response,) = svc.process([RecordListRequest(1, 6, 1, 97, 1000)])
        assert list(response.records.records()) == recs[97:]
        # Past the end: an empty list, not an error.
        assert svc.process(
            [RecordListRequest(1, 7, 1, 100, 5), RecordHeaderListRequest(1, 8, 1, 100, 5)]
        ) == [
            RecordListResponse(1, 7, 1, RecordBatch(b"", [])),
            RecordHeaderListResponse(1, 8, 1, ()),
        ]
        assert svc.process([RecordListRequest(1, 9, 1, 0, 0)]) == [
            RecordListResponse(1, 9, 1, RecordBatch(b"", []))
        ]
    finally:
        node.close()


@pytest.mark.parametrize(
    "request_",
    [
        RecordRequest(1, 1, 0, 10),
        RecordRequest(1, 1, 0, 10**15),
        RecordRequest(1, 1, 0, -1),
        RecordHeaderRequest(1, 1, 0, 10),
        RecordHeaderRequest(1, 1, 0, -1),
        RecordListRequest(1, 1, 0, -1, 5),
        RecordHeaderListRequest(1, 1, 0, -3, 5),
    ],
    ids=repr,
)
def test_reads_of_a_missing_transaction(tmp_path: Path, request_) -> None:
    node = open_node(tmp_path)
    try:
        svc = node.partitions[0]
        (response,) = svc.process([request_])  # an empty partition
        assert_failure(response, StorageError.TRANSACTION_NOT_FOUND)
        svc.process([append(1, 0, 0, 0, 10)])
        (response,) = svc.process([request_])
        assert_failure(response, StorageError.TRANSACTION_NOT_FOUND, "transaction")
        assert (response.session_id, response.seq, response.partition_id) == (1, 1, 0)
    finally:
        node.close()


def test_a_damaged_record_is_an_io_error_then_the_partition_is_unavailable(
    tmp_path: Path,
) -> None:
    """Damage that appeared after the open (which checked every record): the read that finds
    it fails with IO_ERROR, never bad data, and the partition, which can no longer serve
    what it acknowledged, refuses everything from then on (not ready; a restart would not
    help, so it stays live)."""
    node = open_node(tmp_path)
    try:
        svc = node.partitions[0]
        svc.process([append(1, 0, 0, 0, 10)])
        seg = tmp_path / "0" / "0000000000000000000.seg"
        offset = svc.log.segments[0].offsets[4] + 44 + 3  # a data byte of transaction 4
        with open(seg, "r+b") as f:
            f.seek(offset)
            b = f.read(1)
            f.seek(offset)
            f.write(bytes([b[0] ^ 1]))
        assert svc.process([RecordRequest(1, 1, 0, 3)]) == [
            RecordResponse(1, 1, 0, make_records(0, 10)[3])
        ]
        responses = svc.process(
            [
                RecordListRequest(1, 2, 0, 0, 10),
                RecordRequest(1, 3, 0, 5),
                MaxTransactionIdRequest(1, 4, 0),
            ]
        )
        assert_failure(
            responses[0], StorageError.IO_ERROR, "data checksum mismatch in transaction 4"
        )
        for response in responses[1:]:
            assert_failure(response, StorageError.PARTITION_UNAVAILABLE, "transaction 4")
        assert svc.unavailable is not None and "move" in svc.unavailable
        assert svc.snapshot()["available"] == 0
        assert not svc.failed_after_open
        # The other partition is not affected.
        assert node.partitions[1].process([append(1, 5, 1, 0, 2)]) == [SuccessResponse(1, 5, 1)]
    finally:
        node.close()


# --- partitions that cannot serve -----------------------------------------------------------


def test_a_partition_with_a_corrupt_segment_is_unavailable_and_others_serve(tmp_path: Path) -> None:
    node = open_node(tmp_path, segment_bytes=1 << 20)
    try:
        for p in (0, 1):
            node.partitions[p].process([append(1, 0, p, 0, 50)])
        offset = node.partitions[1].log.segments[0].offsets[10] + 40
    finally:
        node.close()
    seg = tmp_path / "1" / "0000000000000000000.seg"
    with open(seg, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x80]))
    settings = EngineSettings(segment_bytes=1 << 20, max_torn_bytes=500)
    node = StorageNode.open(str(tmp_path), KEY, 2, {0, 1}, settings)
    try:
        bad = node.partitions[1]
        assert bad.unavailable is not None and "transaction 10" in bad.unavailable
        assert bad.log is None
        assert not bad.failed_after_open  # a restart would not help: only unready
        assert bad.snapshot()["available"] == 0
        for request in (
            MaxTransactionIdRequest(1, 1, 1),
            append(1, 2, 1, 50, 1),
            RecordRequest(1, 3, 1, 0),
        ):
            (response,) = bad.process([request])
            assert_failure(
                response, StorageError.PARTITION_UNAVAILABLE, "partition 1", "transaction 10"
            )
        good = node.partitions[0]
        assert good.process([append(1, 4, 0, 50, 1), MaxTransactionIdRequest(1, 5, 0)]) == [
            SuccessResponse(1, 4, 0),
            MaxTransactionIdResponse(1, 5, 0, 50),
        ]
    finally:
        node.close()
    assert seg.stat().st_size > offset  # the damaged segment was left for inspection


def test_a_failed_group_commit_fsync_fails_the_appends_and_the_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = open_node(tmp_path)
    try:
        svc = node.partitions[0]
        assert svc.process([append(1, 1, 0, 0, 5)]) == [SuccessResponse(1, 1, 0)]
        fsyncs_before = fsync_metric(node, 0)

        attempts = fail_fsyncs(monkeypatch)
        responses = svc.process(
            [append(1, 2, 0, 5, 5), append(1, 3, 0, 10, 5), MaxTransactionIdRequest(1, 4, 0)]
        )
        assert len(attempts) == 1  # one group, one (failed) fsync
        assert_failure(responses[0], StorageError.IO_ERROR, "fsync failed")
        assert_failure(responses[1], StorageError.IO_ERROR, "fsync failed")
        assert_failure(responses[2], StorageError.PARTITION_UNAVAILABLE, "fsync failed")
        assert svc.unavailable is not None and "fsync failed" in svc.unavailable
        assert svc.failed_after_open  # what /healthz reports: a restart recovers
        assert fsync_metric(node, 0) == fsyncs_before
        monkeypatch.undo()

        # Even with a healthy disk again, nothing is served until a restart.
        for request in (
            append(1, 5, 0, 15, 1),
            RecordRequest(1, 6, 0, 0),
            LastSessionInfoRequest(1, 7, 0),
            SetLowWaterMarkRequest(1, 8, 0, 3),
            TruncateRequest(1, 9, 0, 2),
            MaxTransactionIdRequest(2, 10, 0),
        ):
            (response,) = svc.process([request])
            assert_failure(response, StorageError.PARTITION_UNAVAILABLE)
        assert svc.snapshot()["available"] == 0
        assert control_info(tmp_path, 0).fence_session_id == 1  # session 2 was not adopted
        # The other partition is not affected.
        assert node.partitions[1].process([append(1, 11, 1, 0, 2)]) == [SuccessResponse(1, 11, 1)]
    finally:
        node.close()

    node = open_node(tmp_path)
    try:
        svc = node.partitions[0]
        assert svc.unavailable is None
        assert read_back(svc, 1, 0, 5).records.buf == wire(make_records(0, 5))
    finally:
        node.close()


def test_a_failed_fsync_during_a_segment_roll_fails_the_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fsync that seals a full segment is as binding as the group-commit fsync.

    errors.PartitionUnavailable: "failed an fsync; it serves nothing until restart".
    """
    node = open_node(tmp_path, segment_bytes=1000)
    try:
        svc = node.partitions[0]
        assert svc.process([append(1, 1, 0, 0, 10)]) == [SuccessResponse(1, 1, 0)]  # 728 bytes
        fail_fsyncs(monkeypatch)
        (response,) = svc.process([append(1, 2, 0, 10, 20)])  # passes 1000 bytes: a roll
        monkeypatch.undo()
        assert isinstance(response, FailureResponse) and response.error == StorageError.IO_ERROR
        assert svc.unavailable is not None, (
            "a failed fsync while sealing a segment left the partition serving; "
            f"max transaction id is now {svc.log.max_txid} after a failed append"
        )
        (response,) = svc.process([MaxTransactionIdRequest(1, 3, 0)])
        assert_failure(response, StorageError.PARTITION_UNAVAILABLE)
    finally:
        node.close()


def test_a_failed_fsync_during_truncate_fails_the_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the truncating fsync fails, the file is cut but the in-memory offsets are not."""
    node = open_node(tmp_path)
    try:
        svc = node.partitions[0]
        assert svc.process([append(1, 1, 0, 0, 20)]) == [SuccessResponse(1, 1, 0)]
        fail_fsyncs(monkeypatch)
        (response,) = svc.process([TruncateRequest(2, 2, 0, 9)])
        monkeypatch.undo()
        assert_failure(response, StorageError.IO_ERROR)
        assert svc.unavailable is not None, (
            "a failed fsync during truncate left the partition serving; it still reports "
            f"max transaction id {svc.log.max_txid} while the file holds only 0..9"
        )
        (response,) = svc.process([append(2, 3, 0, 20, 1)])
        assert_failure(response, StorageError.PARTITION_UNAVAILABLE)
    finally:
        node.close()


def test_acknowledged_appends_survive_a_failed_truncate_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the node answers after a failed truncate, every later Success must be durable."""
    node = open_node(tmp_path)
    acknowledged: list[Record] = []
    try:
        svc = node.partitions[0]
        assert svc.process([append(1, 1, 0, 0, 20)]) == [SuccessResponse(1, 1, 0)]
        fail_fsyncs(monkeypatch)
        svc.process([TruncateRequest(1, 2, 0, 9)])
        monkeypatch.undo()
        # The server asks where the log ends and appends after it, as a recovery would.
        (response,) = svc.process([MaxTransactionIdRequest(1, 3, 0)])
        if isinstance(response, MaxTransactionIdResponse):
            after = make_records(response.transaction_id + 1, 3, seed="after")
            (appended,) = svc.process([AppendRequest(1, 4, 0, RecordBatch.from_records(after))])
            if appended == SuccessResponse(1, 4, 0):
                acknowledged = after
    finally:
        node.close()

    node = open_node(tmp_path)
    try:
        svc = node.partitions[0]
        assert svc.unavailable is None, (
            "after a failed truncate fsync and an acknowledged append, the partition no longer "
            f"opens: {svc.unavailable}"
        )
        kept = {r.transaction_id: r for r in read_back(svc, 1, 0, 1000).records.records()}
        lost = [r.transaction_id for r in acknowledged if kept.get(r.transaction_id) != r]
        assert lost == [], (
            f"transactions {lost} were acknowledged after a failed truncate fsync and are gone "
            f"after a reopen (the log now ends at {svc.log.max_txid})"
        )
    finally:
        node.close()
    for path in segment_paths(str(tmp_path / "0")):
        assert verify_segment(path).ok


def test_snapshot_reports_the_partition_state(tmp_path: Path) -> None:
    node = open_node(tmp_path)
    try:
        svc = node.partitions[0]
        svc.process([append(3, 1, 0, 0, 7), SetLowWaterMarkRequest(3, 2, 0, 4)])
        snap = svc.snapshot()
        assert snap["max_transaction_id"] == 6
        assert (snap["low_water_mark"], snap["local_low_water_mark"], snap["session_id"]) == (
            4,
            4,
            3,
        )
        assert snap["available"] == 1
        # The records' bytes, not the zeros written ahead of them.
        path = tmp_path / "0" / "0000000000000000000.seg"
        size, data = snap["size_bytes"], path.read_bytes()
        assert data[size:] == bytes(len(data) - size) != b""
        fd = os.open(path, os.O_RDONLY)
        try:
            offsets, end, problem = scan_records(fd, HEADER_BYTES, size, 0, FORMAT_2)
        finally:
            os.close(fd)
        assert (len(offsets), end, problem) == (7, size, None)
    finally:
        node.close()


# --- the control file's fsync, once a group ---------------------------------------------


def test_a_group_fencing_many_partitions_syncs_the_control_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server recovering many partitions at once fences and cleans them all on each
    node: one fsync of the control file a group, not one a partition, and every answer
    only after it. Each partition's state is durable (read back from the file)."""
    partitions = set(range(8))
    node = open_node(tmp_path, partitions, num=8)
    try:
        calls = count_fsyncs(monkeypatch)
        group = [
            (
                node.partitions[p],
                [LastSessionInfoRequest(3, 1, p), MaxTransactionIdRequest(3, 2, p)],
            )
            for p in sorted(partitions)
        ]
        answers = node.process_group(group)
        assert [a[0] for a in answers] == [
            LastSessionInfoResponse(3, 1, p, -1, -1, -1) for p in sorted(partitions)
        ]
        assert [os.path.basename(c) for c in calls] == ["waltz-storage.ctl"]  # for 8 fences
        calls.clear()
        group = [
            (node.partitions[p], [SetLowWaterMarkRequest(3, 3, p, -1)]) for p in sorted(partitions)
        ]
        assert node.process_group(group) == [[SuccessResponse(3, 3, p)] for p in sorted(partitions)]
        assert [os.path.basename(c) for c in calls] == ["waltz-storage.ctl"]
        # One partition alone syncs at once, as before.
        calls.clear()
        node.partitions[0].process([LastSessionInfoRequest(4, 4, 0)])
        assert [os.path.basename(c) for c in calls] == ["waltz-storage.ctl"]
        monkeypatch.undo()
        assert not any(svc.defer_control_sync for svc in node.partitions.values())
    finally:
        node.close()
    for p in sorted(partitions):
        info = control_info(tmp_path, p)
        assert info.fence_session_id == (4 if p == 0 else 3) and info.session_id == 3


def test_a_group_that_fails_part_way_releases_every_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug that raises in the middle of a group (the node answers INTERNAL and serves
    on) leaves no partition locked and none of the group's settings behind."""
    node = open_node(tmp_path, {0, 1, 2}, num=3)
    try:
        broken = node.partitions[1]

        def write(_requests: list) -> None:
            raise RuntimeError("a bug")

        monkeypatch.setattr(broken, "write", write)
        group = [(node.partitions[p], [LastSessionInfoRequest(2, 1, p)]) for p in (0, 1, 2)]
        with pytest.raises(RuntimeError, match="a bug"):
            node.process_group(group)
        monkeypatch.undo()
        for p in (0, 1, 2):
            svc = node.partitions[p]
            assert not svc.defer_control_sync and svc.recorded_ahead is None
            assert svc.lock._lock.acquire(blocking=False), f"partition {p} is still locked"
            svc.lock._lock.release()
        # And the partitions serve on.
        assert node.process_group(group) == [
            [LastSessionInfoResponse(2, 1, p, -1, -1, -1)] for p in (0, 1, 2)
        ]
    finally:
        node.close()


def test_a_failed_control_file_fsync_fails_every_answer_of_its_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = open_node(tmp_path)
    try:
        fail_fsyncs(monkeypatch)
        group = [(node.partitions[p], [LastSessionInfoRequest(2, 1, p)]) for p in (0, 1)]
        answers = node.process_group(group)
        monkeypatch.undo()
        for (answer,) in answers:
            assert_failure(answer, StorageError.IO_ERROR, "fsync of the control file failed")
        for p in (0, 1):
            svc = node.partitions[p]
            assert svc.failed_after_open and not svc.defer_control_sync
            (response,) = svc.process([MaxTransactionIdRequest(2, 2, p)])
            assert_failure(response, StorageError.PARTITION_UNAVAILABLE)
    finally:
        node.close()


def test_a_group_fencing_many_partitions_reads_their_sessions_in_one_round_trip(
    tmp_path: Path,
) -> None:
    """A server that takes many partitions fences them all on each node: their recorded
    sessions are read together before the group runs (one round trip), not one partition
    after another. What that read found only accepts: a session above it is still asked
    about on its own, and refused."""
    partitions = set(range(8))
    recorded = dict.fromkeys(partitions, 3)
    recorded[7] = 2  # partition 7's owner has not recorded session 3
    single: list[int] = []
    batches: list[list[int]] = []

    def read_one(p: int) -> int:
        single.append(p)
        return recorded[p]

    def read_many(ps: list[int]) -> dict[int, int]:
        batches.append(sorted(ps))
        return {p: recorded[p] for p in ps}

    node = open_node(tmp_path, partitions, num=8)
    node.verify_sessions_with(read_one, read_many=read_many)
    try:
        group = [
            (
                node.partitions[p],
                [MaxTransactionIdRequest(3, 1, p), MaxTransactionIdRequest(3, 2, p)],
            )
            for p in sorted(partitions)
        ]
        answers = node.process_group(group)
        assert batches == [sorted(partitions)]
        assert single == [7]  # only the session the batch did not find recorded
        for p in range(7):
            assert answers[p] == [MaxTransactionIdResponse(3, q, p, -1) for q in (1, 2)]
            assert node.partitions[p].info.fence_session_id == 3
        assert_failure(answers[7][0], StorageError.SESSION_UNKNOWN, "records (2)")
        assert node.partitions[7].info.fence_session_id == -1
        assert all(svc.recorded_ahead is None for svc in node.partitions.values())

        # A batch read that fails leaves each request to ask on its own.
        def broken(_ps: list[int]) -> dict[int, int]:
            raise TimeoutError("ZooKeeper did not answer")

        single.clear()
        recorded.update(dict.fromkeys(partitions, 4))
        node.verify_sessions_with(read_one, read_many=broken)
        group = [(node.partitions[p], [MaxTransactionIdRequest(4, 3, p)]) for p in (0, 1, 2)]
        answers = node.process_group(group)
        assert answers == [[MaxTransactionIdResponse(4, 3, p, -1)] for p in (0, 1, 2)]
        assert single == [0, 1, 2]
    finally:
        node.close()
