"""The operator's long timeouts, in loop time (looptime): minutes pass in a second.

No ZooKeeper is needed: these paths give up before they would reach it.
"""

from __future__ import annotations

import pytest
from operator_harness import (
    NS,
    WZ,
    create_cluster_object,
    events,
    eventually,
    kubernetes_api,
    obj,
    running_operator,
)

# A deletion waits this long (loop time) for the pods to go before it gives up.
DELETE_TIMEOUT = 120.0


def deleted_cluster_with_a_pod_that_never_goes(api) -> None:
    """A WaltzCluster being deleted (retainVolumes: false) whose storage pod stays: a
    pod on a node that is gone stays Terminating (no kubelet confirms its deletion)."""
    create_cluster_object(
        api,
        {
            "apiVersion": "waltz.io/v1alpha1",
            "kind": "WaltzCluster",
            "metadata": {"name": "demo", "namespace": NS, "finalizers": ["waltz.io/finalizer"]},
            "spec": {
                "partitions": 1,
                "replicasPerPartition": 1,
                "storage": {"replicas": 1},
                # Nothing listens here; the deletion must not get as far as ZooKeeper.
                "zookeeper": {"connect": "127.0.0.1:9", "root": "/demo"},
                "retainVolumes": False,
            },
        },
    )
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "demo-storage-0",
                "namespace": NS,
                "labels": {
                    "app.kubernetes.io/instance": "demo",
                    "app.kubernetes.io/component": "storage",
                    "app.kubernetes.io/managed-by": "waltz-operator",
                },
                # its StatefulSet is gone already
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "StatefulSet",
                        "name": "demo-storage",
                        "uid": "4f1b7a52-0c52-4c3e-9d0e-5f0c2b1d7a11",
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "nodeName": "gone-node",
                "containers": [{"name": "storage", "image": "waltz-storage:test"}],
            },
        }
    )
    assert not api.remove("v1/pods", NS, "demo-storage-0")  # Terminating, for good
    assert not api.remove(WZ, NS, "demo")  # held by the operator's finalizer


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_deletion_that_cannot_finish_gives_up_after_its_timeout(looptime):
    async with kubernetes_api() as api:
        deleted_cluster_with_a_pod_that_never_goes(api)
        started = float(looptime)
        async with running_operator(api, NS, delete_timeout=DELETE_TIMEOUT):
            await eventually(
                lambda: obj(api, WZ, NS, "demo") is None,
                timeout=120.0,  # real seconds, for a busy machine
                what="the finalizer to go",
            )
        waited = float(looptime) - started
        gave_up = events(api, "DeleteIncomplete")
        assert gave_up and gave_up[0]["type"] == "Warning"
        assert f"timed out after {DELETE_TIMEOUT:g} s" in gave_up[0]["message"]
        assert "data-demo-storage-<ordinal>" in gave_up[0]["message"]  # what to clean
        assert not events(api, "Deleted")
        assert DELETE_TIMEOUT <= waited < DELETE_TIMEOUT + 120
        # The pod was never force-deleted: the operator only deletes its controllers.
        assert obj(api, "v1/pods", NS, "demo-storage-0")["metadata"]["deletionTimestamp"]
        assert obj(api, "apps/v1/statefulsets", NS, "demo-storage") is None
