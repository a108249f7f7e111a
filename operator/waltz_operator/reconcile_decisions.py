"""The reconcile's decisions, over its state (reconciliation.py). Pure.

Two kinds: the guards, which say whether a step of the pipeline runs (reconcile_steps.py
declares which guard goes with which step), and what a step makes of what it found: the
next state, the objects to apply, the Events to post, the status. The steps themselves
only read the world, call these, and carry out what they decide.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from waltz_client.cluster.admin import GrowResult
from waltz_client.cluster.metadata import ReplicaAssignment

from .bootstrap import Created, Refused, Unsupported, cluster_name
from .events import Event
from .lost_volumes import LostVolume
from .observe import ClusterView
from .owned import controlled_by
from .reconciliation import Reconciliation, StorageMembership
from .rollout import (
    Assign,
    Done,
    PodState,
    Refuse,
    Shrink,
    Unassign,
    Wait,
    next_rebalance_step,
    next_scale_down_step,
)
from .spec import ClusterSpec
from .status import Observed, compute_status
from .upgrade_order import (
    STORAGE_CONTAINER,
    ServerDeployment,
    StoragePod,
    container_image,
    servers_to_apply,
)
from .volumes import Recreate, RefuseVolumeChange, needs_restart_to_resize, plan_volume_change
from .volumes import resizing as claims_resizing
from .zones import group_changes, zone_groups

REVISION_LABEL = "controller-revision-hash"
# While the same failure (or lost volume) lasts, its Warning Event is posted again this
# often (seconds).
WARNING_REPEAT = 600.0
# Where the runbooks for a lost storage node are.
LOST_NODE_RUNBOOK = 'docs/operations.md, runbook "A storage node is lost"'


def pod_ready(pod: Mapping[str, Any]) -> bool:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def ordinal(pod: Mapping[str, Any]) -> int:
    return int(pod["metadata"]["name"].rsplit("-", 1)[1])


# --- guards: which steps run ---------------------------------------------------------------
# Nothing changes while paused: only the steps that observe and report run then.


def may_create(state: Reconciliation) -> bool:
    """CreateCluster (or adopt it) once ZooKeeper answers."""
    return not state.paused and state.zookeeper_error is None


def waits_for_zookeeper(state: Reconciliation) -> bool:
    """A resource whose cluster exists changes nothing until ZooKeeper confirms it is where
    its spec points (a moved spec.zookeeper never strands the pods)."""
    return not state.paused and state.zookeeper_error is not None and state.known_key is not None


def may_apply(state: Reconciliation) -> bool:
    return not state.paused and (state.cluster_key is not None or state.known_key is None)


def retires_storage(state: Reconciliation) -> bool:
    return may_apply(state) and isinstance(state.scale_down, Shrink) and state.view is not None


def may_scale(state: Reconciliation) -> bool:
    """No scaling step while anything is refused."""
    return (
        not state.paused
        and state.cluster_key is not None
        and state.view is not None
        and not state.degraded
    )


def scale_down_holds(state: Reconciliation) -> bool:
    return may_scale(state) and isinstance(state.scale_down, Refuse | Wait)


def scale_down_moves(state: Reconciliation) -> bool:
    return may_scale(state) and isinstance(state.scale_down, Assign | Unassign)


def scales_up(state: Reconciliation) -> bool:
    """Not scaling down: new nodes may join, and replicas spread to them."""
    return may_scale(state) and state.scale_down is None


def storage_joins(state: Reconciliation) -> bool:
    return scales_up(state) and state.membership is not None and bool(joining_storage(state))


def storage_moves_zone(state: Reconciliation) -> bool:
    """Once every wanted node has joined."""
    return (
        scales_up(state)
        and state.membership is not None
        and not joining_storage(state)
        and bool(zone_changes(state.membership))
    )


def may_balance(state: Reconciliation) -> bool:
    """Not while a storage pod's volume is gone: its node is replaced first (by the
    servers, or by hand), and replicas must not move onto it meanwhile."""
    return (
        scales_up(state)
        and state.membership is not None
        and not joining_storage(state)
        and not state.lost_volumes
    )


def finds_lost_volumes(state: Reconciliation) -> bool:
    """Storage pods whose volume is gone are looked for whenever there is a StatefulSet,
    paused or not (finding them only reports)."""
    return state.statefulset is not None


def handles_lost_volumes(state: Reconciliation) -> bool:
    """With spec.storage.replaceLostAfterSeconds set, a lost volume is recreated once the
    servers have replaced its node (``lost_volume_held`` says when not to, and why)."""
    return (
        not state.paused
        and bool(state.lost_volumes)
        and state.spec.storage.replace_lost_after > 0
        and state.cluster_key is not None
        and state.view is not None
    )


def grows_partitions(state: Reconciliation) -> bool:
    """A larger spec.partitions is applied once no other change is under way and nothing
    is refused: one change at a time (new partitions are placed on the storage nodes the
    assignment has, so not while nodes join or leave)."""
    return (
        not state.paused
        and state.cluster_key is not None
        and state.view is not None
        and state.cluster_partitions is not None
        and state.spec.partitions > state.cluster_partitions
        and state.progress is None
        and not state.degraded
    )


def may_roll(state: Reconciliation) -> bool:
    """Rolling waits for every other step: one change at a time."""
    return (
        not state.paused
        and state.cluster_key is not None
        and state.view is not None
        and state.progress is None
        and update_revision(state.statefulset) is not None
    )


def recalls_cluster_key(state: Reconciliation) -> bool:
    """While paused, the status still names the cluster the monitor sees."""
    return state.paused and state.view is not None


def cluster_key_recalled(state: Reconciliation) -> Reconciliation:
    assert state.view is not None
    return replace(state, cluster_key=state.view.key)


# --- creating the cluster ------------------------------------------------------------------


def cluster_ensured(
    state: Reconciliation, result: Created | Refused | Unsupported
) -> Reconciliation:
    if isinstance(result, Created):
        state = replace(state, cluster_key=result.key, cluster_partitions=result.partitions)
        if result.adopted:
            return state.refusing(fewer_partitions(state.spec.partitions, result.partitions))
        spec = state.spec
        return state.told(
            Event(
                "Normal",
                "ClusterCreated",
                f"created cluster {cluster_name(spec)} at {spec.zk_root}: "
                f"{spec.partitions} partitions x "
                f"{spec.replicas_per_partition} replicas, key {result.key}",
            )
        )
    if isinstance(result, Unsupported):
        return replace(state, cluster_key=result.key).refusing(result.reason)
    return replace(state, create_error=result.reason).refusing(result.reason)


def zookeeper_awaited(state: Reconciliation) -> Reconciliation:
    return state.waiting(
        f"changes wait until ZooKeeper at {state.spec.zookeeper} confirms the cluster "
        f"(key {state.known_key}) is at {state.spec.zk_root}"
    )


# --- growing the partitions ----------------------------------------------------------------


def fewer_partitions(wanted: int, have: int) -> str | None:
    """Partitions never shrink. The CRD's rule refuses a lower spec.partitions, so this
    is a spec that bypassed it, or an adopted cluster that has more partitions than the
    spec; the cluster keeps them all."""
    if wanted >= have:
        return None
    return (
        f"spec.partitions is {wanted}, but the cluster has {have} partitions: partitions "
        f"never shrink, so nothing was changed; set spec.partitions to {have} or more to "
        f"clear this"
    )


def partitions_grown(state: Reconciliation, result: GrowResult) -> Reconciliation:
    """After ``admin.add_partitions``. Not grown: the cluster already had that count
    (grown by someone else since it was read). The storage nodes, servers and clients
    follow the new count by themselves: what is left is their taking it up, which the
    monitor's next view shows; the roll waits for that reconcile."""
    now = result.params.num_partitions
    state = replace(state, cluster_partitions=now)
    if not result.grown:
        return state
    return state.told(
        Event("Normal", "PartitionsAdded", f"grew from {result.before} to {now} partitions")
    ).waiting(f"partitions grown from {result.before} to {now}: the new ones are being taken up")


def partitions_not_grown(state: Reconciliation, error: object) -> Reconciliation:
    """The admin refused (nothing was changed): a refusal, tried again each reconcile."""
    return state.refusing(
        f"growing the partitions from {state.cluster_partitions} to {state.spec.partitions} "
        f"failed: {error}"
    )


# --- scaling down --------------------------------------------------------------------------


def storage_size_from_pods(spec: ClusterSpec, pods: Sequence[Mapping[str, Any]]) -> int:
    """Without a StatefulSet, the storage pods it left count: one made again smaller than
    them would delete the highest ordinals at once, past every safe scale-down step."""
    storage = [
        ordinal(p) for p in pods if p["metadata"]["name"].startswith(f"{spec.storage_service}-")
    ]
    return max([spec.storage.replicas, *(o + 1 for o in storage)])


def scale_down_planned(state: Reconciliation) -> Reconciliation:
    """The next scale-down step, if the spec asks for fewer storage nodes than there are;
    the StatefulSet keeps its current size until the last step."""
    spec, current, view = state.spec, state.current_storage, state.view
    if spec.storage.replicas >= current:
        return replace(state, scale_down=None, storage_size=spec.storage.replicas)
    down = (
        next_scale_down_step(
            spec.storage_addresses(current),
            spec.storage.replicas,
            view.rollout_states(),
            spec.replicas_per_partition,
        )
        if view is not None
        else Wait("waiting to see the cluster's quorum state")
    )
    return replace(state, scale_down=down, storage_size=current)


def leaving_storage(spec: ClusterSpec, current: int, down: Shrink) -> list[str]:
    return spec.storage_addresses(current)[down.replicas :]


def retirement_blocked(leaving: Sequence[str], view: ClusterView) -> str | None:
    """The leaving nodes (which hold nothing now) leave the assignment once none of them
    serves a vote any more."""
    serving = sorted(a for a in leaving if a in view.still_serving)
    if serving:
        return f"scaling storage down: {', '.join(serving)} still serve a vote"
    return None


def scaled_down(current: int, down: Shrink, leaving: Sequence[str]) -> Event:
    return Event(
        "Normal",
        "ScaledDown",
        f"storage scaled down from {current} to {down.replicas}; replicas moved off "
        f"{', '.join(leaving)}",
    )


def scale_down_held(state: Reconciliation) -> Reconciliation:
    down = state.scale_down
    if isinstance(down, Refuse):
        return state.refusing(f"scale-down to {state.spec.storage.replicas} refused: {down.reason}")
    assert isinstance(down, Wait)
    return state.waiting(f"scaling storage down: {down.reason}")


def replicas_moved(step: Assign | Unassign, address: str, partitions: frozenset[int]) -> Event:
    verb = "assigned to" if isinstance(step, Assign) else "taken off"
    return Event(
        "Normal",
        "ReplicasMoved",
        f"partitions {', '.join(map(str, sorted(partitions)))} {verb} {address}",
    )


# --- the storage StatefulSet ---------------------------------------------------------------


@dataclass(frozen=True)
class HoldStatefulSet:
    """Apply nothing to the live StatefulSet, and say why."""

    progress: str | None = None
    refusal: str | None = None


@dataclass(frozen=True)
class ApplyStatefulSet:
    obj: Mapping[str, Any]
    progress: str | None = None
    refusal: str | None = None


@dataclass(frozen=True)
class RecreateStatefulSet:
    """Patch the claims, then delete the StatefulSet leaving its pods (the next reconcile
    makes it again with the new claim template); ``instead`` is what to apply if the
    claims cannot grow."""

    change: Recreate
    instead: Mapping[str, Any]


def keep_claim_template(desired: Mapping[str, Any], live: Mapping[str, Any]) -> dict[str, Any]:
    """The desired StatefulSet with the live one's claim template, which cannot change."""
    spec = {**desired["spec"], "volumeClaimTemplates": live["spec"].get("volumeClaimTemplates", [])}
    return {**desired, "spec": spec}


def statefulset_held(spec: ClusterSpec, live: Mapping[str, Any]) -> HoldStatefulSet | None:
    """Before its claims are even read: one this WaltzCluster does not own is never applied
    over (let alone deleted and made again); one being deleted is waited for."""
    if not controlled_by(live, spec.uid):
        return HoldStatefulSet(
            refusal=(
                f"a StatefulSet {spec.storage_service} that this WaltzCluster does "
                f"not own is in the namespace; nothing was applied to it: rename or "
                f"delete it"
            )
        )
    if (live.get("metadata") or {}).get("deletionTimestamp"):
        return HoldStatefulSet(progress="storage volumes: waiting for the old StatefulSet to go")
    return None


def statefulset_planned(
    spec: ClusterSpec,
    desired: Mapping[str, Any],
    live: Mapping[str, Any],
    claims: Sequence[Mapping[str, Any]],
    current: int,
) -> ApplyStatefulSet | RecreateStatefulSet:
    """Its claim template cannot be updated: a new volume size is taken by patching the
    claims and recreating the StatefulSet, but not while it is being scaled."""
    plan = plan_volume_change(live, desired, claims)
    if isinstance(plan, RefuseVolumeChange):
        return ApplyStatefulSet(keep_claim_template(desired, live), refusal=plan.reason)
    if isinstance(plan, Recreate):
        if spec.storage.replicas != current:
            return ApplyStatefulSet(
                keep_claim_template(desired, live),
                progress=f"storage volumes: {plan.reason}; waits for scaling to end",
            )
        return RecreateStatefulSet(plan, keep_claim_template(desired, live))
    waiting = claims_resizing(claims)
    return ApplyStatefulSet(
        desired, progress=f"storage volumes resizing: {', '.join(waiting)}" if waiting else None
    )


def volumes_changing(change: Recreate) -> Event:
    return Event(
        "Normal",
        "VolumesChanging",
        f"{change.reason}: patched "
        f"{', '.join(p.name for p in change.patches) or 'no claims'}; "
        f"the StatefulSet is recreated (its pods keep running)",
    )


def claims_cannot_grow(change: Recreate, error: object) -> str:
    return (
        f"spec.storage.size: the volumes cannot grow ({change.reason}): {error}; "
        f"allow expansion on their StorageClass (allowVolumeExpansion: true)"
    )


# --- the server Deployment: after the storage nodes, on an upgrade ------------------------


def storage_pods_running(
    spec: ClusterSpec, pods: Sequence[Mapping[str, Any]], count: int
) -> list[StoragePod]:
    """The storage pods ``0..count-1`` as they run, for ``upgrade_order``: a pod missing
    or being deleted runs nothing yet."""
    by_ordinal = {ordinal(p): p for p in pods}
    running = []
    for number in range(count):
        pod = by_ordinal.get(number)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            running.append(StoragePod(spec.storage_pod(number), None, None, ready=False))
            continue
        running.append(
            StoragePod(
                spec.storage_pod(number),
                container_image(pod, STORAGE_CONTAINER),
                (pod["metadata"].get("labels") or {}).get(REVISION_LABEL),
                ready=pod_ready(pod),
            )
        )
    return running


def servers_planned(
    state: Reconciliation,
    desired: Mapping[str, Any],
    live: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
) -> ServerDeployment:
    """The server Deployment to apply (``upgrade_order.servers_to_apply``): the storage
    pods are those of the StatefulSet as it was found (without one, the storage nodes
    there are), on its update revision, running the spec's storage image."""
    statefulset = state.statefulset
    count = int(statefulset["spec"]["replicas"]) if statefulset else state.current_storage
    return servers_to_apply(
        desired,
        live,
        state.spec.image.of("storage"),
        update_revision(statefulset),
        storage_pods_running(state.spec, pods, count),
    )


def servers_applied(state: Reconciliation, plan: ServerDeployment, first: bool) -> Reconciliation:
    """After applying it: the hold for the report; an Event when the servers are released,
    the first time this process applies that Deployment (``first``; an operator that
    restarted after applying it finds the new image live, and no upgrade to end)."""
    state = replace(state, servers_held=plan.held)
    if plan.released is None or not first:
        return state
    return state.told(
        Event(
            "Normal",
            "UpgradingServers",
            f"storage nodes upgraded; rolling the servers to {plan.released}",
        )
    )


# --- scaling up ----------------------------------------------------------------------------


def storage_membership(
    spec: ClusterSpec,
    pods: Sequence[Mapping[str, Any]],
    assignment: ReplicaAssignment,
    zones: Mapping[str, str | None] | None,
) -> StorageMembership:
    return StorageMembership(
        ready=frozenset(spec.storage_address(ordinal(p)) for p in pods if pod_ready(p)),
        known=frozenset(assignment.storages),
        assigned_groups=dict(assignment.groups),
        zones=zones,
    )


def placement_groups(membership: StorageMembership) -> dict[str, int]:
    """The nodes' zones as placement groups; without zones, the groups assigned already."""
    if membership.zones is not None:
        return zone_groups(membership.zones)
    return dict(membership.assigned_groups)


def joining_storage(state: Reconciliation) -> list[str]:
    """The wanted storage nodes not in the assignment: new ones (scaling up), and one the
    servers replaced whose pod came back with an empty volume; never one whose volume is
    gone (it would join with no data, or come back with its old data's gap)."""
    known = state.membership.known if state.membership is not None else frozenset()
    lost = {state.spec.storage_address(v.ordinal) for v in state.lost_volumes}
    return [a for a in state.spec.storage_addresses() if a not in known and a not in lost]


def storage_joined(address: str) -> Event:
    return Event("Normal", "StorageAdded", f"{address} joined the cluster")


def join_progress(new: Sequence[str], ready: frozenset[str]) -> str:
    waiting = [a for a in new if a not in ready]
    if waiting:
        return f"scaling storage up: waiting for {', '.join(waiting)} to be ready"
    return "scaling storage up: new nodes joined"


def zone_changes(membership: StorageMembership) -> dict[str, int]:
    return group_changes(membership.assigned_groups, placement_groups(membership))


def zones_found(changes: Mapping[str, int], zones: Mapping[str, str | None]) -> Event:
    return Event(
        "Normal",
        "ZonesFound",
        "storage nodes' zones as placement groups: "
        + ", ".join(f"{a} in {zones.get(a) or 'no zone'}" for a in sorted(changes)),
    )


def balance_step(state: Reconciliation) -> Assign | Unassign | Wait | Done:
    """Spread the replicas over the nodes in the assignment."""
    assert state.membership is not None and state.view is not None
    in_assignment = {a for p in state.view.partitions for a in p.assigned}
    known = state.membership.known
    return next_rebalance_step(
        [a for a in state.spec.storage_addresses() if a in known or a in in_assignment],
        state.view.rollout_states(),
        state.spec.replicas_per_partition,
        placement_groups(state.membership),
    )


# --- storage pods whose volume is gone --------------------------------------------------------


def lost_volume_warning(spec: ClusterSpec, lost: LostVolume) -> Event:
    """The Warning for a lost volume: which pod and claim, why, and what happens next."""
    address = spec.storage_address(lost.ordinal)
    seconds = spec.storage.replace_lost_after
    if seconds:
        then = (
            f"the servers replace storage node {address} once it has been unreachable for "
            f"{seconds} s (spec.storage.replaceLostAfterSeconds): its replicas move to the "
            f"other storage nodes and it leaves the replica assignment; the operator then "
            f"deletes the claim and the pod, the StatefulSet makes them again with an empty "
            f"volume, and the node joins the cluster again"
        )
    else:
        then = lost_volume_by_hand(spec, lost)
    return Event(
        "Warning",
        "StorageVolumeLost",
        f"storage pod {lost.pod} (claim {lost.claim}) lost its volume: {lost.reason}; {then}",
    )


def lost_volume_by_hand(spec: ClusterSpec, lost: LostVolume) -> str:
    return (
        f"nothing is done with spec.storage.replaceLostAfterSeconds 0: set it for the servers "
        f"to replace storage node {spec.storage_address(lost.ordinal)} and the operator to "
        f"recreate the pod with an empty volume, or replace it by hand ({LOST_NODE_RUNBOOK})"
    )


def lost_volume_warnings(
    spec: ClusterSpec,
    lost: Sequence[LostVolume],
    warned: Mapping[str, tuple[str, datetime.datetime]],
    now: datetime.datetime,
    repeat: datetime.timedelta,
) -> tuple[list[Event], dict[str, tuple[str, datetime.datetime]]]:
    """The Warnings due (``warning_due``: a new message, or again every ``repeat``), and
    what was warned last per pod (the pods no longer lost forgotten)."""
    events: list[Event] = []
    remembered: dict[str, tuple[str, datetime.datetime]] = {}
    for volume in lost:
        warning = lost_volume_warning(spec, volume)
        last = warned.get(volume.pod)
        if warning_due(last, warning.message, now, repeat):
            events.append(warning)
            remembered[volume.pod] = (warning.message, now)
        elif last is not None:
            remembered[volume.pod] = last
    return events, remembered


def lost_volumes_found(
    state: Reconciliation, lost: Sequence[LostVolume], rolling: Sequence[str] = ()
) -> Reconciliation:
    """The lost volumes (and the other storage pods a roll still has to restart), for the
    steps after; without spec.storage.replaceLostAfterSeconds each lost volume is Degraded
    (it needs a person) without holding any step up."""
    state = replace(state, lost_volumes=tuple(lost), rolling_storage=tuple(rolling))
    if state.spec.storage.replace_lost_after:
        return state
    return state.asking(
        *(
            f"storage pod {v.pod} (claim {v.claim}) lost its volume ({v.reason}): "
            f"{lost_volume_by_hand(state.spec, v)}"
            for v in lost
        )
    )


def lost_volume_held(state: Reconciliation) -> str | None:
    """Why no lost volume is recreated in this reconcile (None: one may be): one change
    at a time, so not while storage scales down, a volume change or a roll is under way
    (other storage pods not on the StatefulSet's revision yet), or anything is
    refused."""
    rolling = state.rolling_storage
    what = lost_volume_subject(state)
    if state.scale_down is not None:
        return f"{what}: waits for the storage scale-down to end"
    if state.progress is not None:
        return f"{what}: waits for {state.progress}"
    if state.degraded:
        return f"{what}: waits until nothing is refused"
    if rolling:
        return f"{what}: waits for the storage roll to end ({', '.join(rolling)} to restart)"
    return None


def lost_volume_subject(state: Reconciliation) -> str:
    pods = ", ".join(v.pod for v in state.lost_volumes)
    return f"storage pod{'s' if len(state.lost_volumes) > 1 else ''} {pods} lost its volume"


def lost_volume_next(
    state: Reconciliation, known: frozenset[str], replacing: frozenset[str]
) -> LostVolume | str:
    """The lost volume to recreate now: the first whose storage node the servers have
    replaced (it is out of the replica assignment, no replacement of it is recorded as
    under way, and it serves no vote); else why each waits."""
    assert state.view is not None
    waits = []
    for lost in state.lost_volumes:
        address = state.spec.storage_address(lost.ordinal)
        if address in replacing:
            waits.append(
                f"{lost.pod}: the servers are replacing storage node {address} "
                f"(`waltz cluster show` lists what waits)"
            )
        elif address in known:
            waits.append(
                f"{lost.pod}: waiting for the servers to replace storage node {address} "
                f"(after {state.spec.storage.replace_lost_after} s unreachable: its replicas "
                f"move to the other storage nodes, then it leaves the replica assignment)"
            )
        elif address in state.view.still_serving:
            waits.append(f"{lost.pod}: storage node {address} still serves a vote")
        else:
            return lost
    return f"{lost_volume_subject(state)}; " + "; ".join(waits)


def lost_volume_recreated(state: Reconciliation, lost: LostVolume) -> Reconciliation:
    """Its claim and pod deleted: the StatefulSet makes them again, the claim with an
    empty volume; the node joins the assignment again once its pod is ready."""
    address = state.spec.storage_address(lost.ordinal)
    deleted = [
        *([f"claim {lost.claim}"] if lost.claim_exists else []),
        *([f"pod {lost.pod}"] if lost.pod_exists else []),
    ]
    return state.told(
        Event(
            "Normal",
            "StorageVolumeReplaced",
            f"storage node {address} was replaced by the servers ({lost.reason}): deleted "
            f"{' and '.join(deleted) or 'nothing (both were gone)'}; the StatefulSet makes "
            f"them again with an empty volume, and the node joins the cluster again",
        )
    ).waiting(
        f"storage pod {lost.pod}: recreated with an empty volume; it joins the cluster once ready"
    )


def rolling_storage(
    spec: ClusterSpec,
    statefulset: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    claims: Sequence[Mapping[str, Any]],
    lost: Sequence[LostVolume],
) -> list[str]:
    """The storage pods a roll (a new revision, or a grown volume to mount again) still
    has to restart, besides those whose volume is gone; none without a revision."""
    if update_revision(statefulset) is None:
        return []
    gone = {v.pod for v in lost}
    return [
        p.name
        for p in storage_pod_states(spec, statefulset, pods, claims)
        if not p.current and p.name not in gone
    ]


# --- rolling -------------------------------------------------------------------------------


def update_revision(statefulset: Mapping[str, Any] | None) -> str | None:
    """The revision its pods should run (None: no StatefulSet, or none reported yet)."""
    if statefulset is None:
        return None
    return (statefulset.get("status") or {}).get("updateRevision") or None


def storage_pod_states(
    spec: ClusterSpec,
    statefulset: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    claims: Sequence[Mapping[str, Any]],
) -> list[PodState]:
    """Each storage pod, for ``next_pod_to_restart``: current when it runs the update
    revision and its volume needs no remount."""
    revision = update_revision(statefulset)
    by_ordinal = {ordinal(p): p for p in pods}
    # A grown volume whose file system grows only when mounted again: restart its pod,
    # one at a time like any roll.
    to_remount = {c["metadata"]["name"] for c in claims if needs_restart_to_resize(c)}
    states = []
    for number in range(int(statefulset["spec"]["replicas"])):
        pod = by_ordinal.get(number)
        # Missing (deleted, not yet recreated) or terminating: being replaced with the
        # new revision, and down meanwhile.
        replaced = pod is None or bool(pod["metadata"].get("deletionTimestamp"))
        states.append(
            PodState(
                name=spec.storage_pod(number),
                address=spec.storage_address(number),
                ready=not replaced and pod is not None and pod_ready(pod),
                current=replaced
                or (
                    pod is not None
                    and (pod["metadata"].get("labels") or {}).get(REVISION_LABEL) == revision
                    and f"data-{spec.storage_pod(number)}" not in to_remount
                ),
            )
        )
    return states


# --- reporting -----------------------------------------------------------------------------


def refusal_events(
    previous: Mapping[str, Any],
    status: Mapping[str, Any],
    refusals: Sequence[str] | None = None,
) -> list[Event]:
    """A Warning each time the Degraded message changes to a new refusal (not on every
    reconcile while it lasts). ``refusals``: the refusals the message starts with (what
    follows them has Warnings of its own); None: the whole message."""
    before = {c["type"]: c for c in previous.get("conditions", []) if "type" in c}
    now = {c["type"]: c for c in status.get("conditions", [])}
    d_now, d_before = now.get("Degraded", {}), before.get("Degraded", {})
    if d_now.get("status") != "True":
        return []
    message = d_now.get("message", "") if refusals is None else "; ".join(refusals)
    said = str(d_before.get("message") or "")
    if not message or said == message or said.startswith(f"{message}; "):
        return []
    return [Event("Warning", "Refused", message)]


def reported(state: Reconciliation) -> Reconciliation:
    """The status from what was observed and done, and a Warning for a new refusal. The
    servers held for an upgrade are progress too (they wait for the storage roll)."""
    view = state.view
    # The servers held for an upgrade, then what the step under way waits for.
    progress = "; ".join(p for p in (state.servers_held, state.progress) if p) or None
    observed = Observed(
        zookeeper_error=state.zookeeper_error,
        cluster_key=state.cluster_key,
        create_error=state.create_error,
        storage_ready=state.storage_ready,
        servers_ready=state.servers_ready,
        partitions=tuple(view.status_partitions()) if view is not None else (),
        progress=progress,
        degraded=state.degraded,
        attention=state.attention,
    )
    status = compute_status(state.spec, state.generation, observed, state.previous, state.now)
    return replace(state, status=status, progress=progress).told(
        *refusal_events(state.previous, status, state.degraded)
    )


def warning_due(
    last: tuple[str, datetime.datetime] | None,
    message: str,
    now: datetime.datetime,
    repeat: datetime.timedelta,
) -> bool:
    """A failure's Warning is posted when its message is new, and again every ``repeat``
    while it lasts (a failure every reconcile would flood the Events)."""
    return last is None or last[0] != message or now - last[1] >= repeat
