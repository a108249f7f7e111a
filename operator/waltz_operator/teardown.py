"""Deleting a WaltzCluster: what goes, what stays, and a deletion that never hangs.

With ``retainVolumes: true`` (the default) nothing is deleted here: the owned objects
are garbage-collected, the volumes and the ZooKeeper metadata stay. Otherwise the
servers and storage pods go first (a server must not outlive its metadata), then the
cluster's ZooKeeper subtree, then the volumes. After ``timeout`` seconds it gives up and
says what may be left behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from kazoo.client import KazooClient

from waltz_client.cluster import admin
from waltz_client.cluster.zk import ClusterError
from waltz_client.wire.errors import describe

from .bootstrap import cluster_name
from .events import Event
from .kube import KubeApi
from .spec import ClusterSpec


async def tear_down(
    kube: KubeApi,
    zookeeper: Callable[[], Awaitable[KazooClient]],
    spec: ClusterSpec,
    timeout: float,
) -> list[Event]:
    """Never raises; the Events to post."""
    if spec.retain_volumes:
        return [
            Event(
                "Normal",
                "Retained",
                f"volumes and the ZooKeeper metadata at {spec.zk_root} are kept (retainVolumes)",
            )
        ]
    try:
        await asyncio.wait_for(_delete_everything(kube, zookeeper, spec), timeout)
    except Exception as e:  # a timeout, the API, ZooKeeper: give up, say so
        why = f"timed out after {timeout:g} s" if isinstance(e, TimeoutError) else describe(e)
        return [
            Event(
                "Warning",
                "DeleteIncomplete",
                f"deletion gave up ({why}); check for leftover volumes labelled "
                f"app.kubernetes.io/instance={spec.name} and the ZooKeeper node "
                f"{spec.zk_root}",
            )
        ]
    return [
        Event(
            "Normal",
            "Deleted",
            f"pods, volumes and the ZooKeeper metadata at {spec.zk_root} deleted",
        )
    ]


async def _delete_everything(
    kube: KubeApi, zookeeper: Callable[[], Awaitable[KazooClient]], spec: ClusterSpec
) -> None:
    ns = spec.namespace
    await kube.delete("Deployment", ns, f"{spec.name}-server")
    await kube.delete("StatefulSet", ns, spec.storage_service)
    while await kube.list("Pod", ns, {"app.kubernetes.io/instance": spec.name}):
        await asyncio.sleep(1.0)  # servers must be gone before their metadata goes
    zk = await zookeeper()
    try:
        await asyncio.to_thread(admin.delete_cluster, zk, spec.zk_root, cluster_name(spec), True)
    except ClusterError as e:
        if "no cluster" not in str(e).lower():
            raise
    for claim in await kube.list(
        "PersistentVolumeClaim", ns, {"app.kubernetes.io/instance": spec.name}
    ):
        await kube.delete("PersistentVolumeClaim", ns, claim["metadata"]["name"])
