"""The reconcile's pure decisions (reconcile_decisions.py) over its state
(reconciliation.py), and which steps of the declared pipeline (reconcile_steps.py) their
guards let run."""

from __future__ import annotations

import copy
import datetime
import uuid
from dataclasses import replace
from typing import Any

import pytest

from waltz_client.cluster.admin import GrowResult
from waltz_client.cluster.metadata import ClusterParams, ReplicaAssignment
from waltz_operator.bootstrap import Created, Refused, Unsupported
from waltz_operator.desired import desired_objects
from waltz_operator.events import Event
from waltz_operator.observe import ClusterView, PartitionView, ServerPartition
from waltz_operator.pipeline import Step, Stop, run_pipeline
from waltz_operator.reconcile_decisions import (
    ApplyStatefulSet,
    HoldStatefulSet,
    RecreateStatefulSet,
    cluster_ensured,
    fewer_partitions,
    grows_partitions,
    join_progress,
    joining_storage,
    leaving_storage,
    partitions_grown,
    partitions_not_grown,
    placement_groups,
    refusal_events,
    reported,
    retirement_blocked,
    scale_down_held,
    scale_down_planned,
    statefulset_held,
    statefulset_planned,
    storage_membership,
    storage_pod_states,
    storage_size_from_pods,
    update_revision,
    warning_due,
    zone_changes,
    zookeeper_awaited,
)
from waltz_operator.reconcile_settings import ReconcileSettings
from waltz_operator.reconcile_steps import ReconcileSteps
from waltz_operator.reconciliation import PAUSE_ANNOTATION, Reconciliation, begin
from waltz_operator.rollout import Assign, PodState, Refuse, Shrink, Wait
from waltz_operator.volumes import Recreate

NOW = "2026-11-23T10:00:00Z"


def body(annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "waltz.io/v1alpha1",
        "kind": "WaltzCluster",
        "metadata": {
            "name": "demo",
            "namespace": "prod",
            "uid": "u1",
            "generation": 3,
            "annotations": annotations or {},
        },
        "spec": {"zookeeper": {"connect": "zk:2181"}, "partitions": 2, **spec},
    }


def started(previous: dict[str, Any] | None = None, **spec: Any) -> Reconciliation:
    state = begin(body(**spec), {}, previous or {}, NOW, ())
    assert isinstance(state, Reconciliation)
    return state


def view(assigned: dict[int, tuple[str, ...]], still_serving=None) -> ClusterView:
    """Every assigned replica in its partition's running session."""
    return ClusterView(
        root="/waltz",
        key="k-1",
        name="prod/demo",
        partitions=tuple(
            PartitionView(
                partition=p,
                assigned=nodes,
                writing_members=frozenset(nodes),
                owner="server-0",
                generation=1,
                reported=ServerPartition(
                    generation=1, high_water_mark=10, in_session=frozenset(nodes)
                ),
            )
            for p, nodes in assigned.items()
        ),
        servers={},
        still_serving=still_serving or {},
    )


# --- beginning ------------------------------------------------------------------------------


def test_a_spec_that_does_not_parse_stops_before_any_step():
    stop = begin(body(partitions="two"), {}, {}, NOW, ())
    assert isinstance(stop, Stop) and stop.reason == "InvalidSpec"
    assert "partitions" in stop.message


def test_the_pause_annotation_pauses_and_the_address_book_is_used():
    state = begin(body({PAUSE_ANNOTATION: "True"}), None, {}, NOW, ("a:1", "b:1", "c:1"))
    assert isinstance(state, Reconciliation)
    assert state.paused and state.key == "prod/demo" and state.generation == 3
    assert state.spec.storage_addresses() == ["a:1", "b:1", "c:1"]
    assert not started().paused


def test_later_progress_replaces_earlier_and_refusals_add_up():
    state = started().waiting("first").waiting(None)
    assert state.progress == "first"
    assert state.waiting("second").progress == "second"
    refused = state.refusing(None).refusing("a").refusing("b")
    assert refused.degraded == ("a", "b")


# --- the cluster ----------------------------------------------------------------------------


def test_a_created_cluster_is_announced_an_adopted_one_is_not():
    created = cluster_ensured(started(), Created("k-1", adopted=False, partitions=2))
    assert created.cluster_key == "k-1" and created.degraded == ()
    assert created.cluster_partitions == 2
    assert [e.reason for e in created.events] == ["ClusterCreated"]
    assert "2 partitions x 3 replicas, key k-1" in created.events[0].message
    adopted = cluster_ensured(started(), Created("k-1", adopted=True, partitions=2))
    assert adopted.cluster_key == "k-1" and adopted.events == ()


def test_a_refused_create_and_an_unsupported_change_are_refusals():
    refused = cluster_ensured(started(), Refused("another cluster is there"))
    assert (refused.cluster_key, refused.create_error) == (None, "another cluster is there")
    assert refused.degraded == ("another cluster is there",)
    unsupported = cluster_ensured(started(), Unsupported("k-1", "replicasPerPartition is 3"))
    assert (unsupported.cluster_key, unsupported.create_error) == ("k-1", None)
    assert unsupported.degraded == ("replicasPerPartition is 3",)
    assert unsupported.cluster_partitions is None  # so nothing grows


# --- growing the partitions -----------------------------------------------------------------


def test_an_adopted_cluster_with_fewer_partitions_than_the_spec_is_grown_later():
    adopted = cluster_ensured(started(partitions=8), Created("k-1", adopted=True, partitions=4))
    assert (adopted.cluster_partitions, adopted.degraded, adopted.events) == (4, (), ())


def test_an_adopted_cluster_with_more_partitions_than_the_spec_is_a_refusal():
    """Partitions never shrink: a spec that asks for fewer (its CEL rule bypassed, or an
    existing cluster adopted) is refused, naming both counts; nothing changes."""
    adopted = cluster_ensured(started(partitions=2), Created("k-1", adopted=True, partitions=4))
    assert adopted.cluster_key == "k-1" and adopted.cluster_partitions == 4
    assert adopted.degraded == (
        "spec.partitions is 2, but the cluster has 4 partitions: partitions never shrink, "
        "so nothing was changed; set spec.partitions to 4 or more to clear this",
    )
    assert not grows_partitions(replace(adopted, view=view({})))
    # The Degraded condition becomes a Warning, once.
    warned = reported(adopted)
    assert [(e.type, e.reason) for e in warned.events] == [("Warning", "Refused")]
    assert "the cluster has 4 partitions" in warned.events[0].message


def test_fewer_partitions_only_when_the_spec_asks_for_fewer():
    assert fewer_partitions(4, 4) is None and fewer_partitions(8, 4) is None
    assert "spec.partitions is 3, but the cluster has 4" in (fewer_partitions(3, 4) or "")


def grow_result(before: int, after: int) -> GrowResult:
    params = ClusterParams("prod/demo", uuid.UUID(int=1), after, 3)
    return GrowResult(after != before, before, params, ReplicaAssignment({}))


def test_partitions_grow_only_when_the_spec_has_more_and_nothing_else_is_going_on():
    ready = running(cluster_partitions=1)  # the spec asks for 2
    assert grows_partitions(ready)
    assert not grows_partitions(replace(ready, cluster_partitions=2))
    assert not grows_partitions(replace(ready, cluster_partitions=3))
    assert not grows_partitions(replace(ready, cluster_partitions=None))  # not read
    assert not grows_partitions(replace(ready, spec=replace(ready.spec, paused=True)))
    assert not grows_partitions(replace(ready, cluster_key=None))
    assert not grows_partitions(replace(ready, view=None))
    # One change at a time: not while a scale or a volume change is under way, nor while
    # something is refused.
    assert not grows_partitions(ready.waiting("scaling storage up: waiting for x"))
    assert not grows_partitions(ready.refusing("volumes cannot shrink"))


def test_grown_partitions_are_an_event_and_progress():
    grown = partitions_grown(running(cluster_partitions=1), grow_result(1, 2))
    assert grown.cluster_partitions == 2
    assert grown.events == (Event("Normal", "PartitionsAdded", "grew from 1 to 2 partitions"),)
    assert grown.progress == "partitions grown from 1 to 2: the new ones are being taken up"
    assert not grows_partitions(grown)
    # Someone grew them meanwhile: nothing to say.
    already = partitions_grown(running(cluster_partitions=1), grow_result(2, 2))
    assert (already.cluster_partitions, already.events, already.progress) == (2, (), None)


def test_a_refused_growth_is_a_refusal_naming_both_counts():
    refused = partitions_not_grown(running(cluster_partitions=1), "too few storage nodes")
    assert refused.degraded == ("growing the partitions from 1 to 2 failed: too few storage nodes",)
    assert refused.cluster_partitions == 1 and refused.events == ()


def test_a_known_cluster_waits_for_zookeeper_to_confirm_it():
    state = zookeeper_awaited(started({"clusterKey": "k-1"}))
    assert state.known_key == "k-1"
    assert state.progress == (
        "changes wait until ZooKeeper at zk:2181 confirms the cluster (key k-1) is at "
        + state.spec.zk_root
    )


# --- scaling down ---------------------------------------------------------------------------


def test_no_scale_down_applies_the_spec_size():
    state = scale_down_planned(replace(started(), current_storage=3))
    assert (state.scale_down, state.storage_size) == (None, 3)


def test_a_scale_down_keeps_the_current_size_and_waits_without_a_view():
    state = scale_down_planned(replace(started(), current_storage=5))
    assert state.scale_down == Wait("waiting to see the cluster's quorum state")
    assert state.storage_size == 5


def test_a_scale_down_takes_the_next_rollout_step():
    base = started()
    a = base.spec.storage_addresses(4)
    state = replace(base, current_storage=4, view=view({0: tuple(a[1:4]), 1: tuple(a[0:3])}))
    planned = scale_down_planned(state)
    assert planned.scale_down == Assign({a[0]: frozenset({0})})
    assert planned.storage_size == 4
    unmoved = replace(state, view=view({0: tuple(a[0:3]), 1: tuple(a[0:3])}))
    assert scale_down_planned(unmoved).scale_down == Shrink(3)


def test_a_refused_scale_down_is_a_refusal_a_waiting_one_is_progress():
    state = replace(started(), scale_down=Refuse("too few nodes"))
    assert scale_down_held(state).degraded == ("scale-down to 3 refused: too few nodes",)
    waiting = scale_down_held(replace(state, scale_down=Wait("copying")))
    assert waiting.progress == "scaling storage down: copying" and waiting.degraded == ()


def test_leaving_nodes_retire_only_once_none_serves_a_vote():
    spec = started().spec
    leaving = leaving_storage(spec, 5, Shrink(3))
    assert leaving == spec.storage_addresses(5)[3:]
    blocked = retirement_blocked(leaving, view({}, still_serving={leaving[1]: [0]}))
    assert blocked == f"scaling storage down: {leaving[1]} still serve a vote"
    assert retirement_blocked(leaving, view({})) is None


def test_the_storage_size_without_a_statefulset_counts_the_pods_it_left():
    spec = started().spec

    def pod(name: str) -> dict[str, Any]:
        return {"metadata": {"name": name}}

    assert storage_size_from_pods(spec, []) == 3
    pods = [pod("demo-storage-0"), pod("demo-storage-4"), pod("demo-server-7")]
    assert storage_size_from_pods(spec, pods) == 5


# --- the storage StatefulSet ----------------------------------------------------------------


def statefulset(state: Reconciliation, size: str = "10Gi") -> dict[str, Any]:
    spec = replace(state.spec, storage=replace(state.spec.storage, size=size))
    return copy.deepcopy(next(o for o in desired_objects(spec) if o["kind"] == "StatefulSet"))


def claim(number: int, size: str = "10Gi", capacity: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": []}
    if capacity:
        status["capacity"] = {"storage": capacity}
    return {
        "metadata": {"name": f"data-demo-storage-{number}", "labels": {}},
        "spec": {"resources": {"requests": {"storage": size}}},
        "status": status,
    }


def test_a_statefulset_not_ours_or_going_is_held():
    state = started(storage={"size": "10Gi"})
    live = statefulset(state)
    assert statefulset_held(state.spec, live) is None
    foreign = copy.deepcopy(live)
    foreign["metadata"]["ownerReferences"] = [
        {"kind": "WaltzCluster", "uid": "someone-else", "controller": True}
    ]
    held = statefulset_held(state.spec, foreign)
    assert isinstance(held, HoldStatefulSet) and "does not own" in (held.refusal or "")
    going = copy.deepcopy(live)
    going["metadata"]["deletionTimestamp"] = NOW
    assert statefulset_held(state.spec, going) == HoldStatefulSet(
        progress="storage volumes: waiting for the old StatefulSet to go"
    )


def test_grown_volumes_recreate_the_statefulset_unless_it_is_scaling():
    state = started(storage={"size": "20Gi"})
    live, desired = statefulset(state, "10Gi"), statefulset(state, "20Gi")
    claims = [claim(i) for i in range(3)]
    plan = statefulset_planned(state.spec, desired, live, claims, current=3)
    assert isinstance(plan, RecreateStatefulSet) and isinstance(plan.change, Recreate)
    assert [p.name for p in plan.change.patches] == [c["metadata"]["name"] for c in claims]
    kept = plan.instead["spec"]["volumeClaimTemplates"]
    assert kept == live["spec"]["volumeClaimTemplates"]
    scaling = statefulset_planned(state.spec, desired, live, claims, current=4)
    assert isinstance(scaling, ApplyStatefulSet)
    assert scaling.obj["spec"]["volumeClaimTemplates"] == kept
    assert (scaling.progress or "").endswith("waits for scaling to end")


def test_shrunk_volumes_are_refused_and_the_live_template_kept():
    state = started(storage={"size": "5Gi"})
    live, desired = statefulset(state, "10Gi"), statefulset(state, "5Gi")
    plan = statefulset_planned(state.spec, desired, live, [claim(0)], current=3)
    assert isinstance(plan, ApplyStatefulSet) and "cannot shrink" in (plan.refusal or "")
    assert plan.obj["spec"]["volumeClaimTemplates"] == live["spec"]["volumeClaimTemplates"]


def test_volumes_still_growing_are_progress():
    state = started(storage={"size": "10Gi"})
    live = statefulset(state)
    claims = [claim(0, capacity="5Gi"), claim(1, capacity="10Gi")]
    plan = statefulset_planned(state.spec, live, live, claims, current=3)
    assert plan == ApplyStatefulSet(live, progress="storage volumes resizing: data-demo-storage-0")
    assert statefulset_planned(state.spec, live, live, claims[1:], current=3) == ApplyStatefulSet(
        live
    )


# --- scaling up -----------------------------------------------------------------------------


def pod(state: Reconciliation, number: int, ready: bool = True, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": state.spec.storage_pod(number), **meta},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_new_nodes_join_once_ready():
    state = started(storage={"replicas": 4})
    a = state.spec.storage_addresses()
    pods = [pod(state, i, ready=i != 3) for i in range(4)]
    assignment = ReplicaAssignment({x: frozenset({0, 1}) for x in a[:3]})
    membership = storage_membership(state.spec, pods, assignment, None)
    assert membership.ready == frozenset(a[:3]) and membership.known == frozenset(a[:3])
    joining = replace(state, membership=membership)
    assert joining_storage(joining) == [a[3]]
    assert join_progress([a[3]], membership.ready) == (
        f"scaling storage up: waiting for {a[3]} to be ready"
    )
    assert join_progress([a[3]], frozenset(a)) == "scaling storage up: new nodes joined"


def test_zones_become_placement_groups_written_only_when_they_differ():
    state = started()
    a = state.spec.storage_addresses()
    groups = {a[0]: 1, a[1]: 0, a[2]: 0}
    assignment = ReplicaAssignment({x: frozenset({0}) for x in a}, groups=groups)
    zones = {a[0]: "east", a[1]: "west", a[2]: None}
    membership = storage_membership(state.spec, [], assignment, zones)
    assert placement_groups(membership) == {a[0]: 1, a[1]: 2, a[2]: 0}
    assert zone_changes(membership) == {a[1]: 2}
    unknown = storage_membership(state.spec, [], assignment, None)
    assert placement_groups(unknown) == groups and zone_changes(unknown) == {}


# --- rolling --------------------------------------------------------------------------------


def test_pod_states_for_a_roll():
    state = started()
    live = {"spec": {"replicas": 3}, "status": {"updateRevision": "r2"}}
    assert update_revision(live) == "r2"
    assert update_revision(None) is None and update_revision({"status": {}}) is None
    pods = [
        pod(state, 0, labels={"controller-revision-hash": "r2"}),
        pod(state, 1, labels={"controller-revision-hash": "r1"}),
    ]
    remount = claim(0)
    remount["status"]["conditions"] = [{"type": "FileSystemResizePending", "status": "True"}]
    names = [state.spec.storage_pod(i) for i in range(3)]
    addresses = state.spec.storage_addresses()
    assert storage_pod_states(state.spec, live, pods, []) == [
        PodState(names[0], addresses[0], ready=True, current=True),
        PodState(names[1], addresses[1], ready=True, current=False),
        PodState(names[2], addresses[2], ready=False, current=True),  # being replaced
    ]
    # A volume that grows only when mounted again makes its pod restart.
    assert not storage_pod_states(state.spec, live, pods, [remount])[0].current


# --- reporting ------------------------------------------------------------------------------


def test_the_status_is_computed_and_a_new_refusal_warned_once():
    state = replace(started(), cluster_key="k-1").refusing("scale-down refused")
    first = reported(state)
    assert first.status is not None and first.status["clusterKey"] == "k-1"
    assert first.events == (Event("Warning", "Refused", "scale-down refused"),)
    again = reported(replace(state, previous=first.status))
    assert again.events == ()


def test_refusal_events_only_when_the_degraded_message_changes():
    def status(degraded: str, message: str) -> dict[str, Any]:
        return {"conditions": [{"type": "Degraded", "status": degraded, "message": message}]}

    assert refusal_events({}, status("True", "a")) == [Event("Warning", "Refused", "a")]
    assert refusal_events(status("True", "a"), status("True", "a")) == []
    assert refusal_events(status("True", "a"), status("True", "b"))[0].message == "b"
    assert refusal_events({}, status("False", "fine")) == []
    # What follows the refusals (a lost volume, with a Warning of its own) is not one.
    assert refusal_events({}, status("True", "lost"), ()) == []
    assert refusal_events(status("True", "lost"), status("True", "a; lost"), ["a"]) == [
        Event("Warning", "Refused", "a")
    ]
    assert refusal_events(status("True", "a; lost"), status("True", "a"), ["a"]) == []


def test_a_failures_warning_repeats_only_when_new_or_after_the_interval():
    t0 = datetime.datetime(2026, 11, 23, tzinfo=datetime.UTC)
    repeat = datetime.timedelta(seconds=600)
    assert warning_due(None, "a", t0, repeat)
    assert not warning_due(("a", t0), "a", t0 + repeat / 2, repeat)
    assert warning_due(("a", t0), "b", t0 + repeat / 2, repeat)
    assert warning_due(("a", t0), "a", t0 + repeat, repeat)


# --- which steps of the declared pipeline run -----------------------------------------------


OBSERVING = (
    "read-storage-statefulset",
    "secure",
    "resolve-zookeeper-access",
    "watch-cluster",
    "measure-storage",
    "look-at-cluster",
)
REPORTING = ("count-ready", "report")


def declared() -> tuple[Step[Reconciliation], ...]:
    steps = ReconcileSteps(None, None, ReconcileSettings(), datetime.datetime.now)  # type: ignore[arg-type]
    return steps.pipeline()


async def steps_run(state: Reconciliation) -> tuple[str, ...]:
    """The names of the declared steps whose guards let them run, each step leaving the
    state as it found it (what a step does is the other tests' business)."""
    dry = [Step(s.name, lambda given: given, s.when) for s in declared()]
    return (await run_pipeline(dry, state)).ran


def running(**changes: Any) -> Reconciliation:
    """A created cluster, seen, its StatefulSet rolling to a new revision."""
    base = started({"clusterKey": "k-1"})
    a = base.spec.storage_addresses()
    membership = storage_membership(
        base.spec, [], ReplicaAssignment({x: frozenset({0, 1}) for x in a}), None
    )
    state = replace(
        base,
        cluster_key="k-1",
        view=view({0: tuple(a), 1: tuple(a)}),
        statefulset={"spec": {"replicas": 3}, "status": {"updateRevision": "r2"}},
        membership=membership,
    )
    return replace(state, **changes)


def test_the_declared_order():
    assert [s.name for s in declared()] == [
        *OBSERVING,
        "ensure-cluster",
        "await-zookeeper",
        "plan-scale-down",
        "retire-leaving-storage",
        "apply-objects",
        "hold-scale-down",
        "move-replicas-off-leaving-storage",
        "find-lost-volumes",
        "recreate-lost-volume",
        "observe-storage-membership",
        "join-new-storage",
        "place-storage-in-zones",
        "balance-replicas",
        "grow-partitions",
        "roll-storage",
        "recall-cluster-key",
        *REPORTING,
    ]


@pytest.mark.asyncio
async def test_a_new_cluster_is_created_and_its_objects_applied():
    assert await steps_run(started()) == (
        *OBSERVING,
        "ensure-cluster",
        "plan-scale-down",
        "apply-objects",
        *REPORTING,
    )


@pytest.mark.asyncio
async def test_a_running_cluster_may_scale_balance_and_roll():
    assert await steps_run(running()) == (
        *OBSERVING,
        "ensure-cluster",
        "plan-scale-down",
        "apply-objects",
        "find-lost-volumes",
        "observe-storage-membership",
        "balance-replicas",
        "roll-storage",
        *REPORTING,
    )


@pytest.mark.asyncio
async def test_a_paused_cluster_is_only_observed_and_reported():
    paused = running(spec=replace(running().spec, paused=True), cluster_key=None)
    assert await steps_run(paused) == (
        *OBSERVING,
        "find-lost-volumes",  # found and warned about, never acted on
        "recall-cluster-key",
        *REPORTING,
    )


@pytest.mark.asyncio
async def test_a_known_cluster_changes_nothing_while_zookeeper_is_away():
    away = running(zookeeper_error="connection refused", cluster_key=None, view=None)
    assert await steps_run(away) == (
        *OBSERVING,
        "await-zookeeper",
        "find-lost-volumes",
        *REPORTING,
    )


@pytest.mark.asyncio
async def test_a_refusal_stops_scaling_but_not_the_roll_and_progress_stops_the_roll():
    refused = running(degraded=("volumes cannot shrink",))
    assert await steps_run(refused) == (
        *OBSERVING,
        "ensure-cluster",
        "plan-scale-down",
        "apply-objects",
        "find-lost-volumes",
        "roll-storage",
        *REPORTING,
    )
    busy = running(progress="storage volumes resizing")
    assert "roll-storage" not in await steps_run(busy)


@pytest.mark.asyncio
async def test_scale_down_steps_run_by_the_step_decided():
    state = running(current_storage=4)
    a = state.spec.storage_addresses(4)
    held = await steps_run(replace(state, scale_down=Wait("copying")))
    assert "hold-scale-down" in held and "observe-storage-membership" not in held
    moving = await steps_run(replace(state, scale_down=Assign({a[0]: frozenset({0})})))
    assert "move-replicas-off-leaving-storage" in moving and "hold-scale-down" not in moving
    shrinking = await steps_run(replace(state, scale_down=Shrink(3)))
    assert shrinking[shrinking.index("plan-scale-down") + 1] == "retire-leaving-storage"
    assert "observe-storage-membership" not in shrinking


@pytest.mark.asyncio
async def test_new_storage_joins_before_anything_is_balanced():
    state = running(
        spec=replace(running().spec, storage=replace(running().spec.storage, replicas=4))
    )
    ran = await steps_run(state)
    assert "join-new-storage" in ran
    assert "place-storage-in-zones" not in ran and "balance-replicas" not in ran


@pytest.mark.asyncio
async def test_partitions_grow_after_the_scale_steps_and_before_the_roll():
    ran = await steps_run(running(cluster_partitions=1))
    assert ran[ran.index("balance-replicas") + 1 :] == (
        "grow-partitions",
        "roll-storage",
        *REPORTING,
    )
    assert "grow-partitions" not in await steps_run(running(cluster_partitions=2))
    # A step above under way (here, new storage joining) goes first.
    joining = running(cluster_partitions=1, progress="scaling storage up: new nodes joined")
    assert "grow-partitions" not in await steps_run(joining)
