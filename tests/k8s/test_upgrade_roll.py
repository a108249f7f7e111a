"""An image upgrade on the strict API server (strict_api/), the operator in-process: the
storage pods are rolled one by one, and the server Deployment keeps the old server image
until the last storage pod runs the new one, ready (upgrade_order.py). The operator is
restarted half-way: it goes on from what is live.

Played here: the StatefulSet controller and the kubelet of the storage pods (a pod
deleted is made again from the StatefulSet's template on its revision, and ready a
moment later), and one server, as the operator's monitor sees servers: registered in
ZooKeeper, owning every partition, its ``/metrics`` naming in each partition's running
store session the storage nodes whose pods are ready. That is the evidence of quorum
the operator's roll waits for before it restarts the next storage pod."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from kubelet import template_hash
from operator_harness import (
    NS,
    WZ,
    cluster_doc,
    condition,
    create_cluster_object,
    events,
    eventually,
    kubernetes_api,
    obj,
    patch_cluster,
    running_operator,
)

from waltz_client.cluster import admin
from waltz_client.cluster.metadata import Ownership, ServerRegistration
from waltz_client.cluster.paths import ClusterPaths

STS = "apps/v1/statefulsets"
DEPLOYMENT = "apps/v1/deployments"
REGISTRY = "ghcr.io/waltz-io"
OLD_STORAGE, NEW_STORAGE = f"{REGISTRY}/waltz-storage:0.1.0", f"{REGISTRY}/waltz-storage:0.2.0"
OLD_SERVER, NEW_SERVER = f"{REGISTRY}/waltz-server:0.1.0", f"{REGISTRY}/waltz-server:0.2.0"
STORAGE_PODS = 3
READY_AFTER = 1.0  # seconds a storage pod takes to be ready once made


def _ready(pod: dict[str, Any] | None) -> bool:
    return pod is not None and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _status(ready: bool) -> dict[str, Any]:
    flag = "True" if ready else "False"
    return {
        "phase": "Running",
        "conditions": [
            {"type": "Ready", "status": flag},
            {"type": "ContainersReady", "status": flag},
        ],
    }


@dataclass(frozen=True)
class Snapshot:
    """One look at the world: the Deployment's server image and replicas, and each
    storage pod's image and readiness (None: no pod)."""

    server_image: str | None
    server_replicas: int | None
    pods: tuple[tuple[str, bool] | None, ...]

    @property
    def storage_upgraded(self) -> bool:
        return all(p is not None and p == (NEW_STORAGE, True) for p in self.pods)

    @property
    def storage_down(self) -> int:
        return sum(1 for p in self.pods if p is None or not p[1])


class StorageController:
    """The StatefulSet controller and the kubelet, for the storage pods: pods made from
    the template (labelled with its revision, ``controller-revision-hash``, which the
    StatefulSet's status reports as ``updateRevision``), ready ``READY_AFTER`` seconds
    after they are made; ``OnDelete``: a pod is replaced only once the operator deletes
    it. Every pass records a ``Snapshot``."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.made: list[tuple[str, str]] = []  # (pod, image), in order
        self.snapshots: list[Snapshot] = []
        self._born: dict[str, float] = {}

    async def run(self) -> None:
        while True:
            self.step()
            await asyncio.sleep(0.1)

    def step(self) -> None:
        sts = obj(self.api, STS, NS, "demo-storage")
        if sts is not None:
            self._control(sts)
        self.snapshots.append(self.snapshot())

    def _control(self, sts: dict[str, Any]) -> None:
        template = sts["spec"]["template"]
        revision = f"demo-storage-{template_hash(template)}"
        replicas = int(sts["spec"]["replicas"])
        if (sts.get("status") or {}).get("updateRevision") != revision:
            self.api.patch(
                STS,
                NS,
                "demo-storage",
                {"status": {"replicas": replicas, "updateRevision": revision}},
                subresource="status",
                manager="kube-controller-manager",
            )
        for i in range(replicas):
            name = f"demo-storage-{i}"
            pod = obj(self.api, "v1/pods", NS, name)
            if pod is None:
                self._make(sts, name, revision)
            elif not _ready(pod) and time.monotonic() - self._born[name] >= READY_AFTER:
                self.api.update_status("v1/pods", NS, name, _status(True), manager="kubelet")

    def _make(self, sts: dict[str, Any], name: str, revision: str) -> None:
        template = sts["spec"]["template"]
        image = template["spec"]["containers"][0]["image"]
        self.api.put(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": NS,
                    "labels": {
                        **template["metadata"]["labels"],
                        "controller-revision-hash": revision,
                    },
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "StatefulSet",
                            "name": "demo-storage",
                            "uid": sts["metadata"]["uid"],
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                # On no node: a deletion takes it at once.
                "spec": {"containers": [{"name": "storage", "image": image}]},
                "status": _status(False),
            },
            manager="kube-controller-manager",
        )
        self._born[name] = time.monotonic()
        self.made.append((name, image))
        claim = f"data-{name}"
        if obj(self.api, "v1/persistentvolumeclaims", NS, claim) is None:
            volume = sts["spec"]["volumeClaimTemplates"][0]
            size = volume["spec"]["resources"]["requests"]["storage"]
            self.api.put(
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {
                        "name": claim,
                        "namespace": NS,
                        "labels": volume["metadata"]["labels"],
                    },
                    "spec": volume["spec"],
                    "status": {"phase": "Bound", "capacity": {"storage": size}},
                },
                manager="kube-controller-manager",
            )

    def snapshot(self) -> Snapshot:
        deployment = obj(self.api, DEPLOYMENT, NS, "demo-server")
        pods = []
        for i in range(STORAGE_PODS):
            pod = obj(self.api, "v1/pods", NS, f"demo-storage-{i}")
            pods.append(
                (pod["spec"]["containers"][0]["image"], _ready(pod)) if pod is not None else None
            )
        return Snapshot(
            deployment["spec"]["template"]["spec"]["containers"][0]["image"]
            if deployment
            else None,
            deployment["spec"]["replicas"] if deployment else None,
            tuple(pods),
        )


@contextlib.asynccontextmanager
async def storage_controller(api: Any) -> AsyncIterator[StorageController]:
    controller = StorageController(api)
    task = asyncio.create_task(controller.run())
    try:
        yield controller
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def quorum_evidence(api: Any, zk: Any, zk_root: str) -> AsyncIterator[None]:
    """One server, as the monitor sees it: registered, owning every partition at
    generation 1, reporting in each partition's session the replicas on ready pods."""
    assignment, _ = admin.read_assignment(zk, zk_root)
    partitions = admin.read_params(zk, zk_root).num_partitions
    replicas = {p: assignment.replicas_of(p) for p in range(partitions)}

    def up(address: str) -> bool:
        pod = obj(api, "v1/pods", NS, address.split(".", 1)[0])
        return _ready(pod) and not pod["metadata"].get("deletionTimestamp")

    async def metrics(_: web.Request) -> web.Response:
        lines = [
            "# TYPE waltz_server_partition_generation gauge",
            *(f'waltz_server_partition_generation{{partition="{p}"}} 1' for p in replicas),
            "# TYPE waltz_server_partition_replica_in_session gauge",
            *(
                f'waltz_server_partition_replica_in_session{{partition="{p}",replica="{a}"}} '
                f"{1 if up(a) else 0}"
                for p, addresses in replicas.items()
                for a in addresses
            ),
        ]
        return web.Response(text="\n".join(lines) + "\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    http_port = runner.addresses[0][1]
    paths = ClusterPaths.of(zk_root)
    zk.create(
        paths.server("played-server"),
        ServerRegistration("played-server", "127.0.0.1", 1, http_port).encode(),
        ephemeral=True,
    )
    zk.set(paths.ownership, Ownership({p: ("played-server", 1) for p in replicas}).encode())
    try:
        yield
    finally:
        zk.delete(paths.server("played-server"))
        await runner.cleanup()


def progressing(api: Any) -> str:
    return str(condition(obj(api, WZ, NS, "demo"), "Progressing").get("message", ""))


@pytest.mark.asyncio
async def test_an_image_upgrade_rolls_the_storage_pods_then_the_servers(zookeeper, zk, zk_root):
    async with kubernetes_api() as api, storage_controller(api) as storage:
        create_cluster_object(api, cluster_doc(zookeeper, zk_root))
        async with running_operator(api, NS):
            await eventually(
                lambda: (
                    condition(obj(api, WZ, NS, "demo"), "ClusterCreated").get("status") == "True"
                ),
                what="ClusterCreated",
            )
            before = await eventually(
                lambda: (
                    (s := storage.snapshot()).server_image == OLD_SERVER
                    and all(p == (OLD_STORAGE, True) for p in s.pods)
                    and s
                ),
                what="the cluster running 0.1.0",
            )
            assert before.server_replicas == 2
            async with quorum_evidence(api, zk, zk_root):
                upgrade_from = len(storage.snapshots)
                await patch_cluster(
                    api, {"spec": {"image": {"tag": "0.2.0"}, "server": {"replicas": 3}}}
                )
                # The servers wait; what else changed in their Deployment is applied.
                await eventually(
                    lambda: (
                        f"upgrading: servers wait for the storage nodes to run {NEW_STORAGE}"
                        in progressing(api)
                    ),
                    what="the servers held",
                )
                held = await eventually(
                    lambda: (s := storage.snapshot()).server_replicas == 3 and s,
                    what="the new server replicas",
                )
                assert held.server_image == OLD_SERVER
                await eventually(
                    lambda: storage.snapshot().pods.count((NEW_STORAGE, True)) >= 1,
                    what="a first storage pod upgraded",
                )
        # A new operator, half-way: it decides from what is live, and holds as well.
        assert storage.snapshot().server_image == OLD_SERVER
        async with running_operator(api, NS), quorum_evidence(api, zk, zk_root):
            await eventually(
                lambda: storage.snapshot().server_image == NEW_SERVER,
                120,
                what="the servers upgraded",
            )
            await eventually(lambda: "upgrading" not in progressing(api), what="Progressing")
            (released,) = await eventually(
                lambda: events(api, "UpgradingServers"), what="the UpgradingServers Event"
            )
            assert released["type"] == "Normal"
            assert released["message"] == (
                f"storage nodes upgraded; rolling the servers to {NEW_SERVER}"
            )

    during = storage.snapshots[upgrade_from:]
    # The storage pods, one at a time, from the highest ordinal; each once.
    assert [m for m in storage.made if m[1] == NEW_STORAGE] == [
        (f"demo-storage-{i}", NEW_STORAGE) for i in (2, 1, 0)
    ]
    assert max(s.storage_down for s in during) == 1
    # The servers' image changed once, after the last storage pod ran the new one, ready.
    images = [s.server_image for s in during]
    switch = images.index(NEW_SERVER)
    assert set(images[:switch]) == {OLD_SERVER} and set(images[switch:]) == {NEW_SERVER}
    assert all(s.storage_upgraded for s in during[switch:])
    # Every storage pod on the new image, the last one not ready yet: still held.
    assert any(
        all(p is not None and p[0] == NEW_STORAGE for p in s.pods) and not s.storage_upgraded
        for s in during[:switch]
    )
