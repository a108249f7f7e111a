"""Growing a cluster's partitions in ZooKeeper (``admin.add_partitions``), against a real
ZooKeeper server: one transaction writes the count, the new partitions' replicas, their
metadata and ownership entries; partitions never shrink; a concurrent change is decided
again, never overwritten."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from waltz_client.cluster import admin
from waltz_client.cluster.errors import ClusterError
from waltz_client.cluster.metadata import Ownership, PartitionMetadata, ReplicaAssignment
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close, connect

STORAGES = ["s0:9000", "s1:9000", "s2:9000", "s3:9000"]


@pytest.fixture
def zk(zookeeper) -> Iterator[KazooClient]:
    client = connect(zookeeper.connect_string, timeout=10.0)
    try:
        yield client
    finally:
        close(client)


def everything(zk: KazooClient, root: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}

    def walk(path: str) -> None:
        out[path] = zk.get(path)[0]
        for child in zk.get_children(path):
            walk(f"{path}/{child}")

    walk(root)
    return out


def test_growing_writes_count_replicas_metadata_and_ownership(zk, zk_root) -> None:
    admin.create_cluster(zk, zk_root, "grow", 4, 3, STORAGES)
    before = admin.read_cluster(zk, zk_root)
    result = admin.add_partitions(zk, zk_root, 10)
    assert result.grown and result.before == 4 and result.params.num_partitions == 10
    after = admin.read_cluster(zk, zk_root)
    assert after.problems == []  # every partition has its replicas and metadata
    assert after.params.key == before.params.key
    assert sorted(after.partitions) == list(range(10))
    assert all(after.partitions[p] == PartitionMetadata() for p in range(4, 10))
    for p in range(4):  # the old ones kept their replicas
        assert after.assignment.replicas_of(p) == before.assignment.replicas_of(p)
    for p in range(4, 10):
        assert len(after.assignment.replicas_of(p)) == 3
        assert after.ownership.partitions[p] == (None, 0)
    loads = [len(ps) for ps in after.assignment.storages.values()]
    assert max(loads) - min(loads) <= 1


def test_the_same_count_changes_nothing_and_fewer_is_refused(zk, zk_root) -> None:
    admin.create_cluster(zk, zk_root, "grow", 4, 3, STORAGES)
    admin.add_partitions(zk, zk_root, 6)
    snapshot = everything(zk, zk_root)
    again = admin.add_partitions(zk, zk_root, 6)
    assert not again.grown and again.params.num_partitions == 6
    with pytest.raises(ClusterError, match="partitions are never removed, so it cannot have 5"):
        admin.add_partitions(zk, zk_root, 5)
    assert everything(zk, zk_root) == snapshot


def test_no_cluster_is_named(zk, zk_root) -> None:
    with pytest.raises(ClusterError, match="no Waltz cluster at"):
        admin.add_partitions(zk, zk_root, 3)


def test_too_few_storage_nodes_for_the_replicas_changes_nothing(zk, zk_root) -> None:
    admin.create_cluster(zk, zk_root, "grow", 2, 3, STORAGES[:3])
    # Take a node out by hand (remove-storage would refuse): the assignment names two.
    paths = ClusterPaths.of(zk_root)
    assignment, version = admin.read_assignment(zk, zk_root)
    two = ReplicaAssignment({s: ps for s, ps in assignment.storages.items() if s != "s2:9000"})
    zk.set(paths.assignment, two.encode(), version=version)
    snapshot = everything(zk, zk_root)
    with pytest.raises(ClusterError, match="3 replicas need at least 3 storage nodes"):
        admin.add_partitions(zk, zk_root, 4)
    assert everything(zk, zk_root) == snapshot


def test_a_concurrent_ownership_change_is_kept_and_the_growth_decided_again(
    zk, zk_root, monkeypatch
) -> None:
    # A server moves partition 0 between our read and our write: the transaction's
    # compare-and-set fails, and the retry keeps the server's move.
    admin.create_cluster(zk, zk_root, "grow", 2, 3, STORAGES)
    paths = ClusterPaths.of(zk_root)
    real_transaction = zk.transaction
    moved = []

    def transaction():
        if not moved:
            data, stat = zk.get(paths.ownership)
            owners = Ownership.decode(data)
            owners.partitions[0] = ("server-a", 1)
            zk.set(paths.ownership, owners.encode(), version=stat.version)
            moved.append(True)
        return real_transaction()

    monkeypatch.setattr(zk, "transaction", transaction)
    result = admin.add_partitions(zk, zk_root, 3)
    assert result.grown
    owners = Ownership.decode(zk.get(paths.ownership)[0])
    assert owners.partitions == {0: ("server-a", 1), 1: (None, 0), 2: (None, 0)}
