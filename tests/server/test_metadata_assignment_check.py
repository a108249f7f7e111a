"""A session names its members in the partition metadata only while the replica assignment
it recovered with is still current, checked in the same ZooKeeper transaction.

Without the check, a replica removed while a session recovered could be named a member
after its storage node had already closed the partition (it had read metadata that did
not need its vote), and the next recovery would wait for that vote for ever; the
deterministic simulation reached that schedule. Real ZooKeeper; the assignment is
changed with the admin functions an operator's `waltz cluster` uses.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from kazoo.client import KazooClient
from server_harness import until

from waltz_client.cluster.admin import add_storage, create_cluster
from waltz_client.cluster.metadata import ServerRegistration
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close, connect
from waltz_server.coordinator import ServerCoordinator
from waltz_server.metadata_writes import MetadataWrite, MetadataWriter, batches
from waltz_server.recovery_manager import AssignmentChanged, MetadataConflict, Superseded

pytestmark = pytest.mark.timeout(300)

STORAGES = ["127.0.0.1:9000", "127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"]


@contextlib.asynccontextmanager
async def following(zookeeper, zk_root: str) -> AsyncIterator[tuple[ServerCoordinator, tuple]]:
    """A server's coordinator that has read the assignment; partition 0's replicas."""
    coordinator = ServerCoordinator(
        zookeeper.connect_string, zk_root, ServerRegistration("s0", "127.0.0.1", 1, 2)
    )
    await coordinator.start()
    try:
        await until(lambda: coordinator.assignment is not None, "the assignment")
        assert coordinator.assignment is not None
        yield coordinator, tuple(coordinator.assignment.replicas_of(0))
    finally:
        await coordinator.stop()


def test_a_session_is_recorded_only_with_the_current_assignment(zookeeper, zk_root) -> None:
    admin = connect(zookeeper.connect_string)
    create_cluster(admin, zk_root, "check", 2, 3, STORAGES[:3])
    assignment_path = ClusterPaths.of(zk_root).assignment

    async def scenario() -> None:
        async with following(zookeeper, zk_root) as (coordinator, replicas):
            meta, version = await coordinator.read(0)

            # The assignment the session recovered with is current: the write lands.
            version = await coordinator.write(0, meta, version, replicas=replicas)

            # The assignment changes in ZooKeeper (here only its version: the same
            # content written again) before this server's watch reports it. Blocking the
            # loop here keeps the watch's callback from running before the write: the
            # server still believes the old version, and the transaction's check refuses.
            known = coordinator.assignment_version
            data, _ = admin.get(assignment_path)
            admin.set(assignment_path, data)
            with pytest.raises(AssignmentChanged, match="assignment changed"):
                await coordinator.write(0, meta, version, replicas=replicas)
            assert (await coordinator.read(0))[1] == version  # nothing was written
            # Once the watch reports the new version, the same replicas are current again.
            await until(lambda: coordinator.assignment_version > known, "the watch")
            version = await coordinator.write(0, meta, version, replicas=replicas)

            # A replica joins partition 0: a session recovered with the old set must not
            # be recorded (and one with the new set is).
            await asyncio.to_thread(add_storage, admin, zk_root, STORAGES[3], partitions={0})
            await until(
                lambda: len(coordinator.assignment.replicas_of(0)) == 4,  # type: ignore[union-attr]
                "the new assignment",
            )
            with pytest.raises(AssignmentChanged, match="now assigned"):
                await coordinator.write(0, meta, version, replicas=replicas)
            assert (await coordinator.read(0))[1] == version
            now = tuple(coordinator.assignment.replicas_of(0))  # type: ignore[union-attr]
            await coordinator.write(0, meta, version, replicas=now)
            # Writes that name no members (a new session ID, retention) are not checked.
            meta, version = await coordinator.read(0)
            await coordinator.write(0, meta, version)

    try:
        asyncio.run(scenario())
    finally:
        close(admin)


def test_the_writes_of_one_loop_turn_share_a_multi_and_a_failed_one_fails_alone(
    zookeeper, zk_root
) -> None:
    """A server taking many partitions writes their metadata in one ZooKeeper multi. A
    multi is all or nothing: when one write's version moved (a newer owner), or the
    assignment it checks changed, the others still land and only that one fails."""
    admin = connect(zookeeper.connect_string)
    create_cluster(admin, zk_root, "multi", 8, 3, STORAGES[:3])
    paths = ClusterPaths.of(zk_root)

    async def scenario() -> None:
        async with following(zookeeper, zk_root) as (coordinator, replicas):
            read = await asyncio.gather(*(coordinator.read(p) for p in range(8)))
            writes = coordinator.metadata_writes
            versions = await asyncio.gather(
                *(coordinator.write(p, meta, v) for p, (meta, v) in enumerate(read))
            )
            assert writes.multis == 1
            assert versions == [v + 1 for _, v in read]
            assert [admin.exists(paths.partition(p)).version for p in range(8)] == versions

            # Partition 3's metadata moves under us (a newer owner): only its write fails.
            data, _ = admin.get(paths.partition(3))
            admin.set(paths.partition(3), data)
            results = await asyncio.gather(
                *(
                    coordinator.write(p, meta, versions[p], replicas=replicas)
                    for p, (meta, _) in enumerate(read)
                ),
                return_exceptions=True,
            )
            assert isinstance(results[3], MetadataConflict)
            assert all(isinstance(r, int) for i, r in enumerate(results) if i != 3)
            assert writes.multis == 1  # that multi failed; each was written alone

            # The assignment changes: writes that check the version it had fail, one that
            # does not (a new session ID) lands. (The writer directly, with the version
            # before the change: the server's watch may report it at any moment.)
            versions = [admin.exists(paths.partition(p)).version for p in range(8)]
            stale = admin.exists(paths.assignment).version
            data, _ = admin.get(paths.assignment)
            admin.set(paths.assignment, data)
            checked = [
                writes.write(
                    MetadataWrite(p, paths.partition(p), read[p][0].encode(), versions[p], stale)
                )
                for p in range(4)
            ]
            unchecked = coordinator.write(5, read[5][0], versions[5])
            results = await asyncio.gather(*checked, unchecked, return_exceptions=True)
            assert all(isinstance(r, AssignmentChanged) for r in results[:4]), results
            assert results[4] == versions[5] + 1

    try:
        asyncio.run(scenario())
    finally:
        close(admin)


def test_writes_share_a_multi_when_they_check_the_same_assignment_version() -> None:
    def w(p: int, checked: int | None) -> MetadataWrite:
        return MetadataWrite(p, f"/p/{p}", b"", 0, checked)

    writes = [w(0, None), w(1, 7), w(2, None), w(3, 7), w(4, 8)]
    assert batches(writes) == [[w(0, None), w(2, None)], [w(1, 7), w(3, 7)], [w(4, 8)]]
    assert batches([w(p, None) for p in range(5)], most=2) == [
        [w(0, None), w(1, None)],
        [w(2, None), w(3, None)],
        [w(4, None)],
    ]


def test_writes_fail_rather_than_wait_when_zookeeper_cannot_be_reached() -> None:
    def not_connected() -> KazooClient:
        raise ConnectionError("not connected to ZooKeeper")

    writer = MetadataWriter(not_connected, "/assignment")

    async def write(partitions: range) -> list:
        writes = (writer.write(MetadataWrite(p, f"/p/{p}", b"", 0, None)) for p in partitions)
        return await asyncio.wait_for(asyncio.gather(*writes, return_exceptions=True), 30)

    for partitions in (range(3), range(1)):  # a multi, and a write alone
        results = asyncio.run(write(partitions))
        assert [type(r) for r in results] == [ConnectionError] * len(partitions)


def test_a_server_that_handed_its_partitions_over_writes_no_more_metadata(
    zookeeper, zk_root
) -> None:
    """After a planned hand-over, a store session of this server that ends (a connection
    closing) must not start a recovery that races the new owner's: its first write is
    refused (Superseded, so the partition stops), and the metadata is untouched."""
    admin = connect(zookeeper.connect_string)
    create_cluster(admin, zk_root, "handed", 2, 3, STORAGES[:3])
    paths = ClusterPaths.of(zk_root)

    async def scenario() -> None:
        async with following(zookeeper, zk_root) as (coordinator, _):
            other = ServerRegistration("s1", "127.0.0.1", 3, 4)
            admin.create(paths.server("s1"), other.encode(), ephemeral=True)
            meta, version = await coordinator.read(0)
            assert await coordinator.hand_over()
            with pytest.raises(Superseded, match="stopping"):
                await coordinator.write(0, replace(meta, session_id=meta.session_id + 1), version)
            assert (await coordinator.read(0))[1] == version

    try:
        asyncio.run(scenario())
    finally:
        close(admin)
