"""The kopf handlers in-process against kmock, on a real ZooKeeper."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient
from operator_harness import (
    WZ,
    condition,
    create_cluster_object,
    eventually,
    kubernetes_api,
    obj,
    running_operator,
)

from waltz_client.cluster import admin

NS = "prod"


def cluster_doc(zookeeper, zk_root: str, **spec) -> dict:
    return {
        "apiVersion": "waltz.io/v1alpha1",
        "kind": "WaltzCluster",
        "metadata": {"name": "demo", "namespace": NS},
        "spec": {
            "partitions": 4,
            "replicasPerPartition": 3,
            "zookeeper": {"connect": zookeeper.connect_string, "root": zk_root},
            **spec,
        },
    }


@pytest.fixture
def zk(zookeeper):
    client = KazooClient(hosts=zookeeper.connect_string)
    client.start()
    yield client
    client.stop()
    client.close()


@pytest.mark.asyncio
async def test_create_applies_the_objects_creates_the_cluster_and_reports(zookeeper, zk, zk_root):
    async with kubernetes_api() as api:
        create_cluster_object(api, cluster_doc(zookeeper, zk_root))
        async with running_operator(api, NS):
            sts = await eventually(
                lambda: obj(api, "apps/v1/statefulsets", NS, "demo-storage"), what="StatefulSet"
            )
            assert sts["spec"]["replicas"] == 3
            assert sts["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
            await eventually(lambda: obj(api, "apps/v1/deployments", NS, "demo-server"))
            assert obj(api, "v1/services", NS, "demo")
            body = await eventually(
                lambda: (
                    (b := obj(api, WZ, NS, "demo"))
                    and condition(b, "ClusterCreated").get("status") == "True"
                    and b
                ),
                what="ClusterCreated",
            )
        params = admin.read_params(zk, zk_root)
        assert params.name == f"{NS}/demo" and params.num_partitions == 4
        assert body["status"]["clusterKey"] == str(params.key)
        assert condition(body, "Ready")["status"] == "False"  # no pods run here
