"""CreateCluster for a WaltzCluster, idempotent across operator restarts and re-deliveries.

The cluster's name in ZooKeeper is ``<namespace>/<name>``, its root the spec's. A cluster
already at the root with the same name and replicas per partition is adopted, whatever its
storage nodes and partition count now are (the operator changes the storage nodes when it
scales, and grows the partitions to the spec's: reconcile_decisions.py decides that from
the count adopted here); one with another name is refused and nothing is written; this
resource's own cluster with another replica count is reported as an unsupported change.
CreateCluster itself is one ZooKeeper transaction, so an operator that dies midway leaves
either nothing or the whole cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

from kazoo.client import KazooClient

from waltz_client.cluster.admin import create_cluster, read_params
from waltz_client.cluster.metadata import key_fingerprint
from waltz_client.cluster.paths import ClusterPaths

from .spec import ClusterSpec


@dataclass(frozen=True)
class Created:
    key: str  # the cluster key's fingerprint: the key itself is a secret, never shown
    adopted: bool  # it existed already
    partitions: int  # the cluster's partition count, as found (or created)


@dataclass(frozen=True)
class Refused:
    reason: str


def cluster_name(spec: ClusterSpec) -> str:
    return f"{spec.namespace}/{spec.name}"


@dataclass(frozen=True)
class Unsupported:
    """This resource's cluster exists, but the spec asks for a change the log cannot make
    (its replicas per partition)."""

    key: str
    reason: str


def ensure_cluster(
    zk: KazooClient, spec: ClusterSpec, known_key: str | None = None
) -> Created | Refused | Unsupported:
    """Create the cluster, or adopt it (blocking ZooKeeper calls: run it off the loop).

    ``known_key`` is the key this resource's cluster was created with (its status), if it
    was: such a resource never creates another cluster. Finding no cluster, or another,
    where its spec now points means the spec moved (a changed ``zookeeper.connect`` or
    ``root``), and a new, empty cluster there would strand every committed transaction."""
    paths = ClusterPaths.of(spec.zk_root)
    if zk.exists(paths.cluster):
        existing = read_params(zk, spec.zk_root)
        if existing.name != cluster_name(spec):
            return Refused(
                f"a different cluster, {existing.name!r}, is at {paths.root} in ZooKeeper; "
                f"nothing was changed: give this resource another spec.zookeeper.root"
            )
        if known_key and known_key not in (key_fingerprint(existing.key), str(existing.key)):
            return Refused(
                f"the cluster at {paths.root} on {spec.zookeeper} has key "
                f"{key_fingerprint(existing.key)}, "
                f"but this resource's cluster has key {known_key}: it was created anew "
                f"under the same name; nothing was changed"
            )
        if existing.num_replicas != spec.replicas_per_partition:
            return Unsupported(
                key_fingerprint(existing.key),
                f"the cluster's replicasPerPartition is {existing.num_replicas}, the resource "
                f"asks for {spec.replicas_per_partition}: a partition keeps its replica count "
                f"for its life, so this change is not supported; the cluster keeps running "
                f"as it is (set the spec back to clear this)",
            )
        return Created(key_fingerprint(existing.key), True, existing.num_partitions)
    if known_key:
        return Refused(
            f"this resource's cluster (key {known_key}) is not at {paths.root} on "
            f"{spec.zookeeper}: spec.zookeeper changed since it was created; no new, empty "
            f"cluster was created. Set spec.zookeeper back, or move the metadata first "
            f"(docs/operator.md)"
        )
    result = create_cluster(
        zk,
        spec.zk_root,
        cluster_name(spec),
        spec.partitions,
        spec.replicas_per_partition,
        spec.storage_addresses(),
    )
    return Created(
        key_fingerprint(result.params.key), not result.created, result.params.num_partitions
    )
