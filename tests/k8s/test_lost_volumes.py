"""Storage pods whose volume is gone (lost_volumes.py), and the reconcile's decisions
about them (reconcile_decisions.py): the Warning, repeated only after a while; Degraded
without spec.storage.replaceLostAfterSeconds; with it, waiting for the servers to replace
the node, then its claim and pod deleted, one at a time and never during another change;
the pod, back empty, joins the assignment again (at an unchanged StatefulSet size)."""

from __future__ import annotations

import datetime
from dataclasses import replace
from typing import Any

import pytest

from waltz_client.cluster.metadata import ReplicaAssignment
from waltz_operator.events import Event
from waltz_operator.lost_volumes import LostVolume, claim_name, lost_volumes
from waltz_operator.observe import ClusterView
from waltz_operator.pipeline import Step, run_pipeline
from waltz_operator.reconcile_decisions import (
    finds_lost_volumes,
    handles_lost_volumes,
    joining_storage,
    lost_volume_held,
    lost_volume_next,
    lost_volume_recreated,
    lost_volume_warnings,
    lost_volumes_found,
    may_balance,
    reported,
    rolling_storage,
    storage_joins,
    storage_membership,
)
from waltz_operator.reconcile_settings import ReconcileSettings
from waltz_operator.reconcile_steps import ReconcileSteps
from waltz_operator.reconciliation import Reconciliation, begin
from waltz_operator.rollout import Wait
from waltz_operator.spec import ClusterSpec, parse

NOW = "2026-11-28T10:00:00Z"
T0 = datetime.datetime(2026, 11, 28, 10, tzinfo=datetime.UTC)
REPEAT = datetime.timedelta(seconds=600)


def body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "waltz.io/v1alpha1",
        "kind": "WaltzCluster",
        "metadata": {"name": "demo", "namespace": "prod", "uid": "u1", "generation": 1},
        "spec": {
            "zookeeper": {"connect": "zk:2181"},
            "partitions": 4,
            "storage": {"replicas": 4, **spec.pop("storage", {})},
            **spec,
        },
    }


def cluster_spec(seconds: int = 0) -> ClusterSpec:
    return parse(body(storage={"replaceLostAfterSeconds": seconds}))


def pod(
    spec: ClusterSpec,
    number: int,
    *,
    ready: bool = True,
    deleting: bool = False,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": spec.storage_pod(number)}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-28T09:59:00Z"
    return {
        "metadata": meta,
        "status": status
        or {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def claim(
    spec: ClusterSpec, number: int, phase: str = "Bound", deleting: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": claim_name(spec, number)}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-28T09:59:00Z"
    return {"metadata": meta, "spec": {"volumeName": f"pv-{number}"}, "status": {"phase": phase}}


UNSCHEDULABLE = {
    "phase": "Pending",
    "conditions": [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 node(s) had volume node affinity conflict. "
            "preemption: 0/3 nodes are available",
        }
    ],
}


# --- detecting -----------------------------------------------------------------------------


def test_a_healthy_cluster_has_no_lost_volume():
    spec = cluster_spec()
    pods = [pod(spec, i) for i in range(4)]
    claims = [claim(spec, i) for i in range(4)]
    assert lost_volumes(spec, pods, claims, 4) == []
    # A pod not made yet, or still pending for another reason, is no loss.
    other_pending = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "message": "Insufficient cpu"}],
    }
    assert lost_volumes(spec, [*pods[:3], pod(spec, 3, status=other_pending)], claims, 4) == []
    assert lost_volumes(spec, pods[:3], claims, 4) == []


def test_a_lost_claim_is_a_lost_volume_with_or_without_its_pod():
    spec = cluster_spec()
    pods = [pod(spec, i, ready=i != 3) for i in range(4)]
    claims = [claim(spec, i, "Lost" if i == 3 else "Bound") for i in range(4)]
    (lost,) = lost_volumes(spec, pods, claims, 4)
    assert lost == LostVolume(
        3,
        "demo-storage-3",
        "data-demo-storage-3",
        "the claim is Lost (its PersistentVolume pv-3 is gone)",
        pod_exists=True,
        claim_exists=True,
    )
    (without_pod,) = lost_volumes(spec, pods[:3], claims, 4)
    assert (without_pod.ordinal, without_pod.pod_exists) == (3, False)


def test_a_claim_missing_while_its_pod_exists_is_a_lost_volume():
    spec = cluster_spec()
    pods = [pod(spec, i) for i in range(4)]
    claims = [claim(spec, i) for i in (0, 1, 3)]
    (lost,) = lost_volumes(spec, pods, claims, 4)
    assert (lost.ordinal, lost.claim_exists, lost.pod_exists) == (2, False, True)
    assert lost.reason == "the claim is missing while the pod exists"
    # Its pod being deleted too: the StatefulSet makes both again, nothing is lost.
    pods[2] = pod(spec, 2, deleting=True)
    assert lost_volumes(spec, pods, claims, 4) == []


def test_a_claim_being_deleted_counts_as_missing_and_is_no_loss_once_its_pod_goes():
    spec = cluster_spec()
    claims = [claim(spec, i, deleting=i == 1) for i in range(4)]
    (lost,) = lost_volumes(spec, [pod(spec, i) for i in range(4)], claims, 4)
    assert (lost.ordinal, lost.claim_exists) == (1, False)
    assert "being deleted" in lost.reason
    # A Lost claim being deleted, its pod gone or going: what the operator left behind
    # after deleting both, not a new loss.
    claims[1] = claim(spec, 1, "Lost", deleting=True)
    assert lost_volumes(spec, [pod(spec, i) for i in (0, 2, 3)], claims, 4) == []
    going = [pod(spec, i, deleting=i == 1) for i in range(4)]
    assert lost_volumes(spec, going, claims, 4) == []


def test_a_pod_unschedulable_for_a_volume_node_affinity_conflict_lost_its_volume():
    spec = cluster_spec()
    pods = [pod(spec, i) for i in range(3)] + [pod(spec, 3, status=UNSCHEDULABLE)]
    (lost,) = lost_volumes(spec, pods, [claim(spec, i) for i in range(4)], 4)
    assert lost.ordinal == 3 and "volume node affinity conflict" in lost.reason
    assert "its local volume's node is gone" in lost.reason


def test_a_volume_whose_node_is_only_cordoned_or_full_is_not_lost():
    """A drain evicts the pod while its node is cordoned: the other nodes conflict with its
    local volume, its own node is unschedulable. The node comes back: no loss."""
    spec = cluster_spec()
    draining = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "message": "0/3 nodes are available: 1 node(s) were unschedulable, "
                "2 node(s) had volume node affinity conflict.",
            }
        ],
    }
    pods = [pod(spec, i) for i in range(3)] + [pod(spec, 3, status=draining)]
    assert lost_volumes(spec, pods, [claim(spec, i) for i in range(4)], 4) == []


def test_only_ordinals_below_the_size_count_in_order():
    spec = cluster_spec()
    claims = [claim(spec, i, "Lost") for i in range(4)]
    assert [v.ordinal for v in lost_volumes(spec, [], claims, 4)] == [0, 1, 2, 3]
    assert [v.ordinal for v in lost_volumes(spec, [], claims, 2)] == [0, 1]


# --- the Warning and the status -------------------------------------------------------------


def started(seconds: int = 0, **changes: Any) -> Reconciliation:
    state = begin(
        body(storage={"replaceLostAfterSeconds": seconds}), {}, {"clusterKey": "k-1"}, NOW, ()
    )
    assert isinstance(state, Reconciliation)
    return replace(state, **changes)


def lost_claim(spec: ClusterSpec, number: int = 3) -> LostVolume:
    return LostVolume(
        number,
        spec.storage_pod(number),
        claim_name(spec, number),
        "the claim is Lost (its PersistentVolume pv-3 is gone)",
        pod_exists=True,
        claim_exists=True,
    )


def test_the_warning_names_pod_claim_reason_and_what_comes_next():
    off = cluster_spec(0)
    (warning,), _ = lost_volume_warnings(off, [lost_claim(off)], {}, T0, REPEAT)
    assert (warning.type, warning.reason) == ("Warning", "StorageVolumeLost")
    for words in ("demo-storage-3", "data-demo-storage-3", "pv-3 is gone"):
        assert words in warning.message
    assert "set it" in warning.message and "spec.storage.replaceLostAfterSeconds" in warning.message
    assert 'runbook "A storage node is lost"' in warning.message
    on = cluster_spec(600)
    (warning,), _ = lost_volume_warnings(on, [lost_claim(on)], {}, T0, REPEAT)
    assert "once it has been unreachable for 600 s" in warning.message
    assert "deletes the claim and the pod" in warning.message


def test_the_warning_is_posted_again_only_after_the_repeat_interval():
    spec = cluster_spec()
    lost = [lost_claim(spec)]
    first, warned = lost_volume_warnings(spec, lost, {}, T0, REPEAT)
    assert len(first) == 1 and set(warned) == {"demo-storage-3"}
    again, kept = lost_volume_warnings(spec, lost, warned, T0 + REPEAT / 2, REPEAT)
    assert again == [] and kept == warned
    later, _ = lost_volume_warnings(spec, lost, warned, T0 + REPEAT, REPEAT)
    assert later == first
    # No longer lost: forgotten, so a new loss is said at once.
    assert lost_volume_warnings(spec, [], warned, T0, REPEAT) == ([], {})


def test_without_the_setting_a_lost_volume_is_degraded_and_holds_nothing_up():
    state = started(0, view=view(), statefulset={"spec": {"replicas": 4}})
    found = lost_volumes_found(state, [lost_claim(state.spec)])
    assert found.degraded == () and len(found.attention) == 1
    assert "replace it by hand" in found.attention[0]
    assert not handles_lost_volumes(found)
    status = reported(found).status
    assert status is not None
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "NeedsAttention")
    assert "demo-storage-3" in degraded["message"]
    # Its own Warning says it: no Refused Warning besides.
    assert reported(found).events == ()
    # A refusal with it is warned alone, and once.
    refused = reported(found.refusing("scale-down refused"))
    assert refused.events == (Event("Warning", "Refused", "scale-down refused"),)
    assert refused.status is not None
    again = reported(replace(found.refusing("scale-down refused"), previous=refused.status))
    assert again.events == ()


def test_with_the_setting_a_lost_volume_is_handled_but_not_while_paused():
    state = started(600, view=view(), cluster_key="k-1", statefulset={"spec": {"replicas": 4}})
    found = lost_volumes_found(state, [lost_claim(state.spec)])
    assert found.attention == () and handles_lost_volumes(found)
    assert not handles_lost_volumes(state)  # nothing lost
    paused = replace(found, spec=replace(found.spec, paused=True))
    assert not handles_lost_volumes(paused)
    assert finds_lost_volumes(paused)  # found and warned about even then
    assert not finds_lost_volumes(replace(found, statefulset=None))


# --- waiting for the servers, then recreating -----------------------------------------------


def view(still_serving: dict[str, list[int]] | None = None) -> ClusterView:
    return ClusterView(
        root="/waltz",
        key="k-1",
        name="prod/demo",
        partitions=(),
        servers={},
        still_serving=still_serving or {},
    )


def handling(**changes: Any) -> Reconciliation:
    state = started(600, view=view(), cluster_key="k-1", statefulset={"spec": {"replicas": 4}})
    return replace(lost_volumes_found(state, [lost_claim(state.spec)]), **changes)


def test_nothing_is_recreated_during_another_change():
    assert lost_volume_held(handling()) is None
    assert "scale-down" in (lost_volume_held(handling(scale_down=Wait("copying"))) or "")
    resizing = handling(progress="storage volumes resizing: data-demo-storage-0")
    assert "waits for storage volumes resizing" in (lost_volume_held(resizing) or "")
    assert "nothing is refused" in (lost_volume_held(handling(degraded=("no",))) or "")
    rolling = handling(rolling_storage=("demo-storage-1",))
    assert "roll" in (lost_volume_held(rolling) or "")


def test_it_waits_until_the_servers_replaced_the_node():
    state = handling()
    address = state.spec.storage_address(3)
    everyone = frozenset(state.spec.storage_addresses())
    waiting = lost_volume_next(state, everyone, frozenset())
    assert isinstance(waiting, str)
    assert f"waiting for the servers to replace storage node {address}" in waiting
    replacing = lost_volume_next(state, everyone, frozenset({address}))
    assert isinstance(replacing, str) and "the servers are replacing" in replacing
    others = everyone - {address}
    # Left the assignment, but recorded as under way (its last step): still waits.
    assert isinstance(lost_volume_next(state, others, frozenset({address})), str)
    serving = replace(state, view=view({address: [1]}))
    assert "still serves a vote" in str(lost_volume_next(serving, others, frozenset()))
    assert lost_volume_next(state, others, frozenset()) == lost_claim(state.spec)


def test_one_lost_volume_at_a_time_the_first_replaced():
    state = handling()
    two = replace(state, lost_volumes=(lost_claim(state.spec, 1), lost_claim(state.spec, 3)))
    a = state.spec.storage_addresses()
    # Node 1 still in the assignment, node 3 replaced: 3 goes now, 1 waits its turn.
    chosen = lost_volume_next(two, frozenset(a[:3]), frozenset())
    assert isinstance(chosen, LostVolume) and chosen.ordinal == 3
    chosen = lost_volume_next(two, frozenset(a[0:1] + a[2:3]), frozenset())
    assert isinstance(chosen, LostVolume) and chosen.ordinal == 1


def test_recreating_is_a_normal_event_and_progress():
    state = handling()
    done = lost_volume_recreated(state, lost_claim(state.spec))
    (event,) = done.events
    assert (event.type, event.reason) == ("Normal", "StorageVolumeReplaced")
    assert "deleted claim data-demo-storage-3 and pod demo-storage-3" in event.message
    assert done.progress is not None and "demo-storage-3" in done.progress
    only_claim = replace(lost_claim(state.spec), pod_exists=False)
    (event,) = lost_volume_recreated(state, only_claim).events
    assert "deleted claim data-demo-storage-3; the StatefulSet makes" in event.message


def test_a_roll_counts_only_other_pods_off_the_revision():
    spec = cluster_spec(600)
    sts = {"spec": {"replicas": 4}, "status": {"updateRevision": "r2"}}

    def revised(number: int, revision: str) -> dict[str, Any]:
        p = pod(spec, number)
        p["metadata"]["labels"] = {"controller-revision-hash": revision}
        return p

    pods = [revised(0, "r2"), revised(1, "r1"), revised(2, "r2"), revised(3, "r1")]
    lost = [lost_claim(spec)]
    assert rolling_storage(spec, sts, pods, [], lost) == ["demo-storage-1"]
    assert rolling_storage(spec, {"spec": {"replicas": 4}}, pods, [], lost) == []


# --- joining again --------------------------------------------------------------------------


def test_a_wanted_node_missing_from_the_assignment_joins_at_the_same_size():
    """The servers replaced node 3 and its pod came back empty: the StatefulSet's size did
    not change, and node 3 joins like a new node once ready."""
    state = started(600, view=view(), cluster_key="k-1", current_storage=4)
    a = state.spec.storage_addresses()
    assignment = ReplicaAssignment({x: frozenset({0, 1, 2}) for x in a[:3]})
    pods = [pod(state.spec, i) for i in range(4)]
    joined = replace(state, membership=storage_membership(state.spec, pods, assignment, None))
    assert joining_storage(joined) == [a[3]]
    assert storage_joins(joined) and not may_balance(joined)


def test_a_node_whose_volume_is_gone_never_joins_and_nothing_is_balanced():
    state = handling(current_storage=4)
    a = state.spec.storage_addresses()
    assignment = ReplicaAssignment({x: frozenset({0, 1, 2}) for x in a[:3]})
    pods = [pod(state.spec, i) for i in range(4)]
    held = replace(state, membership=storage_membership(state.spec, pods, assignment, None))
    assert joining_storage(held) == [] and not storage_joins(held)
    assert not may_balance(held)
    everyone = ReplicaAssignment({x: frozenset({0}) for x in a})
    present = replace(held, membership=storage_membership(state.spec, pods, everyone, None))
    assert not may_balance(present)
    assert may_balance(replace(present, lost_volumes=()))


# --- where the steps are --------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_lost_volume_steps_run_before_membership_and_joining():
    steps = ReconcileSteps(None, None, ReconcileSettings(), datetime.datetime.now)  # type: ignore[arg-type]
    names = [s.name for s in steps.pipeline()]
    assert names.index("move-replicas-off-leaving-storage") < names.index("find-lost-volumes")
    assert names.index("find-lost-volumes") + 1 == names.index("recreate-lost-volume")
    assert names.index("recreate-lost-volume") < names.index("observe-storage-membership")
    dry = [Step(s.name, lambda given: given, s.when) for s in steps.pipeline()]
    ran = (await run_pipeline(dry, handling())).ran
    assert "find-lost-volumes" in ran and "recreate-lost-volume" in ran
    off = replace(handling(), spec=cluster_spec(0))
    assert "recreate-lost-volume" not in (await run_pipeline(dry, off)).ran
