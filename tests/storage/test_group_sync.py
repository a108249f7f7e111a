"""Group commit across partitions: one syncfs when a group's appends touch several.

``StorageNode.process_group`` runs the requests of any partitions on the node's I/O
thread. When more than one partition appended, one syncfs makes them all durable
instead of an fsync each; one partition alone keeps its fsync. A failed syncfs fails
every append it should have covered, and every later one.
"""

from __future__ import annotations

import ctypes
import errno
from pathlib import Path

import pytest
from test_service import (
    KEY,
    append,
    count_fsyncs,
    fsync_metric,
    make_records,
    open_node,
    read_back,
    wire,
)

from waltz_client.wire.storage_messages import (
    FailureResponse,
    MaxTransactionIdRequest,
    StorageError,
    SuccessResponse,
)
from waltz_storage.group_sync import GroupSync, kernel_reports_syncfs_errors, load_syncfs
from waltz_storage.service import EngineSettings, StorageNode

SESSION = 6
needs_syncfs = pytest.mark.skipif(
    load_syncfs() is None, reason="needs Linux 5.8+ (syncfs that reports errors)"
)


@pytest.mark.parametrize(
    ("release", "reports"),
    [
        ("6.18.44-fc-v669", True),
        ("5.8.0-63-generic", True),
        ("5.10.0", True),
        ("5.7.19", False),
        ("4.18.0-553.el8_10.x86_64", False),
        ("3.10.0", False),
        ("", False),
        ("garbage", False),
        ("6", False),
    ],
)
def test_only_kernels_from_5_8_report_syncfs_errors(release: str, reports: bool) -> None:
    assert kernel_reports_syncfs_errors(release) is reports


def adopt(node: StorageNode, partitions: list[int]) -> None:
    for p in partitions:
        node.partitions[p].process([MaxTransactionIdRequest(SESSION, 0, p)])


class CountingSyncFs:
    """libc's syncfs, counted; or failing with EIO once ``fail`` is set."""

    def __init__(self) -> None:
        self.real = load_syncfs()
        self.calls = 0
        self.fail = False

    def __call__(self, fd: int) -> int:
        self.calls += 1
        if self.fail:
            ctypes.set_errno(errno.EIO)
            return -1
        assert self.real is not None
        return self.real(fd)


def counted_node(tmp_path: Path, partitions: list[int]) -> tuple[StorageNode, CountingSyncFs]:
    """A node whose syncfs calls are counted, each partition in session SESSION."""
    node = open_node(tmp_path, set(partitions), num=len(partitions), segment_bytes=1 << 20)
    syncfs = CountingSyncFs()
    node.group_sync.close()
    node.group_sync = GroupSync(node.directory, syncfs)
    adopt(node, partitions)
    return node, syncfs


@needs_syncfs
def test_appends_of_several_partitions_share_one_syncfs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node, syncfs = counted_node(tmp_path, [0, 1, 2])
    try:
        fsyncs = count_fsyncs(monkeypatch)
        services = node.partitions
        answered = node.process_group(
            [
                (services[0], [append(SESSION, 1, 0, 0, 3), append(SESSION, 2, 0, 3, 2)]),
                (services[1], [append(SESSION, 3, 1, 0, 4)]),
                (services[2], [MaxTransactionIdRequest(SESSION, 4, 2)]),
            ]
        )
        assert answered[0] == [SuccessResponse(SESSION, 1, 0), SuccessResponse(SESSION, 2, 0)]
        assert answered[1] == [SuccessResponse(SESSION, 3, 1)]
        assert len(answered[2]) == 1
        assert syncfs.calls == 1
        assert fsyncs == []  # no data file fsync'd on its own
        assert [fsync_metric(node, p) for p in (0, 1, 2)] == [1, 1, 0]
        shared = node.metrics.registry.get_sample_value("waltz_storage_syncfs_seconds_count")
        assert shared == 1
        assert read_back(services[0], SESSION, 0, 10).records.buf == wire(make_records(0, 5))
        assert read_back(services[1], SESSION, 0, 10).records.buf == wire(make_records(0, 4))
    finally:
        node.close()
    # Durable and intact: the reopened node serves the same records.
    node = open_node(tmp_path, {0, 1, 2}, num=3, segment_bytes=1 << 20)
    try:
        assert [node.partitions[p].log.max_txid for p in (0, 1, 2)] == [4, 3, -1]  # type: ignore[union-attr]
    finally:
        node.close()


@needs_syncfs
def test_one_partition_appending_keeps_its_own_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node, syncfs = counted_node(tmp_path, [0, 1])
    try:
        fsyncs = count_fsyncs(monkeypatch)
        services = node.partitions
        answered = node.process_group(
            [
                (services[0], [append(SESSION, 1, 0, 0, 3)]),
                (services[1], [MaxTransactionIdRequest(SESSION, 2, 1)]),
            ]
        )
        assert answered[0] == [SuccessResponse(SESSION, 1, 0)]
        assert syncfs.calls == 0
        assert fsyncs == [str(tmp_path / "0" / "0000000000000000000.seg")]
    finally:
        node.close()


def test_without_syncfs_each_partition_fsyncs_its_own_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = EngineSettings(segment_bytes=1 << 20, group_sync=False)
    node = StorageNode.open(str(tmp_path), KEY, 2, {0, 1}, settings)
    try:
        assert not node.group_sync.available
        adopt(node, [0, 1])
        fsyncs = count_fsyncs(monkeypatch)
        services = node.partitions
        answered = node.process_group(
            [
                (services[0], [append(SESSION, 1, 0, 0, 3)]),
                (services[1], [append(SESSION, 2, 1, 0, 2)]),
            ]
        )
        assert answered == [[SuccessResponse(SESSION, 1, 0)], [SuccessResponse(SESSION, 2, 1)]]
        assert sorted(fsyncs) == [str(tmp_path / p / "0000000000000000000.seg") for p in ("0", "1")]
    finally:
        node.close()


@needs_syncfs
def test_a_failed_syncfs_fails_every_append_it_covered_and_every_later_one(
    tmp_path: Path,
) -> None:
    node, syncfs = counted_node(tmp_path, [0, 1, 2])
    try:
        services = node.partitions
        syncfs.fail = True
        answered = node.process_group(
            [
                (services[0], [append(SESSION, 1, 0, 0, 3)]),
                (services[1], [append(SESSION, 2, 1, 0, 2)]),
            ]
        )
        for (response,) in answered:
            assert isinstance(response, FailureResponse)
            assert response.error == StorageError.IO_ERROR
            assert "syncfs failed" in response.message
        assert services[0].unavailable and services[1].unavailable
        assert services[2].unavailable is None  # it appended nothing: untouched for now
        # The page cache is not trusted again: a later syncfs is refused without a call,
        # even though the disk would now say yes.
        syncfs.fail = False
        calls = syncfs.calls
        with pytest.raises(OSError, match="syncfs failed"):
            node.group_sync.sync_filesystem()
        assert syncfs.calls == calls
    finally:
        node.close()
