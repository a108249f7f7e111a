"""A WaltzCluster's status from what the operator observed: conditions, counts, and a
status the CRD's schema accepts."""

from __future__ import annotations

import copy
import json
import pathlib
from dataclasses import replace

import jsonschema
import yaml

from waltz_operator.spec import parse
from waltz_operator.status import Observed, PartitionObserved, compute_status

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "crds" / "waltzclusters.yaml").read_text())
STATUS_SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
RESOURCE = yaml.safe_load((ROOT / "examples" / "waltzcluster-minimal.yaml").read_text())
SPEC = parse(RESOURCE)  # 4 partitions, 3 replicas, 3 storage pods, 2 servers
T0, T1 = "2026-11-23T10:00:00Z", "2026-11-23T10:05:00Z"


def partitions(live=(3, 3, 3, 3)) -> list[PartitionObserved]:
    return [PartitionObserved(p, "server-0", 2, n, 3, 100 + p) for p, n in enumerate(live)]


HEALTHY = Observed(cluster_key="k-1", storage_ready=3, servers_ready=2, partitions=partitions())


def conditions(status) -> dict[str, dict]:
    return {c["type"]: c for c in status["conditions"]}


def test_a_healthy_cluster_is_ready():
    status = compute_status(SPEC, 7, HEALTHY, None, T0)
    jsonschema.validate(status, STATUS_SCHEMA)
    c = conditions(status)
    assert [k for k, v in c.items() if v["status"] == "True"] == [
        "Ready",
        "ZooKeeperReachable",
        "ClusterCreated",
        "StorageReady",
        "ServersReady",
        "QuorumHealthy",
    ]
    assert c["Progressing"]["reason"] == "Idle" and c["Degraded"]["status"] == "False"
    assert (status["quorum"], status["storage"]["summary"], status["servers"]["summary"]) == (
        "4/4",
        "3/3",
        "2/2",
    )
    assert status["observedGeneration"] == 7 and status["clusterKey"] == "k-1"
    assert all(v["observedGeneration"] == 7 for v in c.values())


def test_a_partition_without_a_majority_is_named():
    observed = Observed(
        cluster_key="k-1", storage_ready=1, servers_ready=2, partitions=partitions((3, 1, 2, 1))
    )
    c = conditions(compute_status(SPEC, 7, observed, None, T0))
    assert c["QuorumHealthy"]["status"] == "False"
    assert c["QuorumHealthy"]["message"] == "2/4 partitions hold a quorum; without one: 1, 3"
    assert c["Ready"]["message"] == "not yet: StorageReady, QuorumHealthy"


def test_the_quorum_counts_the_partitions_the_spec_wants_or_the_cluster_has():
    """Growing, the new partitions hold no quorum until they are taken up; with a refused
    lower spec.partitions, the cluster's partitions are all still counted."""
    growing = compute_status(replace(SPEC, partitions=6), 7, HEALTHY, None, T0)
    assert growing["quorum"] == "4/6"
    assert conditions(growing)["QuorumHealthy"]["status"] == "False"
    fewer = compute_status(replace(SPEC, partitions=2), 7, HEALTHY, None, T0)
    assert fewer["quorum"] == "4/4"
    assert conditions(fewer)["QuorumHealthy"]["status"] == "True"


def test_transition_times_move_only_when_a_status_changes():
    first = compute_status(SPEC, 7, HEALTHY, None, T0)
    again = compute_status(SPEC, 7, HEALTHY, first, T1)
    assert all(c["lastTransitionTime"] == T0 for c in again["conditions"])
    storage_down = Observed(**{**HEALTHY.__dict__, "storage_ready": 2})
    changed = conditions(compute_status(SPEC, 8, storage_down, first, T1))
    assert changed["StorageReady"]["lastTransitionTime"] == T1
    assert changed["Ready"]["lastTransitionTime"] == T1
    assert changed["ServersReady"]["lastTransitionTime"] == T0


def test_zookeeper_creation_progress_pause_and_refusals_are_reported():
    c = conditions(
        compute_status(SPEC, 1, Observed(zookeeper_error="connection refused"), None, T0)
    )
    assert c["ZooKeeperReachable"]["message"].endswith("connection refused")
    assert c["ClusterCreated"]["reason"] == "Pending"
    refused = Observed(create_error="a different cluster already uses /waltz/default/demo")
    assert conditions(compute_status(SPEC, 1, refused, None, T0))["ClusterCreated"]["reason"] == (
        "Refused"
    )
    busy = Observed(**{**HEALTHY.__dict__, "progress": "rolling demo-storage-2"})
    assert conditions(compute_status(SPEC, 1, busy, None, T0))["Progressing"]["status"] == "True"
    paused_resource = copy.deepcopy(RESOURCE)
    paused_resource["spec"]["paused"] = True
    paused = conditions(compute_status(parse(paused_resource), 1, busy, None, T0))["Progressing"]
    assert (paused["status"], paused["reason"]) == ("False", "Paused")
    degraded = Observed(**{**HEALTHY.__dict__, "degraded": ("scale-down to 2 refused: ...",)})
    d = conditions(compute_status(SPEC, 1, degraded, None, T0))["Degraded"]
    assert (d["status"], d["reason"]) == ("True", "Refused")


def test_a_failed_reconcile_says_why_and_stops_claiming_up_to_date():
    from waltz_operator.status import failure_status

    before = compute_status(SPEC, 1, HEALTHY, None, T0)
    after = failure_status(before, 2, "ReconcileFailed", "reconcile failed: 422 no", T1)
    got = conditions(after)
    assert got["Degraded"]["status"] == "True"
    assert (got["Degraded"]["reason"], got["Degraded"]["message"]) == (
        "ReconcileFailed",
        "reconcile failed: 422 no",
    )
    assert got["Degraded"]["lastTransitionTime"] == T1
    assert got["Progressing"]["status"] == "False"
    assert got["Progressing"]["message"] == "stopped: reconcile failed: 422 no"
    assert "up to date" not in json.dumps(after)
    # The rest of what was observed stays, in the same order.
    assert [c["type"] for c in after["conditions"]] == [c["type"] for c in before["conditions"]]
    assert got["Ready"] == conditions(before)["Ready"]
    jsonschema.validate(after, STATUS_SCHEMA)
