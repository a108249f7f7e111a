"""Day two on the strict API server (strict_api/): what a user does to a running
WaltzCluster, held to kube-apiserver's rules. Each test here failed on the operator as
it was before these fixes (issue 38): the operator sent no credentials, a grown volume
made every later reconcile fail, failures were invisible, deletion took ZooKeeper's
volume, placement ignored zones, and every object was re-applied every reconcile."""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import socket
import subprocess
import sys

import aiohttp
import pytest
from operator_harness import (
    NS,
    OPERATOR_TOKEN,
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
from strict_api import make_pki, write_kubeconfig

from waltz_client.cluster import admin
from waltz_client.cluster.replace_storage import read_replacements, replace_storage_step
from waltz_operator.kube import Connection, KubeApi, connection_from_environment
from waltz_operator.leader import LeaderElector
from waltz_operator.spec import parse

STS = "apps/v1/statefulsets"
PVC = "v1/persistentvolumeclaims"


async def created(api) -> dict:
    return await eventually(
        lambda: (
            (b := obj(api, WZ, NS, "demo"))
            and condition(b, "ClusterCreated").get("status") == "True"
            and b
        ),
        what="ClusterCreated",
    )


def play_claims(api, count: int = 3) -> None:
    """The volumes the StatefulSet controller makes from the claim template."""
    sts = obj(api, STS, NS, "demo-storage")
    template = sts["spec"]["volumeClaimTemplates"][0]
    for i in range(count):
        size = template["spec"]["resources"]["requests"]["storage"]
        api.put(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {
                    "name": f"data-demo-storage-{i}",
                    "namespace": NS,
                    "labels": template["metadata"]["labels"],
                },
                "spec": template["spec"],
                "status": {"phase": "Bound", "capacity": {"storage": size}},
            },
            manager="statefulset-controller",
        )


def play_storage_pod(
    api, sts: dict, ordinal: int, node: str | None = None, ready: bool = False
) -> None:
    """A storage pod as the StatefulSet controller makes it (no owner: an orphan, or
    one the test's controller does not track), on ``node``, ready or not."""
    spec: dict = {"containers": [{"name": "storage", "image": "waltz-storage"}]}
    if node:
        spec["nodeName"] = node
    pod: dict = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"demo-storage-{ordinal}",
            "namespace": NS,
            "labels": sts["spec"]["template"]["metadata"]["labels"],
        },
        "spec": spec,
    }
    if ready:
        pod["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    api.put(pod)


def claim_sizes(api) -> list[str]:
    return [
        c["spec"]["resources"]["requests"]["storage"]
        for c in sorted(api.list(PVC, NS), key=lambda c: c["metadata"]["name"])
        if c["metadata"]["name"].startswith("data-demo-storage-")
    ]


# --- 0. credentials ---------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_operator_authenticates_with_its_projected_token_and_follows_rotation(
    zookeeper, zk_root, tmp_path, monkeypatch
):
    """In a pod: HTTPS to the API server with the service account's CA and token. The API
    server refuses anonymous requests, so a reconcile proves the token is sent; a token
    rotated in place (the old one no longer valid) keeps the operator working."""
    pki = make_pki(str(tmp_path / "pki"))
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "ca.crt").write_text(pathlib.Path(pki.ca.cert).read_text())
    (account / "token").write_text("first-token")
    async with kubernetes_api(pki=pki) as api:
        api.tokens["first-token"] = OPERATOR_USER
        host, port = api.url.removeprefix("https://").rsplit(":", 1)
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
        connection = connection_from_environment(service_account_dir=str(account))
        assert connection.token == "first-token" and connection.token_file is not None
        create_cluster_object(api, cluster_doc(zookeeper, zk_root))
        async with running_operator(api, NS, connection=connection):
            await created(api)
            # The kubelet rotates the token: a new file, the old token expired.
            (account / "token.new").write_text("second-token")
            os.replace(account / "token.new", account / "token")
            api.tokens["second-token"] = OPERATOR_USER
            del api.tokens["first-token"]
            before = len(api.requests)
            await patch_cluster(api, {"spec": {"server": {"replicas": 3}}})
            await eventually(
                lambda: obj(api, "apps/v1/deployments", NS, "demo-server")["spec"]["replicas"] == 3,
                what="the change applied after the rotation",
            )
            later = api.requests[before:]
            assert any(r.user == OPERATOR_USER and r.method == "PATCH" for r in later)
    assert not [r for r in api.requests if r.user is None and r.status < 400]


@pytest.mark.asyncio
@pytest.mark.parametrize("credential", ["token", "certificate"])
async def test_a_kubeconfig_token_or_client_certificate_is_sent(
    zookeeper, zk_root, tmp_path, credential
):
    pki = make_pki(str(tmp_path / "pki"))
    async with kubernetes_api(pki=pki) as api:
        client = pki.client(OPERATOR_USER) if credential == "certificate" else None
        path = write_kubeconfig(
            str(tmp_path / "kubeconfig"),
            api.url,
            token=OPERATOR_TOKEN if credential == "token" else None,
            client=client,
            ca_file=pki.ca.cert,
        )
        connection = connection_from_environment(path)
        create_cluster_object(api, cluster_doc(zookeeper, zk_root))
        async with running_operator(api, NS, connection=connection):
            await created(api)
        users = {r.user for r in api.requests if r.user != "admin"}
        assert users == {OPERATOR_USER}


# --- 2. volumes -----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_growing_the_volumes_patches_the_claims_and_recreates_the_statefulset(
    zookeeper, zk_root
):
    """The API server refuses any change to volumeClaimTemplates: the operator grows each
    claim and recreates the StatefulSet with orphan propagation (its pods stay)."""
    async with kubernetes_api() as api:
        create_cluster_object(api, cluster_doc(zookeeper, zk_root))
        async with running_operator(api, NS):
            await created(api)
            first = await eventually(lambda: obj(api, STS, NS, "demo-storage"))
            play_claims(api)
            await patch_cluster(api, {"spec": {"storage": {"size": "20Gi"}}})
            second = await eventually(
                lambda: (
                    (s := obj(api, STS, NS, "demo-storage"))
                    and s["metadata"]["uid"] != first["metadata"]["uid"]
                    and s
                ),
                what="the StatefulSet recreated",
            )
            template = second["spec"]["volumeClaimTemplates"][0]
            assert template["spec"]["resources"]["requests"]["storage"] == "20Gi"
            assert claim_sizes(api) == ["20Gi"] * 3
            await eventually(lambda: events(api, "VolumesChanging"), what="VolumesChanging")
            body = obj(api, WZ, NS, "demo")
            assert condition(body, "Degraded")["status"] == "False", body["status"]
            assert not events(api, "ReconcileFailed")


@pytest.mark.asyncio
async def test_a_class_that_cannot_grow_is_a_refusal_that_holds_nothing_else_up(zookeeper, zk_root):
    async with kubernetes_api() as api:
        api.expandable = lambda storage_class: False
        create_cluster_object(api, cluster_doc(zookeeper, zk_root))
        async with running_operator(api, NS):
            await created(api)
            first = await eventually(lambda: obj(api, STS, NS, "demo-storage"))
            play_claims(api)
            await patch_cluster(api, {"spec": {"storage": {"size": "20Gi"}}})
            degraded = await eventually(
                lambda: (
                    (c := condition(obj(api, WZ, NS, "demo"), "Degraded")).get("status") == "True"
                    and c
                ),
                what="Degraded",
            )
            assert degraded["reason"] == "Refused"
            assert "allowVolumeExpansion" in degraded["message"]
            # Nothing half-done, and other changes still go through.
            await patch_cluster(api, {"spec": {"server": {"replicas": 3}}})
            await eventually(
                lambda: obj(api, "apps/v1/deployments", NS, "demo-server")["spec"]["replicas"] == 3
            )
            assert obj(api, STS, NS, "demo-storage")["metadata"]["uid"] == first["metadata"]["uid"]
            assert claim_sizes(api) == ["10Gi"] * 3


# --- 3. failures are visible ------------------------------------------------------------


def foreign(kind: str, name: str, service_name: str | None = None) -> dict:
    """An object of the same name that someone else made, with another selector."""
    spec: dict = {
        "replicas": 1,
        "selector": {"matchLabels": {"app": "other"}},
        "template": {
            "metadata": {"labels": {"app": "other"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        },
    }
    if service_name:
        spec["serviceName"] = service_name
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def degraded_with(api, reason: str):
    return lambda: (
        (c := condition(obj(api, WZ, NS, "demo"), "Degraded")).get("reason") == reason and c
    )


@pytest.mark.asyncio
async def test_a_failed_reconcile_is_in_the_status_and_an_event(zookeeper, zk_root):
    """Someone's Deployment has the servers' name and another selector (immutable):
    the API server refuses every apply with 422."""
    async with kubernetes_api() as api:
        create_cluster_object(api, cluster_doc(zookeeper, zk_root))
        api.put(foreign("Deployment", "demo-server"), manager="someone")
        async with running_operator(api, NS):
            degraded = await eventually(degraded_with(api, "ReconcileFailed"), what="failed")
            assert degraded["status"] == "True" and "422" in degraded["message"]
            body = obj(api, WZ, NS, "demo")
            assert condition(body, "Progressing")["message"].startswith("stopped: ")
            warnings = await eventually(lambda: events(api, "ReconcileFailed"))
            assert warnings[0]["type"] == "Warning"
            await asyncio.sleep(2.0)  # several failed reconciles: one Event, not one each
            assert len(events(api, "ReconcileFailed")) == 1
        assert obj(api, "apps/v1/deployments", NS, "demo-server")["spec"]["selector"] == {
            "matchLabels": {"app": "other"}
        }


@pytest.mark.asyncio
async def test_a_statefulset_of_someone_else_is_never_applied_over_or_recreated(zookeeper, zk_root):
    async with kubernetes_api() as api:
        create_cluster_object(api, cluster_doc(zookeeper, zk_root))
        theirs = api.put(foreign("StatefulSet", "demo-storage", "someone"), manager="someone")
        async with running_operator(api, NS):
            degraded = await eventually(degraded_with(api, "Refused"), what="refused")
            assert "does not own" in degraded["message"]
            await asyncio.sleep(1.0)
        kept = obj(api, STS, NS, "demo-storage")
        assert kept["metadata"]["uid"] == theirs["metadata"]["uid"]
        assert kept["spec"]["serviceName"] == "someone"


# --- 4, 6, 9. what the API server refuses ---------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("patch", "words"),
    [
        ({"spec": {"partitions": 2}}, "partitions never shrink"),
        ({"spec": {"zookeeper": {"root": "/elsewhere"}}}, "zookeeper.root cannot be set"),
        ({"spec": {"zookeeper": {"connect": "other:2181"}}}, "zookeeper.connect cannot change"),
        ({"spec": {"storage": {"storageClassName": "fast"}}}, "storageClassName cannot change"),
        ({"spec": {"storage": {"size": "5Gi"}}}, "storage.size can never decrease"),
    ],
    ids=["partitions", "root", "connect", "class", "shrink"],
)
async def test_one_way_doors_are_refused_by_the_api_server(zookeeper, zk_root, patch, words):
    async with kubernetes_api() as api:
        create_cluster_object(api, cluster_doc(zookeeper, zk_root))
        response = await api.request(
            "PATCH",
            f"/apis/waltz.io/v1alpha1/namespaces/{NS}/waltzclusters/demo",
            patch,
            content_type="application/merge-patch+json",
        )
        assert response.status == 422, response.body
        assert words in response.body["message"]


@pytest.mark.asyncio
@pytest.mark.parametrize("name", ["a" * 45, "1demo"])
async def test_names_the_derived_objects_cannot_carry_are_refused(zookeeper, zk_root, name):
    async with kubernetes_api() as api:
        doc = cluster_doc(zookeeper, zk_root)
        doc["metadata"]["name"] = name
        response = await api.request(
            "POST", f"/apis/waltz.io/v1alpha1/namespaces/{NS}/waltzclusters", doc
        )
        assert response.status == 422 and "metadata.name" in response.body["message"]


# --- growing the partitions ---------------------------------------------------------------


@pytest.mark.asyncio
async def test_raising_spec_partitions_grows_the_running_cluster(zookeeper, zk, zk_root):
    """The new partitions in one ZooKeeper transaction: the count, their replicas, their
    metadata and (unowned) ownership entries; a Normal Event says so, once."""
    async with kubernetes_api() as api:
        create_cluster_object(api, cluster_doc(zookeeper, zk_root))
        async with running_operator(api, NS):
            key = (await created(api))["status"]["clusterKey"]
            before = admin.read_cluster(zk, zk_root)
            await patch_cluster(api, {"spec": {"partitions": 6}})
            added = await eventually(
                lambda: events(api, "PartitionsAdded"), what="the PartitionsAdded Event"
            )
            assert (added[0]["type"], added[0]["message"]) == (
                "Normal",
                "grew from 4 to 6 partitions",
            )
            state = admin.read_cluster(zk, zk_root)
            assert state.params.num_partitions == 6 and state.problems == []
            assert state.params.key == before.params.key
            for p in (4, 5):
                assert len(state.assignment.replicas_of(p)) == 3
                assert p in state.partitions  # its metadata node
                assert state.ownership.partitions[p] == (None, 0)
            for p in range(4):  # the old partitions keep their replicas
                assert state.assignment.replicas_of(p) == before.assignment.replicas_of(p)
            # The status counts the new partitions, and nothing is refused.
            body = await eventually(
                lambda: (
                    (b := obj(api, WZ, NS, "demo"))
                    and len(b["status"].get("partitions", [])) == 6
                    and b["status"]["quorum"].endswith("/6")
                    and b
                ),
                what="six partitions in the status",
            )
            assert body["status"]["clusterKey"] == key
            assert condition(body, "Degraded")["status"] == "False", body["status"]
            await asyncio.sleep(1.0)  # more reconciles: grown once
            assert len(events(api, "PartitionsAdded")) == 1
            assert admin.read_params(zk, zk_root).num_partitions == 6
            assert not events(api, "ReconcileFailed") and not events(api, "Refused")


@pytest.mark.asyncio
async def test_lowering_spec_partitions_is_refused_by_the_api_server(zookeeper, zk, zk_root):
    async with kubernetes_api() as api:
        create_cluster_object(api, cluster_doc(zookeeper, zk_root))
        async with running_operator(api, NS):
            await created(api)
            before = admin.read_cluster(zk, zk_root)
            response = await api.request(
                "PATCH",
                f"/apis/waltz.io/v1alpha1/namespaces/{NS}/waltzclusters/demo",
                {"spec": {"partitions": 3}},
                content_type="application/merge-patch+json",
                query={"fieldManager": "kubectl"},
            )
            assert response.status == 422, response.body
            assert "partitions never shrink" in response.body["message"]
            assert "spec.partitions" in response.body["message"]
            assert obj(api, WZ, NS, "demo")["spec"]["partitions"] == 4
            await asyncio.sleep(1.0)
            after = admin.read_cluster(zk, zk_root)
            assert (after.params, after.assignment) == (before.params, before.assignment)
            assert not events(api, "PartitionsAdded")


@pytest.mark.asyncio
async def test_a_cluster_with_more_partitions_than_the_spec_is_adopted_and_refused(
    zookeeper, zk, zk_root
):
    """The CEL rule sees only the resource: an existing cluster with more partitions than
    a new resource asks for is adopted as it is, and the spec is refused (a Warning and
    Degraded, naming both counts); nothing changes in ZooKeeper."""
    doc = cluster_doc(zookeeper, zk_root)
    admin.create_cluster(zk, zk_root, f"{NS}/demo", 8, 3, parse(doc).storage_addresses())
    before = admin.read_cluster(zk, zk_root)
    async with kubernetes_api() as api:
        create_cluster_object(api, doc)
        async with running_operator(api, NS):
            degraded = await eventually(degraded_with(api, "Refused"), what="refused")
            message = degraded["message"]
            assert "spec.partitions is 4, but the cluster has 8 partitions" in message
            warning = await eventually(lambda: events(api, "Refused"), what="the Warning")
            assert warning[0]["type"] == "Warning"
            assert "partitions never shrink" in warning[0]["message"]
            body = obj(api, WZ, NS, "demo")
            assert condition(body, "ClusterCreated")["status"] == "True"
            assert body["status"]["quorum"].endswith("/8")
            # Raised to the cluster's count, the refusal clears.
            await patch_cluster(api, {"spec": {"partitions": 8}})
            await eventually(degraded_with(api, "AsDesired"), what="nothing refused")
        after = admin.read_cluster(zk, zk_root)
        assert (after.params, after.assignment) == (before.params, before.assignment)
        assert not events(api, "PartitionsAdded")


# --- 5. deletion takes only the cluster's own objects --------------------------------------


@pytest.mark.asyncio
async def test_deleting_spares_the_charts_zookeeper_that_shares_the_instance_label(
    zookeeper, zk, zk_root
):
    """The chart labels its ZooKeeper app.kubernetes.io/instance=<release>, the same as a
    WaltzCluster named after the release."""
    chart_labels = {
        "app.kubernetes.io/name": "zookeeper",
        "app.kubernetes.io/instance": "demo",
        "app.kubernetes.io/managed-by": "Helm",
    }
    async with kubernetes_api() as api:
        create_cluster_object(api, cluster_doc(zookeeper, zk_root, retainVolumes=False))
        api.put(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "demo-zookeeper-0", "namespace": NS, "labels": chart_labels},
                "spec": {"containers": [{"name": "zookeeper", "image": "zookeeper:3.9"}]},
            }
        )
        api.put(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {
                    "name": "data-demo-zookeeper-0",
                    "namespace": NS,
                    "labels": chart_labels,
                },
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            }
        )
        async with running_operator(api, NS):
            await created(api)
            await eventually(lambda: obj(api, STS, NS, "demo-storage"))
            play_claims(api)
            response = await api.request(
                "DELETE", f"/apis/waltz.io/v1alpha1/namespaces/{NS}/waltzclusters/demo"
            )
            assert response.status == 200
            await eventually(lambda: obj(api, WZ, NS, "demo") is None, 120, "the deletion")
            await eventually(lambda: events(api, "Deleted"), what="the Deleted Event")
        assert not events(api, "DeleteIncomplete")
        assert claim_sizes(api) == []  # the cluster's volumes went
        assert obj(api, PVC, NS, "data-demo-zookeeper-0") is not None
        assert obj(api, "v1/pods", NS, "demo-zookeeper-0") is not None
        assert not zk.exists(zk_root)


# --- 7. zones ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_storage_nodes_zones_become_placement_groups_and_partitions_spread(
    zookeeper, zk, zk_root
):
    """Six storage pods on nodes in three zones, scheduled after CreateCluster placed the
    replicas without zones: the nodes get their zones as groups, and the first moves put
    each partition on a zone it lacked."""
    book = tuple(f"127.0.0.1:{9 + i}" for i in range(6))  # nothing listens: no session
    async with kubernetes_api() as api:
        for zone in "abc":
            api.put(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": f"node-{zone}",
                        "labels": {"topology.kubernetes.io/zone": f"zone-{zone}"},
                    },
                }
            )
        create_cluster_object(
            api, cluster_doc(zookeeper, zk_root, partitions=2, storage={"replicas": 6})
        )
        async with running_operator(api, NS, address_book=book):
            await created(api)
            sts = await eventually(lambda: obj(api, STS, NS, "demo-storage"))
            for i in range(6):
                play_storage_pod(api, sts, i, node=f"node-{'aabbcc'[i]}", ready=True)

            def groups() -> dict[str, int]:
                assignment, _ = admin.read_assignment(zk, zk_root)
                return dict(assignment.groups)

            found = await eventually(
                lambda: (g := groups()) and len(set(g.values()) - {0}) == 3 and g,
                what="zones as groups",
            )
            assert found[book[0]] == found[book[1]] != found[book[2]] == found[book[3]]
            await eventually(lambda: events(api, "ZonesFound"), what="the ZonesFound Event")

            def spread() -> bool:
                assignment, _ = admin.read_assignment(zk, zk_root)
                for p in range(2):
                    holders = [a for a, ps in assignment.storages.items() if p in ps]
                    if len({assignment.groups[a] for a in holders}) < 3:
                        return False
                return True

            await eventually(spread, what="every partition on three zones")


# --- a storage pod whose volume is gone ----------------------------------------------------


def play_statefulset_pod(api, sts: dict, ordinal: int, ready: bool) -> None:
    """A storage pod of the StatefulSet (its controller), not scheduled yet or ready."""
    status: dict = {"phase": "Pending", "conditions": []}
    if ready:
        status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"demo-storage-{ordinal}",
                "namespace": NS,
                "labels": sts["spec"]["template"]["metadata"]["labels"],
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
            "spec": {"containers": [{"name": "storage", "image": "waltz-storage"}]},
            "status": status,
        }
    )


def lose_claim(api, ordinal: int) -> None:
    """Its PersistentVolume deleted: the claim's phase becomes Lost."""
    claim = obj(api, PVC, NS, f"data-demo-storage-{ordinal}")
    api.put({**claim, "status": {**claim["status"], "phase": "Lost"}})


@pytest.mark.asyncio
async def test_a_storage_pod_whose_volume_is_gone_is_recreated_once_the_servers_replaced_it(
    zookeeper, zk, zk_root
):
    """Four storage pods, three replicas a partition; pod 3's claim is Lost. Without
    spec.storage.replaceLostAfterSeconds: a Warning and Degraded, nothing deleted. With
    it: nothing deleted while node 3 is in the replica assignment or being replaced; once
    it left it (the servers' replacement, played here), its claim and pod are deleted, and
    the pod, back with an empty volume and ready, joins the assignment again."""
    book = tuple(f"127.0.0.1:{9 + i}" for i in range(4))  # nothing listens: no session
    lost = book[3]
    async with kubernetes_api() as api:
        create_cluster_object(api, cluster_doc(zookeeper, zk_root, storage={"replicas": 4}))
        async with running_operator(api, NS, address_book=book):
            await created(api)
            sts = await eventually(lambda: obj(api, STS, NS, "demo-storage"))
            play_claims(api, 4)
            for i in range(4):
                play_statefulset_pod(api, sts, i, ready=i != 3)
            lose_claim(api, 3)
            assert lost in admin.read_assignment(zk, zk_root)[0].storages

            # Off: a Warning naming pod, claim and reason, and Degraded saying what to do.
            (warning,) = await eventually(
                lambda: events(api, "StorageVolumeLost"), what="the StorageVolumeLost Warning"
            )
            assert warning["type"] == "Warning"
            for words in ("demo-storage-3", "data-demo-storage-3", "Lost"):
                assert words in warning["message"]
            degraded = await eventually(
                lambda: (
                    (c := condition(obj(api, WZ, NS, "demo"), "Degraded")).get("reason")
                    == "NeedsAttention"
                    and c
                ),
                what="Degraded",
            )
            assert "spec.storage.replaceLostAfterSeconds" in degraded["message"]
            assert "by hand" in degraded["message"]
            await asyncio.sleep(1.5)  # several reconciles: one Warning, nothing deleted
            assert len(events(api, "StorageVolumeLost")) == 1
            assert obj(api, PVC, NS, "data-demo-storage-3") is not None
            assert obj(api, "v1/pods", NS, "demo-storage-3") is not None
            assert not events(api, "Refused")

            # On, node 3 still in the assignment: waiting for the servers.
            await patch_cluster(api, {"spec": {"storage": {"replaceLostAfterSeconds": 30}}})
            await eventually(
                lambda: (
                    obj(api, "v1/configmaps", NS, "demo-server-config")["data"].get(
                        "WALTZ_SERVER_REPLACE_STORAGE_AFTER"
                    )
                    == "30"
                ),
                what="the servers' setting",
            )

            def progressing() -> str:
                return condition(obj(api, WZ, NS, "demo"), "Progressing").get("message", "")

            await eventually(
                lambda: f"waiting for the servers to replace storage node {lost}" in progressing(),
                what="waiting for the servers",
            )
            await eventually(degraded_with(api, "AsDesired"), what="no longer Degraded")
            assert obj(api, PVC, NS, "data-demo-storage-3") is not None
            assert obj(api, "v1/pods", NS, "demo-storage-3") is not None

            # The servers' replacement, one step at a time: recorded while under way.
            first = replace_storage_step(zk, zk_root, lost, reason="test")
            assert not first.finished
            assert lost in read_replacements(zk, zk_root)[0].replacing
            await eventually(
                lambda: "the servers are replacing storage node" in progressing(),
                what="the replacement under way",
            )
            await asyncio.sleep(1.0)
            assert obj(api, PVC, NS, "data-demo-storage-3") is not None
            assert obj(api, "v1/pods", NS, "demo-storage-3") is not None
            step = first
            while not step.finished:
                step = replace_storage_step(zk, zk_root, lost, reason="test")
            assert lost not in admin.read_assignment(zk, zk_root)[0].storages

            # Replaced: the claim and the pod go (the StatefulSet makes them again).
            await eventually(
                lambda: (
                    obj(api, PVC, NS, "data-demo-storage-3") is None
                    and obj(api, "v1/pods", NS, "demo-storage-3") is None
                ),
                what="the claim and the pod deleted",
            )
            (replaced,) = await eventually(
                lambda: events(api, "StorageVolumeReplaced"), what="StorageVolumeReplaced"
            )
            assert replaced["type"] == "Normal" and lost in replaced["message"]
            for i in range(3):
                assert obj(api, "v1/pods", NS, f"demo-storage-{i}") is not None
                assert obj(api, PVC, NS, f"data-demo-storage-{i}") is not None

            # The StatefulSet controller's part: an empty claim, the pod, ready.
            play_claims(api, 4)
            play_statefulset_pod(api, sts, 3, ready=True)
            await eventually(
                lambda: lost in admin.read_assignment(zk, zk_root)[0].storages,
                what="node 3 joining the assignment again",
            )
            joined = await eventually(lambda: events(api, "StorageAdded"), what="StorageAdded")
            assert lost in joined[0]["message"]
            await asyncio.sleep(1.0)
            assert len(events(api, "StorageVolumeReplaced")) == 1
            assert obj(api, "v1/pods", NS, "demo-storage-3") is not None
            assert not events(api, "ReconcileFailed")


# --- 8. leader election ----------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.asyncio
async def test_one_leader_at_a_time_and_a_takeover_after_the_lease_expires():
    async with kubernetes_api() as api:
        clock = Clock()
        kubes = [KubeApi(connection) for connection in _operator_connections(api, 2)]
        try:
            a, b = (
                LeaderElector(k, NS, "waltz-operator", name, clock=clock)
                for k, name in zip(kubes, ("op-a", "op-b"), strict=True)
            )
            # Both read "no Lease" and both try to create it: one wins.
            results = await asyncio.gather(a.try_acquire_or_renew(), b.try_acquire_or_renew())
            assert sorted(results) == [False, True]
            leader, standby = (a, b) if results[0] else (b, a)
            assert await leader.try_acquire_or_renew()  # renews
            assert not await standby.try_acquire_or_renew()
            lease = api.get("coordination.k8s.io/v1/leases", NS, "waltz-operator")
            assert lease["spec"]["holderIdentity"] == leader.identity
            # The leader falls silent: by the standby's own clock, 15 s of the same record.
            clock.now += 16
            assert await standby.try_acquire_or_renew()
            lease = api.get("coordination.k8s.io/v1/leases", NS, "waltz-operator")
            assert lease["spec"]["holderIdentity"] == standby.identity
            assert lease["spec"]["leaseTransitions"] == 1
            # The old leader learns it lost: it must not go on.
            assert not await leader.try_acquire_or_renew()
            assert not leader.leading
            # A clean stop releases it: the other takes it at once.
            await standby.release()
            assert await leader.try_acquire_or_renew()
        finally:
            for k in kubes:
                await k.close()


def _operator_connections(api, count: int) -> list[Connection]:
    return [Connection(server=api.url, token=OPERATOR_TOKEN) for _ in range(count)]


# --- 9. an idle cluster costs reads, not writes -------------------------------------------


def _writes(requests) -> list:
    owned = ("/statefulsets/", "/deployments/", "/services/", "/configmaps/")
    owned += ("/poddisruptionbudgets/", "/networkpolicies/")
    return [
        r
        for r in requests
        if r.method in ("PATCH", "POST", "PUT") and any(o in r.path for o in owned)
    ]


@pytest.mark.asyncio
async def test_an_idle_cluster_is_not_applied_again(zookeeper, zk_root):
    async with kubernetes_api() as api:
        create_cluster_object(api, cluster_doc(zookeeper, zk_root))
        async with running_operator(api, NS, interval=0.2) as config:
            await created(api)
            await eventually(lambda: obj(api, STS, NS, "demo-storage"))
            reconciles = config.metrics.reconciles.labels(f"{NS}/demo")
            await eventually(lambda: reconciles._value.get() > 10, what="ten reconciles")
            start, counted = len(api.requests), reconciles._value.get()
            await eventually(lambda: reconciles._value.get() >= counted + 15, 60, "15 more")
            assert _writes(api.requests[start:]) == []
            # Someone edits a field the operator sets: the next reconcile puts it back.
            api.patch(
                "v1/configmaps", NS, "demo-server-config", {"data": {"WALTZ_SERVER_PORT": "1"}}
            )
            await eventually(
                lambda: (
                    obj(api, "v1/configmaps", NS, "demo-server-config")["data"]["WALTZ_SERVER_PORT"]
                    == "55180"
                ),
                what="the edit undone",
            )


@pytest.mark.asyncio
async def test_a_statefulset_made_again_keeps_every_pod_it_left(zookeeper, zk_root):
    """The StatefulSet was deleted with orphan propagation (a volume change, or by hand)
    and, meanwhile, storage.replicas was lowered: made again at the new size, it would
    delete the highest ordinals at once. It is made at the size of the pods it left, and
    the scale-down goes its safe way."""
    async with kubernetes_api() as api:
        create_cluster_object(api, cluster_doc(zookeeper, zk_root, storage={"replicas": 4}))
        async with running_operator(api, NS):
            await created(api)
            sts = await eventually(lambda: obj(api, STS, NS, "demo-storage"))
        for i in range(4):
            play_storage_pod(api, sts, i)
        api.remove(STS, NS, "demo-storage", propagation="Orphan")
        await api.gc_idle()
        assert obj(api, STS, NS, "demo-storage") is None
        await patch_cluster(api, {"spec": {"storage": {"replicas": 3}}})
        async with running_operator(api, NS):
            again = await eventually(lambda: obj(api, STS, NS, "demo-storage"))
            assert again["spec"]["replicas"] == 4
            await asyncio.sleep(1.0)  # a few reconciles: no quorum seen, nothing moves
            assert obj(api, STS, NS, "demo-storage")["spec"]["replicas"] == 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _health(port: int) -> dict | None:
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/healthz", timeout=aiohttp.ClientTimeout(5)) as r,
        ):
            return await r.json()
    except (aiohttp.ClientError, TimeoutError):
        return None


async def _role_becomes(port: int, role: str, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    last = None
    while asyncio.get_running_loop().time() < deadline:
        last = await _health(port)
        if last is not None and last.get("role") == role:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"/healthz on {port} never said {role} (last: {last})")


@pytest.mark.asyncio
async def test_two_operator_processes_one_leads_and_the_other_takes_over(
    zookeeper, zk_root, tmp_path
):
    """`waltz-operator` twice, as the chart runs it: one holds the Lease and reconciles,
    the other stands by (alive); the leader SIGKILLed, the standby takes over and
    reconciles a change."""
    async with kubernetes_api() as api:
        kubeconfig = write_kubeconfig(str(tmp_path / "kubeconfig"), api.url, token=OPERATOR_TOKEN)
        create_cluster_object(api, cluster_doc(zookeeper, zk_root))
        ports = {name: _free_port() for name in ("op-a", "op-b")}
        processes = {
            name: subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "waltz_operator.main",
                    "--kubeconfig",
                    kubeconfig,
                    "--namespace",
                    NS,
                    "--leader-lease",
                    "waltz-operator",
                    "--leader-namespace",
                    NS,
                    "--identity",
                    name,
                    "--metrics-host",
                    "127.0.0.1",
                    "--metrics-port",
                    str(port),
                    "--reconcile-interval",
                    "1",
                ],
                stdout=subprocess.DEVNULL,
                stderr=open(tmp_path / f"{name}.log", "w"),  # noqa: SIM115
            )
            for name, port in ports.items()
        }
        try:
            await created(api)

            def holder() -> str:
                lease = api.get("coordination.k8s.io/v1/leases", NS, "waltz-operator")
                return (lease or {}).get("spec", {}).get("holderIdentity") or ""

            leader = await eventually(holder, what="a leader")
            standby = next(n for n in ports if n != leader)
            await _role_becomes(ports[leader], "leader")
            await _role_becomes(ports[standby], "standby")  # alive while it waits
            processes[leader].kill()
            processes[leader].wait()
            await eventually(lambda: holder() == standby, 90, "the standby taking over")
            await patch_cluster(api, {"spec": {"server": {"replicas": 3}}})
            await eventually(
                lambda: obj(api, "apps/v1/deployments", NS, "demo-server")["spec"]["replicas"] == 3,
                60,
                "the new leader reconciling",
            )
            await _role_becomes(ports[standby], "leader")
        finally:
            for process in processes.values():
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in processes.values():
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
