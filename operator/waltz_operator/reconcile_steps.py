"""The steps of a reconcile, in order, each over the reconciliation state.

Every step here is thin: it reads the world or changes it (the Kubernetes API, the
cluster's ZooKeeper), and leaves the choices to reconcile_decisions.py, whose guards also
say which steps run. ``ReconcileSteps.pipeline`` is the order; the runner is
pipeline.py. A step stops the pipeline only when nothing after it can go on (a TLS mode
that cannot be applied, an unusable Secret); a refusal or a wait is recorded in the state
instead, and the guards of the steps after it take it into account.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from waltz_client.cluster import admin
from waltz_client.cluster.errors import ClusterError
from waltz_client.cluster.replace_storage import read_replacements

from .bootstrap import Created
from .cluster_connections import ClusterConnections
from .desired import desired_objects, selector
from .events import Event
from .kube import ApiError, KubeApi
from .lost_volumes import LostVolume, lost_volumes
from .monitor import HttpsScrape
from .owned import Key, digest, key_of, needs_apply
from .pipeline import Step, Stop
from .reconcile_decisions import (
    WARNING_REPEAT,
    ApplyStatefulSet,
    HoldStatefulSet,
    RecreateStatefulSet,
    balance_step,
    claims_cannot_grow,
    cluster_ensured,
    cluster_key_recalled,
    finds_lost_volumes,
    grows_partitions,
    handles_lost_volumes,
    join_progress,
    joining_storage,
    leaving_storage,
    lost_volume_held,
    lost_volume_next,
    lost_volume_recreated,
    lost_volume_subject,
    lost_volume_warnings,
    lost_volumes_found,
    may_apply,
    may_balance,
    may_create,
    may_roll,
    ordinal,
    partitions_grown,
    partitions_not_grown,
    placement_groups,
    pod_ready,
    recalls_cluster_key,
    replicas_moved,
    reported,
    retirement_blocked,
    retires_storage,
    rolling_storage,
    scale_down_held,
    scale_down_holds,
    scale_down_moves,
    scale_down_planned,
    scaled_down,
    scales_up,
    servers_applied,
    servers_planned,
    statefulset_held,
    statefulset_planned,
    storage_joined,
    storage_joins,
    storage_membership,
    storage_moves_zone,
    storage_pod_states,
    storage_size_from_pods,
    volumes_changing,
    waits_for_zookeeper,
    zone_changes,
    zones_found,
    zookeeper_awaited,
)
from .reconcile_settings import ReconcileSettings
from .reconciliation import Live, Reconciliation
from .rollout import Assign, Restart, Shrink, Unassign, Wait, next_pod_to_restart
from .security import (
    ModeRefused,
    ensure_certificates,
    ensure_zk_credential,
    published_ca,
    settle_mode,
)
from .spec import OPERATOR, ClusterSpec
from .teardown import own_claims, own_pods
from .upgrade_order import image_changing
from .zk_secrets import SecretProblem
from .zones import node_zone

log = logging.getLogger(__name__)


def _cannot_go_on(error: ModeRefused | SecretProblem) -> Stop:
    if isinstance(error, ModeRefused):
        return Stop("TlsModeRefused", str(error))
    return Stop("SecretUnusable", str(error))  # it may appear later (cert-manager)


class ReconcileSteps:
    """The steps, with what they reach the world through; what the operator applied last
    (by digest) and whether it may read nodes outlive a reconcile."""

    def __init__(
        self,
        kube: KubeApi,
        connections: ClusterConnections,
        settings: ReconcileSettings,
        clock: Callable[[], datetime.datetime],
    ) -> None:
        self.kube = kube
        self.connections = connections
        self.settings = settings
        self.clock = clock
        self.applied: dict[Key, str] = {}
        self.nodes_forbidden = False  # no RBAC to read nodes: no zones
        # Per cluster, per storage pod: the last StorageVolumeLost Warning, and when.
        self.volume_warnings: dict[str, dict[str, tuple[str, datetime.datetime]]] = {}

    def pipeline(self) -> tuple[Step[Reconciliation], ...]:
        """Observe; create the cluster; apply the objects (a scale-down keeps the current
        size until its last step); take one step of a scale, else grow the partitions,
        else take one step of a roll; report."""
        return (
            Step("read-storage-statefulset", self.read_statefulset),
            Step("secure", self.secure),
            Step("resolve-zookeeper-access", self.resolve_zookeeper_access),
            Step("watch-cluster", self.watch_cluster),
            Step("measure-storage", self.measure_storage),
            Step("look-at-cluster", look_at_cluster),
            # Before the objects: a resource whose cluster exists (its status has the key)
            # applies them only once its cluster is found where its spec points.
            Step("ensure-cluster", self.ensure_cluster, may_create),
            Step("await-zookeeper", zookeeper_awaited, waits_for_zookeeper),
            Step("plan-scale-down", scale_down_planned, may_apply),
            Step("retire-leaving-storage", self.retire_leaving_storage, retires_storage),
            Step("apply-objects", self.apply_objects, may_apply),
            Step("hold-scale-down", scale_down_held, scale_down_holds),
            Step("move-replicas-off-leaving-storage", self.move_off_leaving, scale_down_moves),
            # A storage pod whose volume is gone: a Warning; recreated once the servers
            # replaced its node (spec.storage.replaceLostAfterSeconds), before it may join.
            Step("find-lost-volumes", self.find_lost_volumes, finds_lost_volumes),
            Step("recreate-lost-volume", self.recreate_lost_volume, handles_lost_volumes),
            Step("observe-storage-membership", self.observe_membership, scales_up),
            Step("join-new-storage", self.join_new_storage, storage_joins),
            Step("place-storage-in-zones", self.place_in_zones, storage_moves_zone),
            Step("balance-replicas", self.balance_replicas, may_balance),
            # A larger spec.partitions, once nothing above is under way; the roll waits.
            Step("grow-partitions", self.grow_partitions, grows_partitions),
            Step("roll-storage", self.roll_storage, may_roll),
            Step("recall-cluster-key", cluster_key_recalled, recalls_cluster_key),
            Step("count-ready", self.count_ready),
            Step("report", reported),
        )

    # --- observing --------------------------------------------------------------------

    async def read_statefulset(self, state: Reconciliation) -> Reconciliation:
        spec = state.spec
        statefulset = await self.kube.get("StatefulSet", spec.namespace, spec.storage_service)
        return replace(state, statefulset=statefulset)

    async def secure(self, state: Reconciliation) -> Reconciliation | Stop:
        """Before anything is applied: the TLS mode (written into the spec when it was not
        given), the operator's CA and certificates, its ZooKeeper credential."""
        try:
            return await self._secure(state)
        except (ModeRefused, SecretProblem) as e:
            return _cannot_go_on(e)

    async def _secure(self, state: Reconciliation) -> Reconciliation:
        decision = settle_mode(state.spec, state.statefulset)
        spec, events = decision.spec, []
        if decision.record is not None and not spec.paused:
            await self.kube.patch(
                "WaltzCluster",
                spec.namespace,
                spec.name,
                {"spec": {"tls": {"mode": decision.record}}},
            )
            events.append(Event("Normal", "TlsModeRecorded", f"spec.tls.mode is {decision.record}"))
        https = None
        if spec.tls.mode == OPERATOR:
            if spec.paused:
                ca = await published_ca(self.kube, spec, state.live)
            else:
                issued, ca = await ensure_certificates(self.kube, spec, state.live, self.clock())
                events += issued
            https = HttpsScrape(ca) if ca else None
        if spec.zk_credential_generated and not spec.paused:
            events += await ensure_zk_credential(
                self.kube,
                spec,
                state.live,
                self.connections.get_secret,
                self.settings.secret_dir,
                self.settings.zk_timeout,
            )
        # A refused mode switch keeps the running mode, and says so.
        return replace(state, spec=spec, https=https).told(*events).refusing(decision.problem)

    async def resolve_zookeeper_access(self, state: Reconciliation) -> Reconciliation | Stop:
        try:
            access = await self.connections.resolve_access(state.spec, state.live)
        except (ModeRefused, SecretProblem) as e:
            return _cannot_go_on(e)
        # A ZooKeeper TLS Secret with only ca.crt: the daemons get only the CA.
        spec = replace(state.spec, zk_tls_client_certificate=access.tls_client_certificate)
        return replace(state, spec=spec)

    async def watch_cluster(self, state: Reconciliation) -> Reconciliation:
        monitor = self.connections.monitor(state.spec, state.https)
        if monitor.rounds == 0:
            await monitor.next_view()
        return replace(state, monitor=monitor)

    async def measure_storage(self, state: Reconciliation) -> Reconciliation:
        """The storage StatefulSet's size; without one (deleted with orphan propagation to
        change its claim template, or by hand), the pods it left."""
        if state.statefulset is not None:
            return replace(state, current_storage=int(state.statefulset["spec"]["replicas"]))
        spec = state.spec
        pods = own_pods(
            spec,
            await self.kube.list("Pod", spec.namespace, {"app.kubernetes.io/instance": spec.name}),
            orphans=True,
        )
        return replace(state, current_storage=storage_size_from_pods(spec, pods))

    async def count_ready(self, state: Reconciliation) -> Reconciliation:
        spec = state.spec
        storage_pods = await self.kube.list("Pod", spec.namespace, selector(spec, "storage"))
        deployment = await self.kube.get("Deployment", spec.namespace, f"{spec.name}-server")
        return replace(
            state,
            storage_ready=sum(1 for p in storage_pods if pod_ready(p)),
            servers_ready=int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0),
            zookeeper_error=state.watched.zookeeper_error,
        )

    # --- the cluster ------------------------------------------------------------------

    async def ensure_cluster(self, state: Reconciliation) -> Reconciliation:
        """CreateCluster, or adopt it."""
        try:
            result = await self.connections.ensure_cluster(state.spec, state.known_key)
        except ClusterError as e:
            return replace(state, create_error=str(e))
        if isinstance(result, Created) and not result.adopted:
            state.watched.refresh()
        return cluster_ensured(state, result)

    async def grow_partitions(self, state: Reconciliation) -> Reconciliation:
        """Grow the cluster to spec.partitions: one ZooKeeper transaction (the count, the
        new partitions' replicas, their metadata and ownership entries)."""
        try:
            result: admin.GrowResult = await self.connections.admin(
                state.spec, admin.add_partitions, state.spec.partitions
            )
        except ClusterError as e:
            return partitions_not_grown(state, e)
        state.watched.refresh()  # the next view, and the status, show the new partitions
        return partitions_grown(state, result)

    # --- the objects ------------------------------------------------------------------

    async def apply_objects(self, state: Reconciliation) -> Reconciliation:
        """Apply the desired objects, sized as the scale-down allows; the storage
        StatefulSet goes through ``statefulset_planned`` first."""
        size = state.storage_size if state.storage_size is not None else state.spec.storage.replicas
        spec = replace(state.spec, storage=replace(state.spec.storage, replicas=size))
        for obj in desired_objects(spec):
            if obj["kind"] == "StatefulSet" and state.statefulset is not None:
                state = await self._apply_storage_statefulset(state, spec, obj)
            elif obj["kind"] == "Deployment":
                state = await self._apply_server_deployment(state, spec, obj)
            else:
                await self._apply_one(obj, state.live)
        return state

    async def _apply_server_deployment(
        self, state: Reconciliation, spec: ClusterSpec, desired: Mapping[str, Any]
    ) -> Reconciliation:
        """Through ``servers_planned``: on an image change the servers keep the image they
        run until every storage pod runs the new one (upgrade_order.py). The storage pods
        are read only then."""
        live = await self._live_deployment(state, desired)
        pods = (
            await self.kube.list("Pod", spec.namespace, selector(spec, "storage"))
            if image_changing(desired, live)
            else []
        )
        plan = servers_planned(state, desired, live, pods)
        first = self.applied.get(key_of(plan.obj)) != digest(plan.obj)
        await self._apply_one(plan.obj, state.live)
        return servers_applied(state, plan, first)

    async def _live_deployment(
        self, state: Reconciliation, desired: Mapping[str, Any]
    ) -> Mapping[str, Any] | None:
        """The server Deployment as it is: the watched one while it runs the wanted image
        (nothing to decide); else read now, as the watch may not show our last apply yet
        (an older image there would hold the servers back to it)."""
        kind, namespace, name = key_of(desired)
        watched = state.live.get((kind, namespace, name)) if state.live is not None else None
        if watched is not None and not image_changing(desired, watched):
            return watched
        return await self.kube.get(kind, namespace, name)

    async def _apply_storage_statefulset(
        self, state: Reconciliation, spec: ClusterSpec, desired: Mapping[str, Any]
    ) -> Reconciliation:
        live = state.statefulset
        assert live is not None
        held = statefulset_held(spec, live)
        if held is not None:
            return self._after_statefulset(state, held)
        claims = own_claims(
            spec,
            await self.kube.list(
                "PersistentVolumeClaim", spec.namespace, {"app.kubernetes.io/instance": spec.name}
            ),
        )
        plan = statefulset_planned(spec, desired, live, claims, state.current_storage)
        if not isinstance(plan, RecreateStatefulSet):
            await self._apply_one(plan.obj, state.live)
            return self._after_statefulset(state, plan)
        refused = await self._patch_claims(spec, plan)
        if refused is not None:
            # The class cannot grow its volumes: nothing else is held up.
            await self._apply_one(plan.instead, state.live)
            return self._after_statefulset(state, HoldStatefulSet(refusal=refused))
        await self.kube.delete("StatefulSet", spec.namespace, spec.storage_service, "Orphan")
        return self._after_statefulset(
            state.told(volumes_changing(plan.change)),
            HoldStatefulSet(progress=f"storage volumes: {plan.change.reason}"),
        )

    @staticmethod
    def _after_statefulset(
        state: Reconciliation, outcome: HoldStatefulSet | ApplyStatefulSet
    ) -> Reconciliation:
        return state.waiting(outcome.progress).refusing(outcome.refusal)

    async def _apply_one(self, obj: Mapping[str, Any], live: Live) -> None:
        """Apply it unless the watched object already is what it should be (owned.py)."""
        key = key_of(obj)
        if live is None or needs_apply(obj, live.get(key), self.applied.get(key)):
            await self.kube.apply(obj)
            self.applied[key] = digest(obj)

    def forget_applied(self, spec: ClusterSpec) -> None:
        for obj in desired_objects(spec):
            self.applied.pop(key_of(obj), None)
        self.volume_warnings.pop(f"{spec.namespace}/{spec.name}", None)

    async def _patch_claims(self, spec: ClusterSpec, plan: RecreateStatefulSet) -> str | None:
        """Patch the claims a volume change needs; the API server's refusal (a StorageClass
        that does not allow expansion), or None."""
        for patch in plan.change.patches:
            try:
                await self.kube.patch(
                    "PersistentVolumeClaim", spec.namespace, patch.name, patch.patch
                )
            except ApiError as e:
                if e.status not in (403, 422):
                    raise
                return claims_cannot_grow(plan.change, e)
        return None

    # --- scaling ----------------------------------------------------------------------

    async def retire_leaving_storage(self, state: Reconciliation) -> Reconciliation:
        """The leaving nodes (which hold nothing now) leave the assignment before their
        pods go; then the StatefulSet may shrink."""
        down, view = state.scale_down, state.view
        assert isinstance(down, Shrink) and view is not None
        leaving = leaving_storage(state.spec, state.current_storage, down)
        blocked = retirement_blocked(leaving, view)
        if blocked is not None:
            return state.waiting(blocked)
        for address in leaving:
            try:
                await self.connections.admin(state.spec, admin.remove_storage, address)
            except ClusterError as e:
                if "not in the cluster" not in str(e):
                    return state.waiting(f"scaling storage down: {e}")
        told = state.told(scaled_down(state.current_storage, down, leaving))
        return replace(told, storage_size=down.replicas)

    async def move_off_leaving(self, state: Reconciliation) -> Reconciliation:
        assert isinstance(state.scale_down, Assign | Unassign)
        return await self._move(state, state.scale_down, "scaling storage down")

    async def observe_membership(self, state: Reconciliation) -> Reconciliation:
        spec = state.spec
        pods = await self.kube.list("Pod", spec.namespace, selector(spec, "storage"))
        assignment = await self.connections.assignment(spec)
        zones = await self._zones(spec, pods)
        return replace(state, membership=storage_membership(spec, pods, assignment, zones))

    async def join_new_storage(self, state: Reconciliation) -> Reconciliation:
        """New nodes join the assignment once their pods are ready."""
        membership = state.membership
        assert membership is not None
        new = joining_storage(state)
        groups = placement_groups(membership)
        for address in (a for a in new if a in membership.ready):
            await self.connections.admin(
                state.spec, admin.add_storage, address, groups.get(address, 0)
            )
            state = state.told(storage_joined(address))
        return state.waiting(join_progress(new, membership.ready))

    async def place_in_zones(self, state: Reconciliation) -> Reconciliation:
        membership = state.membership
        assert membership is not None and membership.zones is not None
        changes = zone_changes(membership)
        await self.connections.admin(state.spec, admin.set_storage_groups, changes)
        return state.told(zones_found(changes, membership.zones))

    async def balance_replicas(self, state: Reconciliation) -> Reconciliation:
        step = balance_step(state)
        if isinstance(step, Wait):
            return state.waiting(f"balancing replicas: {step.reason}")
        if isinstance(step, Assign | Unassign):
            return await self._move(state, step, "balancing replicas")
        return state

    async def _move(
        self, state: Reconciliation, step: Assign | Unassign, what: str
    ) -> Reconciliation:
        call = admin.assign_partitions if isinstance(step, Assign) else admin.unassign_partitions
        for address, partitions in sorted(step.replicas.items()):
            try:
                await self.connections.admin(state.spec, call, address, set(partitions))
            except ClusterError as e:  # the admin's own safety check: wait and look again
                return state.waiting(f"{what}: {e}")
            state = state.told(replicas_moved(step, address, partitions))
        return state.waiting(f"{what}: replicas moving")

    async def _zones(
        self, spec: ClusterSpec, pods: list[dict[str, Any]]
    ) -> dict[str, str | None] | None:
        """Each storage node's zone, from its pod's node (None for a node without a zone
        label); None as a whole while a pod is not scheduled, or nodes cannot be read."""
        if len(pods) < spec.storage.replicas or self.nodes_forbidden:
            return None
        zones: dict[str, str | None] = {}
        nodes: dict[str, dict[str, Any] | None] = {}
        for pod in pods:
            node_name = (pod.get("spec") or {}).get("nodeName")
            if not node_name:
                return None
            if node_name not in nodes:
                try:
                    nodes[node_name] = await self.kube.get("Node", None, node_name)
                except ApiError as e:
                    if e.status != 403:
                        raise
                    log.warning("cannot read nodes (%s): zones are not used for placement", e)
                    self.nodes_forbidden = True
                    return None
            zones[spec.storage_address(ordinal(pod))] = node_zone(nodes[node_name])
        return zones

    # --- storage pods whose volume is gone ---------------------------------------------

    async def find_lost_volumes(self, state: Reconciliation) -> Reconciliation:
        """The storage pods whose volume is gone, each with a Warning (again every
        ``WARNING_REPEAT`` while it lasts)."""
        spec, statefulset = state.spec, state.statefulset
        assert statefulset is not None
        storage = own_pods(
            spec, await self.kube.list("Pod", spec.namespace, selector(spec, "storage"))
        )
        claims = own_claims(
            spec,
            await self.kube.list(
                "PersistentVolumeClaim", spec.namespace, {"app.kubernetes.io/instance": spec.name}
            ),
        )
        lost = lost_volumes(spec, storage, claims, state.current_storage)
        events, self.volume_warnings[state.key] = lost_volume_warnings(
            spec,
            lost,
            self.volume_warnings.get(state.key, {}),
            self.clock(),
            datetime.timedelta(seconds=WARNING_REPEAT),
        )
        rolling = rolling_storage(spec, statefulset, storage, claims, lost)
        return lost_volumes_found(state, lost, rolling).told(*events)

    async def recreate_lost_volume(self, state: Reconciliation) -> Reconciliation:
        """Once the servers replaced its node (``lost_volume_next``), delete the claim and
        then the pod: the StatefulSet makes both again, the claim with an empty volume.
        One pod a reconcile."""
        held = lost_volume_held(state)
        if held is not None:
            return state.waiting(held)
        spec = state.spec
        assignment = await self.connections.assignment(spec)
        try:
            record, _ = await self.connections.admin(spec, read_replacements)
        except ClusterError as e:
            return state.waiting(f"{lost_volume_subject(state)}: {e}")
        chosen = lost_volume_next(
            state, frozenset(assignment.storages), frozenset(record.replacing)
        )
        if isinstance(chosen, str):
            return state.waiting(chosen)
        await self._delete_lost(spec, chosen)
        return lost_volume_recreated(state, chosen)

    async def _delete_lost(self, spec: ClusterSpec, lost: LostVolume) -> None:
        """The claim first: a pod deleted first could be made again on the old claim."""
        if lost.claim_exists:
            await self.kube.delete("PersistentVolumeClaim", spec.namespace, lost.claim)
        if lost.pod_exists:
            await self.kube.delete("Pod", spec.namespace, lost.pod)

    # --- rolling ----------------------------------------------------------------------

    async def roll_storage(self, state: Reconciliation) -> Reconciliation:
        """Delete the next pod ``next_pod_to_restart`` names: the StatefulSet recreates it
        with the new template."""
        spec, statefulset, view = state.spec, state.statefulset, state.view
        assert statefulset is not None and view is not None
        pods = await self.kube.list("Pod", spec.namespace, selector(spec, "storage"))
        claims = own_claims(
            spec,
            await self.kube.list(
                "PersistentVolumeClaim", spec.namespace, {"app.kubernetes.io/instance": spec.name}
            ),
        )
        step = next_pod_to_restart(
            storage_pod_states(spec, statefulset, pods, claims), view.rollout_states()
        )
        if isinstance(step, Wait):
            return state.waiting(f"rolling storage: {step.reason}")
        if not isinstance(step, Restart):
            return state
        await self.kube.delete("Pod", spec.namespace, step.pod)
        return state.waiting(f"rolling storage: restarted {step.pod}").told(
            Event("Normal", "RollingRestart", f"restarted {step.pod}: {step.reason}")
        )


def look_at_cluster(state: Reconciliation) -> Reconciliation:
    """The quorum state the decisions of this reconcile go by, seen once."""
    monitor = state.watched
    return replace(state, view=monitor.view, zookeeper_error=monitor.zookeeper_error)
