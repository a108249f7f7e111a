"""Deleting a WaltzCluster: what goes, what stays, and a deletion that never hangs.

With ``retainVolumes: true`` (the default) nothing is deleted here: the owned objects
are garbage-collected, the volumes and the ZooKeeper metadata stay, and so does the
ZooKeeper credential the operator made (the metadata's ACL names it). Otherwise the
servers and storage pods go first (a server must not outlive its metadata), then the
cluster's ZooKeeper subtree, then the volumes and that credential. After ``timeout``
seconds it gives up and says what may be left behind. Only the cluster's own pods and
volumes count (``own_pods``, ``own_claims``): others in the namespace may carry the same
``instance`` label.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kazoo.client import KazooClient

from waltz_client.cluster import admin
from waltz_client.cluster.errors import ClusterError
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.runtime.tasks import wait_for
from waltz_client.wire.errors import describe

from .bootstrap import cluster_name
from .desired import MANAGED_BY
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
        await wait_for(_delete_everything(kube, zookeeper, spec), timeout)
    except Exception as e:  # a timeout, the API, ZooKeeper: give up, say so
        why = f"timed out after {timeout:g} s" if isinstance(e, TimeoutError) else describe(e)
        return [
            Event(
                "Warning",
                "DeleteIncomplete",
                f"deletion gave up ({why}); check for leftover volumes named "
                f"data-{spec.storage_service}-<ordinal> and the ZooKeeper node "
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


def _labelled(spec: ClusterSpec, obj: Mapping[str, Any]) -> bool:
    found = (obj.get("metadata") or {}).get("labels") or {}
    return (
        found.get("app.kubernetes.io/instance") == spec.name
        and found.get("app.kubernetes.io/managed-by") == MANAGED_BY
        and found.get("app.kubernetes.io/component") in ("storage", "server")
    )


def own_pods(
    spec: ClusterSpec, pods: list[Mapping[str, Any]], orphans: bool = False
) -> list[Mapping[str, Any]]:
    """The cluster's pods among ``pods``: its labels, and a controller that is its storage
    StatefulSet or a ReplicaSet of its server Deployment (with ``orphans``, also one with
    no controller: its StatefulSet was deleted leaving it). Pods that merely share the
    ``app.kubernetes.io/instance`` label (the chart's operator and ZooKeeper) are not."""
    server_sets = re.compile(rf"^{re.escape(spec.name)}-server-[a-z0-9]+$")

    def controlled(pod: Mapping[str, Any]) -> bool:
        refs = (pod.get("metadata") or {}).get("ownerReferences") or []
        if orphans and not any(ref.get("controller") for ref in refs):
            return True
        for ref in refs:
            if not ref.get("controller"):
                continue
            if ref.get("kind") == "StatefulSet" and ref.get("name") == spec.storage_service:
                return True
            if ref.get("kind") == "ReplicaSet" and server_sets.match(ref.get("name", "")):
                return True
        return False

    return [p for p in pods if _labelled(spec, p) and controlled(p)]


def own_claims(spec: ClusterSpec, claims: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The storage pods' volumes among ``claims``: the StatefulSet controller names them
    ``data-<pod>``, and they carry the storage labels."""
    names = re.compile(rf"^data-{re.escape(spec.storage_service)}-[0-9]+$")
    return [
        c
        for c in claims
        if names.match((c.get("metadata") or {}).get("name", "")) and _labelled(spec, c)
    ]


async def _delete_everything(
    kube: KubeApi, zookeeper: Callable[[], Awaitable[KazooClient]], spec: ClusterSpec
) -> None:
    ns = spec.namespace
    instance = {"app.kubernetes.io/instance": spec.name}
    await kube.delete("Deployment", ns, f"{spec.name}-server")
    await kube.delete("StatefulSet", ns, spec.storage_service)
    while own_pods(spec, await kube.list("Pod", ns, instance)):
        await asyncio.sleep(1.0)  # servers must be gone before their metadata goes
    zk = await zookeeper()
    try:
        await asyncio.to_thread(admin.delete_cluster, zk, spec.zk_root, cluster_name(spec), True)
    except ClusterError:
        # Gone already: an earlier run of this deletion (kopf may run it again) got here.
        # Only a cluster whose node is still there failed to be deleted.
        if await asyncio.to_thread(zk.exists, ClusterPaths.of(spec.zk_root).cluster):
            raise
    for claim in own_claims(spec, await kube.list("PersistentVolumeClaim", ns, instance)):
        await kube.delete("PersistentVolumeClaim", ns, claim["metadata"]["name"])
    if spec.zk_credential_generated:  # it outlives the resource only with the metadata
        await kube.delete("Secret", ns, spec.zk_credential_secret)
