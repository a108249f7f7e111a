"""A server's coordinator after a growth: an access policy that names a new partition,
written just before the server saw the count rise (so refused then as naming a partition
the cluster did not have), is read again and applied once the count rises."""

from __future__ import annotations

import asyncio

from server_harness import until

from waltz_client.cluster.access import AccessPolicy, PartitionRule
from waltz_client.cluster.admin import add_partitions, create_cluster
from waltz_client.cluster.metadata import ServerRegistration
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close, connect
from waltz_server.coordinator import ServerCoordinator

STORAGES = ["127.0.0.1:9000", "127.0.0.1:9001", "127.0.0.1:9002"]


def test_a_policy_naming_a_new_partition_applies_once_the_count_rises(zookeeper, zk_root):
    admin = connect(zookeeper.connect_string)
    create_cluster(admin, zk_root, "grow", 2, 3, STORAGES)
    rule = PartitionRule(read=("auditor",), append=("writer",))

    async def scenario() -> None:
        coordinator = ServerCoordinator(
            zookeeper.connect_string, zk_root, ServerRegistration("s0", "127.0.0.1", 1, 2)
        )
        await coordinator.start()
        try:
            # Naming partition 3 of a 2-partition cluster: refused, the old policy kept.
            policy = AccessPolicy(partitions={3: rule})
            admin.create(ClusterPaths.of(zk_root).access, policy.encode())
            await asyncio.sleep(1.0)
            assert coordinator.access.rule_for(3) is None
            await asyncio.to_thread(add_partitions, admin, zk_root, 4)
            await until(lambda: coordinator.access.rule_for(3) == rule, "the policy applied")
            assert coordinator.params is not None and coordinator.params.num_partitions == 4
        finally:
            await coordinator.stop()

    try:
        asyncio.run(scenario())
    finally:
        close(admin)
