"""A storage node follows online partition growth (``waltz cluster add-partitions``).

The control file grows crash-safely (a new file beside it, renamed over it), keeping
every old partition's slots byte for byte; an Open with the node's count or fewer is
accepted, more is refused until the node has grown; a node grows at start when the
cluster grew while it was down, and while it serves when ZooKeeper's count rises,
before it opens the new partitions the assignment gives it, whichever watch reports
first.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

import pytest

from waltz_client.cluster.admin import create_cluster
from waltz_client.cluster.metadata import (
    ClusterParams,
    Ownership,
    PartitionMetadata,
    ReplicaAssignment,
)
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close, connect
from waltz_client.wire.records import Record, RecordBatch, ReqId
from waltz_client.wire.storage_client import StorageClient, StorageFailure
from waltz_client.wire.storage_messages import (
    AppendRequest,
    FailureResponse,
    MaxTransactionIdRequest,
    MaxTransactionIdResponse,
    OpenRequest,
    SetLowWaterMarkRequest,
    StorageError,
    SuccessResponse,
)
from waltz_storage import control_file
from waltz_storage.control_file import CONTROL_FILE_NAME, ControlFile, PartitionInfo
from waltz_storage.errors import ControlFileError
from waltz_storage.inspect import read_control_file
from waltz_storage.main import AssignmentApplier
from waltz_storage.service import EngineSettings, StorageNode

T = TypeVar("T")
KEY = uuid.UUID("5eed5eed-1234-4abc-8def-0123456789ab")
OTHER_KEY = uuid.UUID("0ddba11e-1234-4abc-8def-0123456789ab")
HEADER_BYTES = 128
ENTRY_BYTES = 100  # i32 partition ID + two 48-byte slots
ADDRESS = "127.0.0.1:9"


def run(coro: Awaitable[T], timeout: float = 60.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def ctl(directory: Path) -> Path:
    return directory / CONTROL_FILE_NAME


def entries(directory: Path, first: int, end: int) -> bytes:
    data = ctl(directory).read_bytes()
    return data[HEADER_BYTES + ENTRY_BYTES * first : HEADER_BYTES + ENTRY_BYTES * end]


def count_on_disk(directory: Path) -> int:
    opened = ControlFile.open(str(directory))
    try:
        return opened.num_partitions
    finally:
        opened.close()


def info_on_disk(directory: Path, partition: int) -> PartitionInfo:
    opened = ControlFile.open(str(directory))
    try:
        return opened.read_partition(partition)
    finally:
        opened.close()


def open_node(directory: Path, num: int, partitions: set[int]) -> StorageNode:
    return StorageNode.open(
        str(directory), KEY, num, partitions, EngineSettings(segment_bytes=64 * 1024)
    )


def batch(first: int, n: int) -> RecordBatch:
    return RecordBatch.from_records(
        [Record(t, ReqId(7, 1, 0, t), t, f"record {t}".encode()) for t in range(first, first + n)]
    )


# --- the control file -----------------------------------------------------------------------


def test_grow_keeps_the_old_entries_byte_for_byte_and_adds_fresh_ones(tmp_path: Path) -> None:
    opened = ControlFile.create(str(tmp_path), KEY, 3)
    stored = opened.write_partition(
        1, PartitionInfo(fence_session_id=9, session_id=8, low_water_mark=41)
    )
    created_ms = opened.created_ms
    opened.close()
    # A damaged slot is part of the old state too: it is copied as it is.
    with open(ctl(tmp_path), "r+b") as f:
        f.seek(HEADER_BYTES + ENTRY_BYTES * 2 + 4 + 10)
        f.write(b"\x00")  # inside the fence session ID, -1 (all 0xff)
    before = entries(tmp_path, 0, 3)

    opened = ControlFile.open(str(tmp_path))
    try:
        assert opened.grow(5) is True
        assert opened.num_partitions == 5
        assert opened.read_partition(1) == stored
        assert opened.read_partition(4) == PartitionInfo(sequence=1)
    finally:
        opened.close()

    assert ctl(tmp_path).stat().st_size == HEADER_BYTES + 5 * ENTRY_BYTES
    assert entries(tmp_path, 0, 3) == before
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    ControlFile.create(str(fresh), KEY, 5).close()
    assert entries(tmp_path, 3, 5) == entries(fresh, 3, 5)  # what create writes
    assert sorted(os.listdir(tmp_path)) == ["fresh", CONTROL_FILE_NAME]  # no .tmp left

    report = read_control_file(str(tmp_path))
    assert (report.num_partitions, report.cluster_key, report.created_ms) == (5, KEY, created_ms)
    assert report.partitions[2]["slots"][0] is None  # still damaged, still readable
    assert info_on_disk(tmp_path, 1) == stored


def test_grow_to_the_same_count_is_a_no_op_and_fewer_is_refused(tmp_path: Path) -> None:
    opened = ControlFile.create(str(tmp_path), KEY, 4)
    try:
        before = ctl(tmp_path).read_bytes()
        inode = ctl(tmp_path).stat().st_ino
        assert opened.grow(4) is False
        with pytest.raises(ControlFileError, match="partitions never shrink"):
            opened.grow(3)
        assert ctl(tmp_path).read_bytes() == before
        assert ctl(tmp_path).stat().st_ino == inode
        assert opened.num_partitions == 4
    finally:
        opened.close()


def test_updates_after_a_grow_reach_the_new_file(tmp_path: Path) -> None:
    opened = ControlFile.create(str(tmp_path), KEY, 2)
    try:
        opened.grow(3)
        old = opened.write_partition(0, PartitionInfo(fence_session_id=3))
        new = opened.write_partition(2, PartitionInfo(fence_session_id=4))
    finally:
        opened.close()
    assert (info_on_disk(tmp_path, 0), info_on_disk(tmp_path, 2)) == (old, new)


class Crash(BaseException):
    """The process dies here: nothing after it runs (no clean-up either)."""


def crash_at(monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    """Make ``grow`` stop at ``step``, leaving the files as a crash there would."""
    if step == "half written":
        real_write = os.write

        def torn_write(fd: int, data: bytes) -> int:
            real_write(fd, bytes(data[: len(data) // 2]))
            raise Crash

        monkeypatch.setattr(os, "write", torn_write)
        return
    target = {
        "before fsync": (os, "fsync"),
        "before rename": (os, "replace"),
        "before directory fsync": (control_file, "fsync_directory"),
    }[step]

    def crash(*_args: object) -> None:
        raise Crash

    monkeypatch.setattr(*target, crash)


@pytest.mark.parametrize(
    ("step", "count_after"),
    [
        ("half written", 2),
        ("before fsync", 2),
        ("before rename", 2),
        # Renamed: the new file (fsync'd before the rename). Had the rename not reached
        # the disk yet, the old one would be back: either way a whole file.
        ("before directory fsync", 5),
    ],
)
def test_a_crash_during_grow_leaves_the_old_or_the_new_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, count_after: int
) -> None:
    opened = ControlFile.create(str(tmp_path), KEY, 2)
    stored = opened.write_partition(1, PartitionInfo(fence_session_id=6, low_water_mark=2))
    before = ctl(tmp_path).read_bytes()
    with monkeypatch.context() as patched:
        crash_at(patched, step)
        with pytest.raises(Crash):
            opened.grow(5)
    opened.close()

    assert count_on_disk(tmp_path) == count_after
    assert info_on_disk(tmp_path, 1) == stored
    if count_after == 2:
        assert ctl(tmp_path).read_bytes() == before
    # The next start grows again over whatever temporary file the crash left.
    again = ControlFile.open(str(tmp_path))
    try:
        again.grow(6)
    finally:
        again.close()
    assert count_on_disk(tmp_path) == 6
    assert info_on_disk(tmp_path, 1) == stored
    assert os.listdir(tmp_path) == [CONTROL_FILE_NAME]


def test_a_failed_grow_leaves_the_file_and_the_open_control_file_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = ControlFile.create(str(tmp_path), KEY, 2)
    try:
        before = ctl(tmp_path).read_bytes()

        def disk_full(*_args: object) -> None:
            raise OSError(28, "No space left on device")

        with monkeypatch.context() as patched:
            patched.setattr(os, "fsync", disk_full)
            with pytest.raises(OSError, match="No space left"):
                opened.grow(4)
        assert opened.num_partitions == 2
        assert ctl(tmp_path).read_bytes() == before
        assert os.listdir(tmp_path) == [CONTROL_FILE_NAME]  # the temporary file removed
        stored = opened.write_partition(0, PartitionInfo(fence_session_id=2))
        assert opened.grow(4) is True
    finally:
        opened.close()
    assert info_on_disk(tmp_path, 0) == stored


def test_an_update_during_a_grow_waits_for_it_and_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot update that came while the file was being copied would go to the replaced
    file and be lost: it waits for the grow and lands in the new file."""
    opened = ControlFile.create(str(tmp_path), KEY, 2)
    real_write_beside = control_file._write_beside
    results: list[PartitionInfo] = []
    writer = threading.Thread(
        target=lambda: results.append(
            opened.write_partition(1, PartitionInfo(fence_session_id=12, low_water_mark=5))
        )
    )

    def copying(path: str, image: bytes) -> int:
        # The old entries are copied: an update now must not slip in before the rename.
        writer.start()
        writer.join(0.5)  # it is waiting for the lock (were it not, it would finish now)
        return real_write_beside(path, image)

    monkeypatch.setattr(control_file, "_write_beside", copying)
    try:
        opened.grow(3)
        writer.join()
    finally:
        opened.close()
    (stored,) = results
    assert stored.fence_session_id == 12
    assert info_on_disk(tmp_path, 1) == stored
    assert count_on_disk(tmp_path) == 3


def test_updates_racing_many_grows_are_all_kept(tmp_path: Path) -> None:
    opened = ControlFile.create(str(tmp_path), KEY, 3)
    last: dict[int, PartitionInfo] = {}
    done = threading.Event()
    errors: list[BaseException] = []

    def update(partition: int) -> None:
        mark = 0
        try:
            while not done.is_set():
                mark += 1
                last[partition] = opened.write_partition(
                    partition, PartitionInfo(fence_session_id=mark, low_water_mark=mark)
                )
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    writers = [threading.Thread(target=update, args=(p,)) for p in range(3)]
    for w in writers:
        w.start()
    try:
        for count in range(4, 24):
            opened.grow(count)
    finally:
        done.set()
        for w in writers:
            w.join()
        opened.close()
    assert errors == []
    assert count_on_disk(tmp_path) == 23
    for p in range(3):
        assert last[p].fence_session_id > 0
        assert info_on_disk(tmp_path, p) == last[p]
    for p in range(3, 23):
        assert info_on_disk(tmp_path, p) == PartitionInfo(sequence=1)


# --- the node: Open, grow, start --------------------------------------------------------------


def test_open_with_the_same_or_fewer_partitions_is_accepted_more_refused(tmp_path: Path) -> None:
    node = open_node(tmp_path, 4, {0, 3})
    try:
        for count in (4, 3, 1):
            assert node.check_open(OpenRequest(-1, count, -1, KEY, count)) == SuccessResponse(
                -1, count, -1
            )
        for count in (5, 0):
            response = node.check_open(OpenRequest(-1, 9, -1, KEY, count))
            assert isinstance(response, FailureResponse)
            assert response.error == StorageError.PARTITION_COUNT_MISMATCH
            assert (response.session_id, response.seq, response.partition_id) == (-1, 9, -1)
        refused = node.check_open(OpenRequest(-1, 9, -1, KEY, 5))
        assert isinstance(refused, FailureResponse)
        assert "5 partitions by the request" in refused.message
        assert "only 4" in refused.message
        assert "not followed the cluster's growth yet" in refused.message
    finally:
        node.close()


def test_a_grown_node_accepts_the_new_count_and_opens_new_partitions(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = open_node(tmp_path, 2, {0, 1})
    try:
        with pytest.raises(ControlFileError, match=r"outside 0\.\.1"):
            node.add_partition(3)
        with caplog.at_level(logging.INFO, logger="waltz_storage.service"):
            assert node.grow(4) is True
            assert node.grow(4) is False
        grew = [r.getMessage() for r in caplog.records if "grew" in r.getMessage()]
        assert len(grew) == 1 and grew[0].endswith("grew from 2 to 4 partitions"), grew
        assert node.num_partitions == 4
        assert isinstance(node.check_open(OpenRequest(-1, 1, -1, KEY, 4)), SuccessResponse)
        assert isinstance(node.check_open(OpenRequest(-1, 2, -1, KEY, 2)), SuccessResponse)
        svc = node.add_partition(3)
        assert svc.process([MaxTransactionIdRequest(1, 1, 3)]) == [
            MaxTransactionIdResponse(1, 1, 3, -1)
        ]
        assert svc.process([AppendRequest(1, 2, 3, batch(0, 2))]) == [SuccessResponse(1, 2, 3)]
        with pytest.raises(ControlFileError, match="partitions never shrink"):
            node.grow(3)
    finally:
        node.close()
    assert count_on_disk(tmp_path) == 4


def test_a_node_grows_at_start_when_the_cluster_grew_while_it_was_down(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = open_node(tmp_path, 3, {0, 1})
    try:
        assert node.partitions[1].process(
            [AppendRequest(4, 1, 1, batch(0, 3)), SetLowWaterMarkRequest(4, 2, 1, 2)]
        ) == [SuccessResponse(4, 1, 1), SuccessResponse(4, 2, 1)]
        state = node.control.read_partition(1)
    finally:
        node.close()
    before = entries(tmp_path, 0, 3)

    with caplog.at_level(logging.INFO, logger="waltz_storage.service"):
        node = open_node(tmp_path, 5, {1, 4})
    try:
        assert "grew from 3 to 5 partitions" in caplog.text
        assert node.num_partitions == 5
        assert node.control.read_partition(1) == state
        assert node.partitions[1].process([MaxTransactionIdRequest(4, 3, 1)]) == [
            MaxTransactionIdResponse(4, 3, 1, 2)
        ]
        assert node.partitions[4].unavailable is None
    finally:
        node.close()
    assert entries(tmp_path, 0, 3) == before

    # More partitions on disk than the cluster has: another cluster, or a shrink.
    with pytest.raises(ControlFileError, match=r"has 5 partitions, but .* configured with 4"):
        open_node(tmp_path, 4, {0})
    assert count_on_disk(tmp_path) == 5


# --- following ZooKeeper's count while serving (in process, either watch first) -------------


@dataclass
class FakeServer:
    added: list[int] = field(default_factory=list)

    def add_partition(self, partition_id: int) -> None:
        self.added.append(partition_id)

    async def remove_partition(self, partition_id: int) -> None:
        raise AssertionError(f"nothing is removed here, got {partition_id}")


@dataclass
class FakeFollower:
    """What ZooKeeper holds: the cluster's parameters (read when asked)."""

    params: ClusterParams
    reads: int = 0

    async def current_params(self) -> ClusterParams:
        self.reads += 1
        return self.params

    async def needing_vote(self, partitions: set[int], address: str) -> set[int]:
        return set()

    def watch_partition(self, partition_id: int, on_change: Callable[[], None]) -> None:
        raise AssertionError("no partition retires here")

    def unwatch_partition(self, partition_id: int) -> None:
        pass


def grown(count: int, key: uuid.UUID = KEY) -> ClusterParams:
    return ClusterParams("t", key, count, 1)


def assigned(partitions: range | set[int]) -> ReplicaAssignment:
    return ReplicaAssignment({ADDRESS: frozenset(partitions)})


def follow(
    tmp_path: Path, zookeeper_count: int, steps: Callable[[AssignmentApplier], Awaitable[None]]
) -> tuple[StorageNode, FakeServer, FakeFollower]:
    """A 2-partition node holding 0-1 whose cluster now has ``zookeeper_count``; ``steps``
    hands the applier what the watches report."""
    node = open_node(tmp_path, 2, {0, 1})
    server, follower = FakeServer(), FakeFollower(grown(zookeeper_count))
    applier = AssignmentApplier(node, server, ADDRESS, follower)  # type: ignore[arg-type]
    try:
        run(steps(applier))
    except BaseException:
        node.close()
        raise
    return node, server, follower


async def applied(applier: AssignmentApplier, assignment: ReplicaAssignment) -> None:
    done = asyncio.Event()
    applier.submit(assignment, done)
    await done.wait()


def test_the_assignment_reported_before_the_count_grows_the_node_first(tmp_path: Path) -> None:
    async def steps(applier: AssignmentApplier) -> None:
        await applied(applier, assigned(range(4)))  # names partitions 2 and 3 first
        applier.cluster_changed(grown(4))  # then the count: nothing left to do
        await applied(applier, assigned(range(4)))

    node, server, follower = follow(tmp_path, 4, steps)
    try:
        assert follower.reads == 1
        assert node.num_partitions == 4
        assert sorted(node.partitions) == [0, 1, 2, 3]
        assert server.added == [2, 3]
    finally:
        node.close()
    assert count_on_disk(tmp_path) == 4


def test_the_count_reported_before_the_assignment_grows_the_node(tmp_path: Path) -> None:
    async def steps(applier: AssignmentApplier) -> None:
        applier.cluster_changed(grown(4))
        await applied(applier, assigned(range(4)))

    node, server, follower = follow(tmp_path, 4, steps)
    try:
        assert follower.reads == 0  # grown already: no need to read the count
        assert node.num_partitions == 4
        assert server.added == [2, 3]
    finally:
        node.close()


def test_a_count_alone_grows_the_node_and_opens_nothing(tmp_path: Path) -> None:
    async def steps(applier: AssignmentApplier) -> None:
        applier.cluster_changed(grown(6))
        for _ in range(100):  # the applier's task grows in a worker thread
            if applier._node.num_partitions == 6:
                break
            await asyncio.sleep(0.05)

    node, server, _ = follow(tmp_path, 6, steps)
    try:
        assert node.num_partitions == 6
        assert sorted(node.partitions) == [0, 1] and server.added == []
    finally:
        node.close()


def test_no_shrink_no_other_key_no_partition_beyond_the_cluster(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def steps(applier: AssignmentApplier) -> None:
        applier.cluster_changed(grown(1))
        applier.cluster_changed(grown(8, OTHER_KEY))
        # ZooKeeper says 3 partitions, yet the assignment names 5: a broken assignment.
        await applied(applier, assigned({0, 1, 2, 5}))

    with caplog.at_level(logging.INFO):
        node, server, _ = follow(tmp_path, 3, steps)
    try:
        assert node.num_partitions == 3
        assert sorted(node.partitions) == [0, 1, 2]
        assert server.added == [2]
    finally:
        node.close()
    assert "partitions never shrink" in caplog.text
    assert "not following its partition count" in caplog.text
    assert "gives this node partitions 5, outside the cluster's 0..2" in caplog.text
    assert "grew from 2 to 3 partitions" in caplog.text


# --- a real storage node on a real ZooKeeper ------------------------------------------------


def zk_node_args(zookeeper, zk_root: str, directory: Path, port: int, ready: Path) -> list[str]:
    return [
        *("--directory", str(directory)),
        *("--zookeeper", zookeeper.connect_string, "--zk-root", zk_root),
        *("--host", "127.0.0.1", "--port", str(port), "--http-port", "0"),
        *("--ready-file", str(ready)),
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def add_partitions(zk, root: str, to: int, address: str) -> None:
    """What ``waltz cluster add-partitions --to N`` writes, in one transaction: the count,
    the assignment (the new partitions on ``address``), their metadata nodes, ownership."""
    paths = ClusterPaths.of(root)
    raw_params, params_stat = zk.get(paths.cluster)
    params = ClusterParams.decode(raw_params)
    raw_assignment, assignment_stat = zk.get(paths.assignment)
    assignment = ReplicaAssignment.decode(raw_assignment)
    raw_ownership, ownership_stat = zk.get(paths.ownership)
    ownership = Ownership.decode(raw_ownership)
    new = range(params.num_partitions, to)
    storages = {
        s: parts | frozenset(new) if s == address else parts
        for s, parts in assignment.storages.items()
    }
    txn = zk.transaction()
    txn.set_data(paths.cluster, replace(params, num_partitions=to).encode(), params_stat.version)
    txn.set_data(
        paths.assignment,
        replace(assignment, storages=storages).encode(),
        assignment_stat.version,
    )
    for p in new:
        txn.create(paths.partition(p), PartitionMetadata().encode())
    txn.set_data(
        paths.ownership,
        Ownership({**ownership.partitions, **{p: (None, 0) for p in new}}).encode(),
        ownership_stat.version,
    )
    results = txn.commit()
    assert not [r for r in results if isinstance(r, Exception)], results


async def opened_max_ids(host: str, port: int, key: uuid.UUID, count: int) -> list[int] | str:
    """Max transaction IDs of partitions 0..count-1 after an Open with ``count``; or why not."""
    async with await StorageClient.connect(host, port) as client:
        try:
            await client.open(key, count)
            return [await client.max_transaction_id(-1, p) for p in range(count)]
        except StorageFailure as e:
            return f"{e.error.name}: {e}"


def wait_for_growth(node, key: uuid.UUID, count: int, seconds: float = 90.0) -> list[int]:
    """Poll (generously: a busy machine) until an Open with ``count`` serves every partition."""
    deadline = time.monotonic() + seconds
    while True:
        answer = run(opened_max_ids(node.host, node.port, key, count))
        if isinstance(answer, list):
            return answer
        assert time.monotonic() < deadline, f"never grew: {answer}\n{node.log()}"
        time.sleep(0.1)


def test_a_serving_node_follows_add_partitions_in_zookeeper(
    storage_factory, zookeeper, zk_root: str, tmp_path: Path
) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    zk = connect(zookeeper.connect_string)
    try:
        key = create_cluster(zk, zk_root, "t", 2, 1, [address]).params.key
        ready = tmp_path / "ready-zk.json"
        node = storage_factory(
            raw_args=zk_node_args(zookeeper, zk_root, tmp_path / "data", port, ready),
            ready_file=ready,
        )
        assert run(opened_max_ids(node.host, node.port, key, 2)) == [-1, -1]
        refused = run(opened_max_ids(node.host, node.port, key, 4))
        assert isinstance(refused, str) and refused.startswith("PARTITION_COUNT_MISMATCH")

        add_partitions(zk, zk_root, 4, address)
        assert wait_for_growth(node, key, 4) == [-1, -1, -1, -1]
        # A server that has not read the new count yet is still served.
        assert run(opened_max_ids(node.host, node.port, key, 2)) == [-1, -1]
        assert read_control_file(str(tmp_path / "data")).num_partitions == 4
        assert node.log().count("grew from 2 to 4 partitions") == 1
        assert "opened 2-3" in node.log()

        # Restarted, it opens the grown file as it is.
        node.restart()
        assert wait_for_growth(node, key, 4) == [-1, -1, -1, -1]
    finally:
        close(zk)


def test_a_node_down_during_add_partitions_grows_at_start(
    storage_factory, zookeeper, zk_root: str, tmp_path: Path
) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    zk = connect(zookeeper.connect_string)
    try:
        key = create_cluster(zk, zk_root, "t", 2, 1, [address]).params.key
        directory = tmp_path / "data"
        directory.mkdir()
        ControlFile.create(str(directory), key, 2).close()  # what it had before it went down
        add_partitions(zk, zk_root, 5, address)
        ready = tmp_path / "ready-zk.json"
        node = storage_factory(
            raw_args=zk_node_args(zookeeper, zk_root, directory, port, ready),
            ready_file=ready,
        )
        assert wait_for_growth(node, key, 5) == [-1] * 5
        assert read_control_file(str(directory)).num_partitions == 5
        assert "grew from 2 to 5 partitions" in node.log()
    finally:
        close(zk)
