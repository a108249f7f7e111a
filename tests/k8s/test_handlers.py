"""The kopf handlers in-process against the strict API server, on a real ZooKeeper."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from operator_harness import (
    NS,
    OPERATOR_USER,
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
from waltz_client.cluster.metadata import key_fingerprint


@pytest.mark.asyncio
async def test_create_applies_the_objects_creates_the_cluster_and_reports(zookeeper, zk, zk_root):
    async with kubernetes_api() as api:
        created = create_cluster_object(api, cluster_doc(zookeeper, zk_root))
        async with running_operator(api, NS):
            sts = await eventually(
                lambda: obj(api, "apps/v1/statefulsets", NS, "demo-storage"), what="StatefulSet"
            )
            assert sts["spec"]["replicas"] == 3
            assert sts["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
            await eventually(lambda: obj(api, "apps/v1/deployments", NS, "demo-server"))
            assert obj(api, "v1/services", NS, "demo")
            body = await until_created(api)
        # kopf and the operator's client both authenticated, as the operator's account
        assert {r.user for r in api.requests} == {OPERATOR_USER}
        params = admin.read_params(zk, zk_root)
        assert params.name == f"{NS}/demo" and params.num_partitions == 4
        assert body["status"]["clusterKey"] == key_fingerprint(params.key)
        assert str(params.key) not in json.dumps([body, api.events()])  # a secret
        assert condition(body, "Ready")["status"] == "False"  # no pods run here


async def until_created(api) -> dict:
    """The WaltzCluster once its status says the cluster was created."""
    return await eventually(
        lambda: (
            (b := obj(api, WZ, NS, "demo"))
            and condition(b, "ClusterCreated").get("status") == "True"
            and b
        ),
        what="ClusterCreated",
    )


def status_patches(api) -> list:
    """(subresource, body) of every PATCH the operator sent to a WaltzCluster."""
    return [
        (request.path.endswith("/status"), request.body)
        for request in list(api.requests)
        if request.method == "PATCH" and "/waltzclusters/" in request.path
    ]


@pytest.mark.asyncio
async def test_status_goes_through_the_subresource_and_replays_change_nothing(
    zookeeper, zk, zk_root
):
    async with kubernetes_api() as api:
        create_cluster_object(api, cluster_doc(zookeeper, zk_root))
        async with running_operator(api, NS, interval=0.2):
            await until_created(api)
            # The monitor's first views settle (slower on a busy machine): wait until the
            # status has not changed for 5 s, then expect no more patches.
            settled, quiet_since = len(status_patches(api)), time.monotonic()
            deadline = time.monotonic() + 90
            while time.monotonic() - quiet_since < 5.0 and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                if len(status_patches(api)) != settled:
                    settled, quiet_since = len(status_patches(api)), time.monotonic()
            body = obj(api, WZ, NS, "demo")
            await asyncio.sleep(3.0)  # ~15 timer reconciles of an unchanged world
            assert len(status_patches(api)) == settled
            assert obj(api, WZ, NS, "demo")["status"] == body["status"]
        for to_status, data in status_patches(api):
            # kopf's own patches (annotations, finalizer) never carry status; ours only do
            assert to_status == (isinstance(data, dict) and "status" in data), data
        assert admin.read_params(zk, zk_root).name == f"{NS}/demo"  # created once
        assert len(events(api, "ClusterCreated")) == 1


@pytest.mark.asyncio
async def test_an_update_rolls_out_and_a_pause_holds_every_change(zookeeper, zk, zk_root):
    async with kubernetes_api() as api:
        create_cluster_object(api, cluster_doc(zookeeper, zk_root))
        async with running_operator(api, NS):

            def image(kind: str, name: str) -> str:
                found = obj(api, kind, NS, name)
                return found["spec"]["template"]["spec"]["containers"][0]["image"] if found else ""

            await eventually(lambda: image("apps/v1/deployments", "demo-server"))
            assert (await patch_cluster(api, {"spec": {"image": {"tag": "0.2.0"}}}))["metadata"][
                "generation"
            ] == 2
            await eventually(
                lambda: image("apps/v1/statefulsets", "demo-storage").endswith(":0.2.0")
            )
            # No storage pod runs 0.2.0 here (nothing plays them): the servers keep their
            # image, and say why (test_upgrade_roll.py follows a whole upgrade).
            await eventually(
                lambda: (
                    "upgrading: servers wait for the storage nodes to run"
                    in condition(obj(api, WZ, NS, "demo"), "Progressing").get("message", "")
                ),
                what="the servers held",
            )
            assert image("apps/v1/deployments", "demo-server").endswith(":0.1.0")

            await patch_cluster(
                api,
                {
                    "metadata": {"annotations": {"waltz.io/paused": "true"}},
                    "spec": {"image": {"tag": "0.3.0"}},
                },
            )
            await eventually(
                lambda: (
                    condition(obj(api, WZ, NS, "demo"), "Progressing").get("reason") == "Paused"
                ),
                what="Progressing=Paused",
            )
            await asyncio.sleep(2.0)  # several reconciles: nothing may change
            assert image("apps/v1/statefulsets", "demo-storage").endswith(":0.2.0")

            body = await patch_cluster(
                api, {"metadata": {"annotations": {"waltz.io/paused": "false"}}}
            )
            assert body["metadata"]["generation"] == 3  # an annotation is not the spec
            await eventually(
                lambda: image("apps/v1/statefulsets", "demo-storage").endswith(":0.3.0")
            )


@pytest.mark.asyncio
async def test_an_unsafe_scale_down_is_refused_with_a_condition_and_an_event(
    zookeeper, zk, zk_root
):
    doc = cluster_doc(zookeeper, zk_root, replicasPerPartition=1, storage={"replicas": 2})
    async with kubernetes_api() as api:
        create_cluster_object(api, doc)
        async with running_operator(api, NS):
            await until_created(api)
            await patch_cluster(api, {"spec": {"storage": {"replicas": 1}}})
            body = await eventually(
                lambda: (
                    (b := obj(api, WZ, NS, "demo"))
                    and condition(b, "Degraded").get("status") == "True"
                    and b
                ),
                what="Degraded",
            )
            assert "single replica" in condition(body, "Degraded")["message"]
            await eventually(lambda: events(api, "Refused"), what="a Warning event")
            await asyncio.sleep(1.0)
            assert obj(api, "apps/v1/statefulsets", NS, "demo-storage")["spec"]["replicas"] == 2
            assert len(events(api, "Refused")) == 1  # not one per reconcile
        assert sorted(admin.read_assignment(zk, zk_root)[0].storages) == [
            f"demo-storage-{i}.demo-storage.{NS}.svc:55280" for i in range(2)
        ]


@pytest.mark.asyncio
async def test_another_cluster_at_the_root_is_refused_and_left_alone(zookeeper, zk, zk_root):
    admin.create_cluster(zk, zk_root, "someone-else", 2, 1, ["10.0.0.1:55280"])
    async with kubernetes_api() as api:
        create_cluster_object(api, cluster_doc(zookeeper, zk_root))
        async with running_operator(api, NS):
            body = await eventually(
                lambda: (
                    (b := obj(api, WZ, NS, "demo"))
                    and condition(b, "ClusterCreated").get("reason") == "Refused"
                    and b
                ),
            )
            assert "'someone-else'" in condition(body, "ClusterCreated")["message"]
            assert condition(body, "Degraded")["status"] == "True"
    assert admin.read_params(zk, zk_root).name == "someone-else"


@pytest.mark.asyncio
@pytest.mark.parametrize("retain", [True, False], ids=["retain", "delete-everything"])
async def test_delete_runs_the_finalizer(zookeeper, zk, zk_root, retain):
    doc = cluster_doc(zookeeper, zk_root, retainVolumes=retain)
    async with kubernetes_api() as api:
        create_cluster_object(api, doc)
        async with running_operator(api, NS) as config:
            body = await until_created(api)
            assert "waltz.io/finalizer" in body["metadata"]["finalizers"]
            response = await api.request(
                "DELETE", f"/apis/waltz.io/v1alpha1/namespaces/{NS}/waltzclusters/demo"
            )
            assert response.status == 200, response.body
            # The finalizer holds it: deleted once the operator has cleaned up.
            assert response.body["metadata"]["deletionTimestamp"]
            await eventually(
                lambda: obj(api, WZ, NS, "demo") is None, 120, what="the finalizer to go"
            )
            assert config.reconciler is not None and not config.reconciler.monitors
        if retain:
            assert zk.exists(zk_root + "/cluster") and events(api, "Retained")
        else:
            assert not zk.exists(zk_root) and events(api, "Deleted")
            assert obj(api, "apps/v1/statefulsets", NS, "demo-storage") is None
        # Whatever the operator left, the garbage collector takes: it owns them all.
        await api.gc_idle()
        for resource in ("apps/v1/statefulsets", "apps/v1/deployments", "v1/services"):
            assert api.list(resource, NS) == [], resource


def play_pod(api, index: int, ready: bool, revision: str = "rev-1") -> None:
    """A storage pod as the StatefulSet controller and the kubelet would leave it (on
    no node: deleted at once, as the operator's roll deletes it)."""
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"demo-storage-{index}",
                "namespace": NS,
                "labels": {
                    "app.kubernetes.io/instance": "demo",
                    "app.kubernetes.io/component": "storage",
                    "controller-revision-hash": revision,
                },
            },
            "spec": {"containers": [{"name": "storage", "image": "waltz-storage:test"}]},
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        },
        manager="kubelet",
    )


@pytest.mark.asyncio
async def test_scaling_up_adds_ready_nodes_then_moves_replicas_to_them(zookeeper, zk, zk_root):
    async with kubernetes_api() as api:
        create_cluster_object(api, cluster_doc(zookeeper, zk_root))
        for i in range(3):
            play_pod(api, i, ready=True)
        async with running_operator(api, NS):
            await until_created(api)
            await patch_cluster(api, {"spec": {"storage": {"replicas": 4}}})
            await eventually(
                lambda: (
                    obj(api, "apps/v1/statefulsets", NS, "demo-storage")["spec"]["replicas"] == 4
                )
            )
            new = f"demo-storage-3.demo-storage.{NS}.svc:55280"
            await eventually(
                lambda: (
                    "waiting for " + new
                    in condition(obj(api, WZ, NS, "demo"), "Progressing").get("message", "")
                ),
                what="waiting for the new pod",
            )
            assert new not in admin.read_assignment(zk, zk_root)[0].storages  # pods first
            play_pod(api, 3, ready=True)
            await eventually(
                lambda: admin.read_assignment(zk, zk_root)[0].storages.get(new),
                what="replicas assigned to the new node",
            )
            body = await eventually(
                lambda: (
                    (b := obj(api, WZ, NS, "demo"))
                    and "balancing replicas" in condition(b, "Progressing").get("message", "")
                    and b
                )
            )
            assert condition(body, "Progressing")["status"] == "True"
            # No server reports the copies in a session here, so nothing is taken off the
            # old nodes: every partition keeps its three original replicas.
            await asyncio.sleep(1.0)
            assignment = admin.read_assignment(zk, zk_root)[0]
            assert all(len(assignment.replicas_of(p)) >= 3 for p in range(4))


@pytest.mark.asyncio
async def test_a_roll_restarts_unready_pods_first_and_waits_for_quorum_evidence(
    zookeeper, zk, zk_root
):
    async with kubernetes_api() as api:
        create_cluster_object(api, cluster_doc(zookeeper, zk_root))
        play_pod(api, 0, ready=True)
        play_pod(api, 1, ready=False)
        play_pod(api, 2, ready=True)
        async with running_operator(api, NS):
            await until_created(api)
            # The StatefulSet controller would report a new template revision:
            await eventually(lambda: obj(api, "apps/v1/statefulsets", NS, "demo-storage"))
            response = await api.request(
                "PATCH",
                f"/apis/apps/v1/namespaces/{NS}/statefulsets/demo-storage/status",
                {"status": {"updateRevision": "rev-2"}},
                content_type="application/merge-patch+json",
            )
            assert response.status == 200, response.body
            await eventually(
                lambda: obj(api, "v1/pods", NS, "demo-storage-1") is None,
                what="the unready pod restarted",
            )
            body = await eventually(
                lambda: (
                    (b := obj(api, WZ, NS, "demo"))
                    and "rolling storage" in condition(b, "Progressing").get("message", "")
                    and b
                )
            )
            # The ready pods hold partitions whose quorum no server has shown: they stay.
            await asyncio.sleep(1.5)
            assert obj(api, "v1/pods", NS, "demo-storage-0") is not None
            assert obj(api, "v1/pods", NS, "demo-storage-2") is not None
            assert "restarted demo-storage-1" in condition(body, "Progressing")["message"]
            message = condition(obj(api, WZ, NS, "demo"), "Progressing")["message"]
            assert "rolling storage: waiting" in message, message


@pytest.mark.asyncio
async def test_an_operator_restarted_before_it_wrote_status_adopts_its_cluster(
    zookeeper, zk, zk_root
):
    async with kubernetes_api() as api:
        create_cluster_object(api, cluster_doc(zookeeper, zk_root))
        async with running_operator(api, NS):
            key = (await until_created(api))["status"]["clusterKey"]
        # The first operator died after CreateCluster but before its status landed:
        api.update_status(WZ, NS, "demo", None)
        created_events = len(events(api, "ClusterCreated"))
        async with running_operator(api, NS):
            body = await until_created(api)
        assert body["status"]["clusterKey"] == key
        assert key == key_fingerprint(admin.read_params(zk, zk_root).key)
        assert len(events(api, "ClusterCreated")) == created_events  # adopted, not created
