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
    """A WaltzCluster being deleted (retainVolumes: false) whose storage pod stays: kmock
    runs no controllers, as a node that is gone would leave its pod Terminating."""
    create_cluster_object(
        api,
        {
            "apiVersion": "waltz.io/v1alpha1",
            "kind": "WaltzCluster",
            "metadata": {
                "name": "demo",
                "namespace": NS,
                "finalizers": ["waltz.io/finalizer"],
                "deletionTimestamp": "2026-11-23T00:00:00Z",
            },
            "spec": {
                "partitions": 1,
                "replicasPerPartition": 1,
                # Nothing listens here; the deletion must not get as far as ZooKeeper.
                "zookeeper": {"connect": "127.0.0.1:9", "root": "/demo"},
                "retainVolumes": False,
            },
        },
    )
    api.objects["v1/pods", NS, "demo-storage-0"] = {
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
            "ownerReferences": [
                {"kind": "StatefulSet", "name": "demo-storage", "uid": "s1", "controller": True}
            ],
        },
    }


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
        assert obj(api, "v1/pods", NS, "demo-storage-0") is not None
        assert obj(api, "apps/v1/statefulsets", NS, "demo-storage") is None
