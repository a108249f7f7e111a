"""CreateCluster for a WaltzCluster, idempotent across operator restarts and re-deliveries.

The cluster's name in ZooKeeper is ``<namespace>/<name>``, its root the spec's. A cluster
already at the root with the same name, partition count and replicas per partition is
adopted, whatever its storage nodes now are (the operator changes those when it scales);
a different one is refused, with what differs, and nothing is written. CreateCluster
itself is one ZooKeeper transaction, so an operator that dies midway leaves either
nothing or the whole cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

from kazoo.client import KazooClient

from waltz_client.cluster.admin import create_cluster, read_params
from waltz_client.cluster.paths import ClusterPaths

from .spec import ClusterSpec


@dataclass(frozen=True)
class Created:
    key: str
    adopted: bool  # it existed already


@dataclass(frozen=True)
class Refused:
    reason: str


def cluster_name(spec: ClusterSpec) -> str:
    return f"{spec.namespace}/{spec.name}"


def ensure_cluster(zk: KazooClient, spec: ClusterSpec) -> Created | Refused:
    """Create the cluster (blocking ZooKeeper calls: run it off the event loop)."""
    paths = ClusterPaths.of(spec.zk_root)
    if zk.exists(paths.cluster):
        existing = read_params(zk, spec.zk_root)
        diffs = [
            f"{label} is {have}, the resource wants {want}"
            for label, have, want in (
                ("its name", existing.name, cluster_name(spec)),
                ("partitions", existing.num_partitions, spec.partitions),
                ("replicasPerPartition", existing.num_replicas, spec.replicas_per_partition),
            )
            if have != want
        ]
        if diffs:
            return Refused(
                f"a different cluster is at {paths.root} in ZooKeeper: {'; '.join(diffs)}. "
                f"Nothing was changed; use another spec.zookeeper.root, or change the spec "
                f"back (changing partitions or replicasPerPartition is not supported yet)"
            )
        return Created(str(existing.key), adopted=True)
    result = create_cluster(
        zk,
        spec.zk_root,
        cluster_name(spec),
        spec.partitions,
        spec.replicas_per_partition,
        spec.storage_addresses(),
    )
    return Created(str(result.params.key), adopted=not result.created)
