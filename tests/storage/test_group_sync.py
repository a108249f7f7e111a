"""Group commit across partitions: one flush when a group's appends touch several.

``StorageNode.process_group`` runs the requests of any partitions on the node's I/O
thread. When more than one partition appended, one group sync makes them all durable
instead of an fsync each: on ext2/3/4, their pages written back and one fdatasync (whose
flush of the disk covers them), else one syncfs; one partition alone keeps its fsync. A
segment whose records pass the zeros an fdatasync made durable gets its own fdatasync.
A failed group sync fails every append it should have covered, and every later one.
"""

from __future__ import annotations

import ctypes
import errno
import os
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
    StorageMessage,
    SuccessResponse,
)
from waltz_storage.group_sync import (
    SYNC_FILE_RANGE_WAIT_AFTER,
    SYNC_FILE_RANGE_WAIT_BEFORE,
    SYNC_FILE_RANGE_WRITE,
    GroupSync,
    kernel_reports_syncfs_errors,
    load_syncfs,
    load_write_back,
    mount_of,
    writes_in_place,
)
from waltz_storage.service import EngineSettings, StorageNode

SESSION = 6
needs_syncfs = pytest.mark.skipif(
    load_syncfs() is None, reason="needs Linux 5.8+ (syncfs that reports errors)"
)
START = SYNC_FILE_RANGE_WRITE
WAIT = SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER


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
        shared = node.metrics.registry.get_sample_value(
            "waltz_storage_group_sync_seconds_count", {"method": "syncfs"}
        )
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


# --- write back, then one fdatasync ---------------------------------------------------


class CountingWriteBack:
    """libc's sync_file_range, its calls recorded as (file, flags); or failing with EIO."""

    def __init__(self) -> None:
        self.real = load_write_back()
        self.calls: list[tuple[str, int]] = []
        self.fail = False
        self.fsyncs: list[str] = []  # a test's count_fsyncs list, to see what came first
        self.fsyncs_before: list[int] = []  # how many fsyncs had run at each call

    def __call__(self, fd: int, offset: int, nbytes: int, flags: int) -> int:
        self.calls.append((os.readlink(f"/proc/self/fd/{fd}"), flags))
        self.fsyncs_before.append(len(self.fsyncs))
        if self.fail:
            ctypes.set_errno(errno.EIO)
            return -1
        assert self.real is not None
        return self.real(fd, offset, nbytes, flags)


def write_back_node(
    tmp_path: Path, partitions: list[int]
) -> tuple[StorageNode, CountingSyncFs, CountingWriteBack]:
    """A node that writes pages back and flushes once, its calls counted."""
    node = open_node(tmp_path, set(partitions), num=len(partitions), segment_bytes=8 << 20)
    syncfs, write_back = CountingSyncFs(), CountingWriteBack()
    node.group_sync.close()
    node.group_sync = GroupSync(node.directory, syncfs, write_back)
    assert node.group_sync.method == "write_back"
    adopt(node, partitions)
    return node, syncfs, write_back


def segment_file(tmp_path: Path, partition: int) -> str:
    return str(tmp_path / str(partition) / "0000000000000000000.seg")


def appends_to(
    node: StorageNode,
    partitions: list[int],
    first: int | None,
    seq: int,
    firsts: dict[int, int] | None = None,
) -> list[list[StorageMessage]]:
    """One group: 2 records appended to each partition, from ``first`` (or its own)."""
    services = node.partitions
    return node.process_group(
        [
            (services[p], [append(SESSION, seq + i, p, (firsts or {}).get(p, first or 0), 2)])
            for i, p in enumerate(partitions)
        ]
    )


needs_write_back = pytest.mark.skipif(
    load_write_back() is None, reason="needs Linux 5.8+ (sync_file_range and syncfs)"
)


@needs_write_back
def test_several_partitions_written_over_durable_zeros_share_one_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node, syncfs, write_back = write_back_node(tmp_path, [0, 1, 2])
    try:
        fsyncs = count_fsyncs(monkeypatch)
        # The first group after opening: no zeros are known durable yet, so each segment
        # gets its own fdatasync, which makes its length and zeros ahead durable.
        answered = appends_to(node, [0, 1, 2], 0, 1)
        assert answered == [[SuccessResponse(SESSION, 1 + p, p)] for p in (0, 1, 2)]
        assert sorted(fsyncs) == [segment_file(tmp_path, p) for p in (0, 1, 2)]
        assert write_back.calls == []
        # From now on the records land on those zeros: their pages are written back, and
        # one fdatasync, after every write finished, flushes the disk for all three.
        fsyncs.clear()
        write_back.fsyncs = fsyncs
        answered = appends_to(node, [0, 1, 2], 2, 4)
        assert answered == [[SuccessResponse(SESSION, 4 + p, p)] for p in (0, 1, 2)]
        assert write_back.calls == [
            (segment_file(tmp_path, 0), START),
            (segment_file(tmp_path, 1), START),
            (segment_file(tmp_path, 2), START),
            (segment_file(tmp_path, 0), WAIT),
            (segment_file(tmp_path, 1), WAIT),
        ]
        assert fsyncs == [segment_file(tmp_path, 2)]
        assert write_back.fsyncs_before == [0] * 5  # the flush came last
        assert syncfs.calls == 0
        assert [fsync_metric(node, p) for p in (0, 1, 2)] == [2, 2, 2]
        shared = node.metrics.registry.get_sample_value(
            "waltz_storage_group_sync_seconds_count", {"method": "write_back"}
        )
        assert shared == 2
        for p in (0, 1, 2):
            assert read_back(node.partitions[p], SESSION, 0, 10).records.buf == wire(
                make_records(0, 4)
            )
    finally:
        node.close()
    node = open_node(tmp_path, {0, 1, 2}, num=3, segment_bytes=8 << 20)
    try:
        assert [node.partitions[p].log.max_txid for p in (0, 1, 2)] == [3, 3, 3]  # type: ignore[union-attr]
    finally:
        node.close()


@needs_write_back
def test_records_past_the_durable_zeros_get_their_own_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node, _, write_back = write_back_node(tmp_path, [0, 1])
    try:
        appends_to(node, [0, 1], 0, 1)
        fsyncs = count_fsyncs(monkeypatch)
        services = node.partitions
        # 1.2 MB to partition 1: past the 1 MiB of zeros its first fdatasync made
        # durable, so its file grows, which only an fdatasync of its own commits.
        big = append(SESSION, 4, 1, 2, 400, size=3000)
        answered = node.process_group(
            [(services[0], [append(SESSION, 3, 0, 2, 2)]), (services[1], [big])]
        )
        assert answered == [[SuccessResponse(SESSION, 3, 0)], [SuccessResponse(SESSION, 4, 1)]]
        assert write_back.calls == [
            (segment_file(tmp_path, 0), START),
            (segment_file(tmp_path, 0), WAIT),
        ]
        assert fsyncs == [segment_file(tmp_path, 1)]
        # A large write gets no zeros after it: partition 1's next append grows the file
        # again (with new zeros ahead), so it has its own fdatasync once more ...
        fsyncs.clear()
        write_back.calls.clear()
        appends_to(node, [0, 1], None, 5, firsts={0: 4, 1: 402})
        assert write_back.calls == [
            (segment_file(tmp_path, 0), START),
            (segment_file(tmp_path, 0), WAIT),
        ]
        assert fsyncs == [segment_file(tmp_path, 1)]
        # ... and then lands on those zeros: both written back, partition 1 anchors the flush.
        fsyncs.clear()
        write_back.calls.clear()
        appends_to(node, [0, 1], None, 7, firsts={0: 6, 1: 404})
        assert write_back.calls == [
            (segment_file(tmp_path, 0), START),
            (segment_file(tmp_path, 1), START),
            (segment_file(tmp_path, 0), WAIT),
        ]
        assert fsyncs == [segment_file(tmp_path, 1)]
    finally:
        node.close()


@needs_write_back
def test_a_segment_on_another_device_gets_its_own_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node, _, write_back = write_back_node(tmp_path, [0, 1, 2])
    try:
        appends_to(node, [0, 1, 2], 0, 1)
        # As if partition 0's directory were mounted from another disk: a flush of this
        # one would not cover it.
        monkeypatch.setattr(node.partitions[0].active_segment, "device", -1)
        fsyncs = count_fsyncs(monkeypatch)
        appends_to(node, [0, 1, 2], 2, 4)
        assert write_back.calls == [
            (segment_file(tmp_path, 1), START),
            (segment_file(tmp_path, 2), START),
            (segment_file(tmp_path, 1), WAIT),
        ]
        assert fsyncs == [segment_file(tmp_path, 0), segment_file(tmp_path, 2)]
    finally:
        node.close()


@needs_write_back
def test_a_failed_write_back_fails_every_append_of_the_group_and_every_later_group(
    tmp_path: Path,
) -> None:
    node, _, write_back = write_back_node(tmp_path, [0, 1, 2])
    try:
        appends_to(node, [0, 1, 2], 0, 1)
        write_back.fail = True
        answered = appends_to(node, [0, 1], 2, 4)
        for (response,) in answered:
            assert isinstance(response, FailureResponse)
            assert response.error == StorageError.IO_ERROR
            assert "group sync failed" in response.message
            assert "writing back" in response.message
        services = node.partitions
        assert services[0].unavailable and services[1].unavailable
        assert services[2].unavailable is None
        write_back.fail = False
        calls = len(write_back.calls)
        with pytest.raises(OSError, match="group sync failed"):
            node.group_sync.make_durable([services[2].active_segment])
        assert len(write_back.calls) == calls
    finally:
        node.close()


@pytest.mark.parametrize(
    ("fs_type", "options", "in_place"),
    [
        ("ext4", "rw,discard,resv_strict", True),
        ("ext4", "rw,data=ordered", True),
        ("ext3", "rw", True),
        ("ext4", "rw,data=journal", False),  # data goes through the journal first
        ("xfs", "rw,attr2,inode64", False),  # reflinked blocks are copied on write
        ("btrfs", "rw,ssd", False),  # copies on write
        ("zfs", "rw", False),
        ("overlay", "rw,lowerdir=/a", False),
        ("", "", False),  # not listed: assume nothing
    ],
)
def test_only_ext_filesystems_without_data_journal_write_in_place(
    fs_type: str, options: str, in_place: bool
) -> None:
    assert writes_in_place(fs_type, options) is in_place


def test_the_mount_of_a_directory_is_found_by_its_device(tmp_path: Path) -> None:
    device = os.stat(tmp_path).st_dev
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
        f"27 1 {os.major(device)}:{os.minor(device)} / / rw,relatime shared:1 - ext4 /dev/vdb "
        "rw,data=journal\n"
    )
    assert mount_of(str(tmp_path), str(mountinfo)) == ("ext4", "rw,data=journal")
    mountinfo.write_text("22 27 0:21 / /proc rw,relatime - proc proc rw\n")
    assert mount_of(str(tmp_path), str(mountinfo)) == ("", "")
    assert mount_of(str(tmp_path), str(tmp_path / "missing")) == ("", "")


@needs_write_back
def test_a_node_writes_back_only_on_a_filesystem_that_writes_in_place(tmp_path: Path) -> None:
    group_sync = GroupSync.for_directory(str(tmp_path))
    try:
        expected = "write_back" if writes_in_place(*mount_of(str(tmp_path))) else "syncfs"
        assert group_sync.method == expected
    finally:
        group_sync.close()
    off = GroupSync.for_directory(str(tmp_path), enabled=False)
    assert off.method == "" and not off.available
    settings = EngineSettings(segment_bytes=1 << 20, group_sync_write_back=False)
    node = StorageNode.open(str(tmp_path / "node"), KEY, 2, {0, 1}, settings)
    try:
        assert node.group_sync.method == "syncfs"
    finally:
        node.close()
