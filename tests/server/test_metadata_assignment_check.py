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

import pytest
from server_harness import until

from waltz_client.cluster.admin import add_storage, create_cluster
from waltz_client.cluster.metadata import ServerRegistration
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close, connect
from waltz_server.coordinator import ServerCoordinator
from waltz_server.recovery_manager import AssignmentChanged

pytestmark = pytest.mark.timeout(300)

STORAGES = ["127.0.0.1:9000", "127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"]


def test_a_session_is_recorded_only_with_the_current_assignment(zookeeper, zk_root) -> None:
    admin = connect(zookeeper.connect_string)
    create_cluster(admin, zk_root, "check", 2, 3, STORAGES[:3])
    assignment_path = ClusterPaths.of(zk_root).assignment

    async def scenario() -> None:
        coordinator = ServerCoordinator(
            zookeeper.connect_string, zk_root, ServerRegistration("s0", "127.0.0.1", 1, 2)
        )
        await coordinator.start()
        try:
            await until(lambda: coordinator.assignment is not None, "the assignment")
            assert coordinator.assignment is not None
            replicas = tuple(coordinator.assignment.replicas_of(0))
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
        finally:
            await coordinator.stop()

    try:
        asyncio.run(scenario())
    finally:
        close(admin)
