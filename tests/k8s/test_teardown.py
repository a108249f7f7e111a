"""Which pods and volumes a WaltzCluster's deletion takes: only its own, though the
chart's operator and ZooKeeper carry the same ``app.kubernetes.io/instance``."""

from __future__ import annotations

from waltz_operator.desired import labels
from waltz_operator.spec import parse
from waltz_operator.teardown import own_claims, own_pods

SPEC = parse(
    {
        "metadata": {"name": "waltz", "namespace": "prod", "uid": "u1"},
        "spec": {"zookeeper": {"connect": "zk:2181"}},
    }
)
CHART = {  # what the chart gives its bundled ZooKeeper and operator (release "waltz")
    "app.kubernetes.io/name": "zookeeper",
    "app.kubernetes.io/instance": "waltz",
    "app.kubernetes.io/managed-by": "Helm",
}


def pod(name: str, pod_labels: dict, owner: tuple[str, str] | None) -> dict:
    meta: dict = {"name": name, "labels": pod_labels}
    if owner:
        meta["ownerReferences"] = [
            {"kind": owner[0], "name": owner[1], "controller": True, "uid": "x"}
        ]
    return {"metadata": meta}


def test_only_the_clusters_own_pods():
    storage = pod("waltz-storage-0", labels(SPEC, "storage"), ("StatefulSet", "waltz-storage"))
    server = pod(
        "waltz-server-5d4f-abcde", labels(SPEC, "server"), ("ReplicaSet", "waltz-server-5d4f")
    )
    zookeeper = pod("waltz-zookeeper-0", CHART, ("StatefulSet", "waltz-zookeeper"))
    operator = pod(
        "waltz-operator-77-x",
        {**CHART, "app.kubernetes.io/name": "waltz-operator"},
        ("ReplicaSet", "waltz-operator-77"),
    )
    # Labelled like ours, but not made by our StatefulSet or Deployment.
    stray = pod("waltz-storage-debug", labels(SPEC, "storage"), None)
    assert own_pods(SPEC, [storage, server, zookeeper, operator, stray]) == [storage, server]


def test_only_the_storage_volumes():
    ours = {"metadata": {"name": "data-waltz-storage-2", "labels": labels(SPEC, "storage")}}
    old = {  # made before the waltz.io/cluster label existed
        "metadata": {
            "name": "data-waltz-storage-0",
            "labels": {k: v for k, v in labels(SPEC, "storage").items() if k != "waltz.io/cluster"},
        }
    }
    zookeeper = {"metadata": {"name": "data-waltz-zookeeper-0", "labels": CHART}}
    named_alike = {"metadata": {"name": "data-waltz-storage-0", "labels": CHART}}
    assert own_claims(SPEC, [ours, old, zookeeper, named_alike]) == [ours, old]
