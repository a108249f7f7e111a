"""CreateCluster for a WaltzCluster against a real ZooKeeper: created once, adopted on
every later call (also after the operator scaled storage, and whatever its partition
count: growing it is the reconcile's business), and a different cluster at the same root
refused with what differs, nothing written."""

from __future__ import annotations

import copy
import pathlib

import pytest
import yaml

from waltz_client.cluster import admin
from waltz_client.cluster.metadata import key_fingerprint
from waltz_operator.bootstrap import Created, Refused, Unsupported, ensure_cluster
from waltz_operator.spec import parse

ROOT = pathlib.Path(__file__).resolve().parents[2]
MINIMAL = yaml.safe_load((ROOT / "examples" / "waltzcluster-minimal.yaml").read_text())


def spec_at(root: str, **changes):
    doc = copy.deepcopy(MINIMAL)
    doc["metadata"]["namespace"] = "prod"
    doc["spec"]["zookeeper"]["root"] = root
    doc["spec"].update(changes)
    return parse(doc)


def test_created_once_then_adopted(zk, zk_root):
    spec = spec_at(zk_root)
    first = ensure_cluster(zk, spec)
    assert isinstance(first, Created) and not first.adopted
    state = admin.read_cluster(zk, zk_root)
    assert state.params.name == "prod/demo"
    assert (state.params.num_partitions, state.params.num_replicas) == (4, 3)
    assert sorted(state.assignment.storages) == sorted(spec.storage_addresses())
    assert state.assignment.problems(4, 3) == []
    again = ensure_cluster(zk, spec)  # a replayed event, or an operator restart
    assert again == Created(first.key, adopted=True, partitions=4)


def test_adopted_after_the_operator_scaled_storage(zk, zk_root):
    spec = spec_at(zk_root)
    key = ensure_cluster(zk, spec).key
    admin.add_storage(zk, zk_root, spec.storage_address(3), partitions={0})
    assert ensure_cluster(zk, spec_at(zk_root, storage={"replicas": 4})) == Created(key, True, 4)


def test_another_replica_count_is_unsupported_and_nothing_written(zk, zk_root):
    key = ensure_cluster(zk, spec_at(zk_root)).key
    before = admin.read_cluster(zk, zk_root)
    result = ensure_cluster(zk, spec_at(zk_root, replicasPerPartition=5, storage={"replicas": 5}))
    assert isinstance(result, Unsupported) and "replicasPerPartition is 3" in result.reason
    assert result.key == key and "not supported" in result.reason
    after = admin.read_cluster(zk, zk_root)
    assert (after.params, after.assignment) == (before.params, before.assignment)


@pytest.mark.parametrize("partitions", [8, 2], ids=["more", "fewer"])
def test_another_partition_count_is_adopted_with_the_count_found(zk, zk_root, partitions):
    """Growing (or refusing fewer) is decided by the reconcile: adopting writes nothing."""
    key = ensure_cluster(zk, spec_at(zk_root)).key
    before = admin.read_cluster(zk, zk_root)
    assert ensure_cluster(zk, spec_at(zk_root, partitions=partitions)) == Created(key, True, 4)
    after = admin.read_cluster(zk, zk_root)
    assert (after.params, after.assignment) == (before.params, before.assignment)


def test_another_resource_at_the_same_root_is_refused(zk, zk_root):
    ensure_cluster(zk, spec_at(zk_root))
    other = copy.deepcopy(MINIMAL)
    other["metadata"].update(name="other", namespace="prod")
    other["spec"]["zookeeper"]["root"] = zk_root
    result = ensure_cluster(zk, parse(other))
    assert isinstance(result, Refused)
    assert "a different cluster, 'prod/demo', is at" in result.reason


def test_a_known_cluster_is_never_created_again_where_the_spec_now_points(zk, zk_root):
    """A resource whose cluster exists (its key in the status) and whose spec.zookeeper
    moved to a root without it: refused, nothing written (was: a second, empty cluster)."""
    first = ensure_cluster(zk, spec_at(zk_root))
    assert isinstance(first, Created)
    moved = spec_at(zk_root + "-moved")
    refused = ensure_cluster(zk, moved, known_key=first.key)
    assert isinstance(refused, Refused)
    assert first.key in refused.reason and "spec.zookeeper changed" in refused.reason
    assert zk.exists(zk_root + "-moved") is None
    assert ensure_cluster(zk, spec_at(zk_root), known_key=first.key) == Created(first.key, True, 4)


def test_a_cluster_created_anew_under_the_same_name_is_not_adopted(zk, zk_root):
    first = ensure_cluster(zk, spec_at(zk_root))
    refused = ensure_cluster(zk, spec_at(zk_root), known_key="another-key")
    assert isinstance(refused, Refused) and "created anew" in refused.reason
    assert key_fingerprint(admin.read_params(zk, zk_root).key) == first.key
