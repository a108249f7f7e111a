"""One reconcile of a WaltzCluster: observe, take the next safe step, report.

The decisions are the pure functions of desired.py, rollout.py, bootstrap.py and
status.py; this module reads the world (the Kubernetes objects, the cluster's quorum
state from its monitor), applies what they decide, and returns the new status and the
Events to post. It is level-triggered: each call looks at everything afresh, takes at
most one step of a scale or a roll, and the next call (the next event, or the timer)
takes the next. The same world twice gives the same step, so a replayed event is
harmless.

Order of a reconcile (nothing of it while paused, except the status):
0. settle the TLS mode, and keep the operator's own CA, certificates and ZooKeeper
   credential (security.py);
1. apply the objects the spec wants, keeping the storage StatefulSet at its current size
   while a scale-down moves replicas away;
2. CreateCluster (or adopt it) once ZooKeeper answers;
3. scaling down: the next step of ``next_scale_down_step``; scaling up: new storage
   nodes join the assignment once their pods are ready, then replicas are spread to
   them (``next_rebalance_step``);
4. rolling storage: delete the next pod ``next_pod_to_restart`` names (the StatefulSet
   recreates it with the new template);
5. the status, from what was observed.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kazoo.client import KazooClient

from waltz_client.cluster import admin
from waltz_client.cluster.errors import ClusterError
from waltz_client.cluster.metadata import ReplicaAssignment
from waltz_client.cluster.zk import close, connect
from waltz_client.wire.errors import describe

from .bootstrap import Created, Refused, Unsupported, cluster_name, ensure_cluster
from .desired import desired_objects, selector
from .events import Event
from .kube import ApiError, KubeApi
from .metrics import OperatorMetrics
from .monitor import ClusterMonitor, HttpsScrape, MonitorSettings
from .observe import ClusterView
from .owned import Key, controlled_by, digest, key_of, needs_apply
from .rollout import (
    Assign,
    Done,
    PodState,
    Refuse,
    Restart,
    Shrink,
    Unassign,
    Wait,
    next_pod_to_restart,
    next_rebalance_step,
    next_scale_down_step,
)
from .security import (
    ModeRefused,
    ensure_certificates,
    ensure_zk_credential,
    published_ca,
    settle_mode,
)
from .spec import OPERATOR, STORAGE_HTTP_PORT, ClusterSpec, SpecError, parse
from .status import Observed, compute_status, failure_status
from .teardown import own_claims, own_pods, tear_down
from .volumes import (
    Recreate,
    RefuseVolumeChange,
    needs_restart_to_resize,
    plan_volume_change,
    resizing,
)
from .zk_secrets import SecretProblem, ZkAccess, zk_access
from .zones import group_changes, node_zone, zone_groups

log = logging.getLogger(__name__)

PAUSE_ANNOTATION = "waltz.io/paused"
# While the same failure lasts, its Warning Event is posted again this often (seconds).
WARNING_REPEAT = 600.0
REVISION_LABEL = "controller-revision-hash"


@dataclass
class Outcome:
    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    busy: bool = False  # a step is under way: look again soon
    status_changed: bool = True  # differs from the last status written
    failed: bool = False  # the reconcile stopped on an error: try again soon


def is_paused(body: Mapping[str, Any], spec: ClusterSpec) -> bool:
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    return spec.paused or str(annotations.get(PAUSE_ANNOTATION, "")).lower() == "true"


def pod_ready(pod: Mapping[str, Any]) -> bool:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def _ordinal(pod: Mapping[str, Any]) -> int:
    return int(pod["metadata"]["name"].rsplit("-", 1)[1])


def default_storage_http(address: str, scheme: str = "http") -> str:
    """A storage node's readiness URL: its pod's stable name, the HTTP port."""
    host = address.rsplit(":", 1)[0]
    return f"{scheme}://{host}:{STORAGE_HTTP_PORT}/readyz"


def _controlled_by(obj: Mapping[str, Any], spec: ClusterSpec) -> bool:
    """Whether this WaltzCluster is the object's controller."""
    return controlled_by(obj, spec.uid)


def _keep_claim_template(desired: Mapping[str, Any], live: Mapping[str, Any]) -> dict[str, Any]:
    """The desired StatefulSet with the live one's claim template, which cannot change."""
    spec = {**desired["spec"], "volumeClaimTemplates": live["spec"].get("volumeClaimTemplates", [])}
    return {**desired, "spec": spec}


@dataclass(frozen=True)
class ReconcileSettings:
    monitor: MonitorSettings = field(default_factory=MonitorSettings)
    zk_timeout: float = 10.0
    # A storage node's readiness URL from its address (tests map it to local ports).
    storage_http: Callable[[str], str | None] = default_storage_http
    # Storage addresses by ordinal instead of the pods' DNS names (spec.address_book).
    address_book: tuple[str, ...] = ()
    # Where the certificates of spec.zookeeper.tlsSecret are written for kazoo.
    secret_dir: str = field(
        default_factory=lambda: os.path.join(tempfile.gettempdir(), "waltz-operator-secrets")
    )


class Reconciler:
    """Owns each cluster's monitor and ZooKeeper connection across reconciles."""

    def __init__(
        self,
        kube: KubeApi,
        metrics: OperatorMetrics,
        settings: ReconcileSettings | None = None,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self.kube = kube
        self.metrics = metrics
        self.settings = settings or ReconcileSettings()
        self.clock = clock
        self.monitors: dict[str, ClusterMonitor] = {}
        self._zk: dict[tuple[str, ZkAccess], KazooClient] = {}
        self._accesses: dict[str, ZkAccess] = {}  # cluster -> how it reaches ZooKeeper
        self._locks: dict[str, asyncio.Lock] = {}
        self._closing = False
        # The last status each cluster was given: newer than a body kopf delivers
        # before the watch brings our own status write back.
        self.statuses: dict[str, dict[str, Any]] = {}
        self._warned: dict[str, tuple[str, datetime.datetime]] = {}  # the last Warning
        self._nodes_forbidden = False  # no RBAC to read nodes: no zones
        self._applied: dict[Key, str] = {}  # what this process applied last, by digest

    async def close(self, grace: float = 30.0) -> None:
        """Stop following every cluster. Reconciles under way finish first (for up to
        ``grace`` seconds): closing a ZooKeeper client under a blocking call in a worker
        thread can leave that thread waiting forever."""
        if not self._closing:
            self._closing = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._quiesce(), grace)
        for monitor in self.monitors.values():
            await monitor.close()
        self.monitors.clear()
        for zk in self._zk.values():
            await asyncio.to_thread(close, zk)
        self._zk.clear()

    async def _quiesce(self) -> None:
        for lock in list(self._locks.values()):
            await lock.acquire()  # held: nothing new starts either

    # --- shared resources --------------------------------------------------------------

    def monitor(self, spec: ClusterSpec, https: HttpsScrape | None = None) -> ClusterMonitor:
        key = cluster_name(spec)
        figures = self.metrics.figures(key)
        monitor = self.monitors.get(key)
        access = self._accesses.get(key, ZkAccess())
        if monitor is not None and (
            monitor.connect_string,
            monitor.root,
            monitor.access,
            monitor.https,
        ) != (spec.zookeeper, spec.zk_root, access, https):
            asyncio.get_running_loop().create_task(monitor.close())
            monitor = None
        if monitor is None:

            def on_view(view: ClusterView | None, m_key: str = key) -> None:
                figures.view = view
                m = self.monitors.get(m_key)
                figures.zookeeper_reachable = m is not None and m.zookeeper_error is None

            storage_http = self.settings.storage_http
            if https is not None and storage_http is default_storage_http:
                storage_http = functools.partial(default_storage_http, scheme="https")
            monitor = ClusterMonitor(
                spec.zookeeper,
                spec.zk_root,
                storage_http,
                self.settings.monitor,
                on_view,
                access,
                https,
            )
            self.monitors[key] = monitor
        return monitor

    async def _resolve_access(
        self, spec: ClusterSpec, live: Mapping[Key, Mapping[str, Any]] | None = None
    ) -> ZkAccess:
        """Read the Secrets the spec names for ZooKeeper (SecretProblem if unusable); the
        credential the operator made is watched: no read for it."""

        async def get_secret(namespace: str, name: str) -> Mapping[str, Any] | None:
            found = (live or {}).get(("Secret", namespace, name))
            return found if found is not None else await self._get_secret(namespace, name)

        access = await zk_access(spec, get_secret, self.settings.secret_dir)
        self._accesses[cluster_name(spec)] = access
        return access

    async def _get_secret(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return await self.kube.get("Secret", namespace, name)

    async def _zookeeper(self, spec: ClusterSpec) -> KazooClient:
        """A connection shared by the clusters on the same ZooKeeper with the same
        credential and certificate."""
        access = self._accesses.get(cluster_name(spec), ZkAccess())
        key = (spec.zookeeper, access)
        zk = self._zk.get(key)
        if zk is not None and zk.connected:
            return zk
        if zk is not None:
            await asyncio.to_thread(close, zk)
        zk = await asyncio.to_thread(
            lambda: connect(spec.zookeeper, self.settings.zk_timeout, **access.connect_arguments)
        )
        self._zk[key] = zk
        return zk

    async def _admin(self, spec: ClusterSpec, call: Callable[..., Any], *args: Any) -> Any:
        zk = await self._zookeeper(spec)
        return await asyncio.to_thread(call, zk, spec.zk_root, *args)

    # --- reconcile -----------------------------------------------------------------------

    async def reconcile(
        self, body: Mapping[str, Any], live: Mapping[Key, Mapping[str, Any]] | None = None
    ) -> Outcome:
        """One reconcile. ``live``: the owned objects as watched (None: not watched, so
        every object is applied)."""
        meta = body.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        lock = self._locks.setdefault(key, asyncio.Lock())
        progress = self.metrics.progress.started(key)
        async with lock:  # a timer and an update handler may overlap
            self.metrics.reconciles.labels(key).inc()
            with self.metrics.reconcile_seconds.labels(key).time():
                try:
                    return await self._reconcile(body, live)
                except Exception as e:  # the API or ZooKeeper refused a step: say so
                    log.warning("%s: reconcile failed", key, exc_info=True)
                    self.metrics.reconcile_errors.labels(key).inc()
                    return self._stopped(
                        body, "ReconcileFailed", f"reconcile failed: {describe(e)}"
                    )
                finally:
                    self.metrics.progress.finished(progress)

    def _stopped(self, body: Mapping[str, Any], reason: str, message: str) -> Outcome:
        """A reconcile that could not go on: the status says why (``failure_status``), and a
        Warning Event says it when the message is new, or again every ``WARNING_REPEAT``
        seconds while it lasts (a failure every reconcile would flood the Events)."""
        meta = body.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        previous = self.statuses.get(key) or dict(body.get("status") or {})
        generation = int(meta.get("generation") or 0)
        now = self.clock()
        status = failure_status(
            previous, generation, reason, message, now.strftime("%Y-%m-%dT%H:%M:%SZ")
        )
        self.statuses[key] = status
        last = self._warned.get(key)
        repeat = datetime.timedelta(seconds=WARNING_REPEAT)
        events = []
        if last is None or last[0] != message or now - last[1] >= repeat:
            self._warned[key] = (message, now)
            events.append(Event("Warning", reason, message))
        return Outcome(
            status, events, status_changed=status != previous, failed=reason == "ReconcileFailed"
        )

    async def _reconcile(
        self, body: Mapping[str, Any], live: Mapping[Key, Mapping[str, Any]] | None
    ) -> Outcome:
        generation = int((body.get("metadata") or {}).get("generation") or 0)
        meta = body.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        previous = self.statuses.get(key) or dict(body.get("status") or {})
        now = self.clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            spec = parse(body)
        except SpecError as e:
            return self._stopped(body, "InvalidSpec", str(e))
        paused = is_paused(body, spec)
        spec = replace(spec, paused=paused, address_book=self.settings.address_book)
        ns = spec.namespace
        statefulset = await self.kube.get("StatefulSet", ns, spec.storage_service)
        try:
            spec, events, mode_problem, https = await self._secure(spec, statefulset, live)
            access = await self._resolve_access(spec, live)
            # A ZooKeeper TLS Secret with only ca.crt: the daemons get only the CA.
            spec = replace(spec, zk_tls_client_certificate=access.tls_client_certificate)
        except ModeRefused as e:
            return self._stopped(body, "TlsModeRefused", str(e))
        except SecretProblem as e:  # it may appear later (cert-manager): look again soon
            return self._stopped(body, "SecretUnusable", str(e))
        monitor = self.monitor(spec, https)
        if monitor.rounds == 0:
            await monitor.next_view()
        degraded: list[str] = [mode_problem] if mode_problem else []
        progress: str | None = None
        create_error: str | None = None
        cluster_key: str | None = None

        current = await self._current_storage_size(spec, statefulset)
        view = monitor.view

        if not paused:
            # 1. CreateCluster, or adopt it. Before the objects: a resource whose cluster
            # exists (its status has the key) applies them only once its cluster is found
            # where its spec points, so a moved spec.zookeeper never strands the pods.
            known_key = previous.get("clusterKey") or None
            if monitor.zookeeper_error is None:
                try:
                    result = await self._admin_ensure(spec, known_key)
                except ClusterError as e:
                    result = None
                    create_error = str(e)
                if isinstance(result, Created):
                    cluster_key = result.key
                    if not result.adopted:
                        events.append(
                            Event(
                                "Normal",
                                "ClusterCreated",
                                f"created cluster {cluster_name(spec)} at {spec.zk_root}: "
                                f"{spec.partitions} partitions x "
                                f"{spec.replicas_per_partition} replicas, key {result.key}",
                            )
                        )
                        monitor.refresh()
                elif isinstance(result, Unsupported):
                    cluster_key = result.key
                    degraded.append(result.reason)
                elif isinstance(result, Refused):
                    create_error = result.reason
                    degraded.append(result.reason)
            elif known_key is not None:
                progress = (
                    f"changes wait until ZooKeeper at {spec.zookeeper} confirms the cluster "
                    f"(key {known_key}) is at {spec.zk_root}"
                )

            # 2. The objects; a scale-down keeps the current size until its last step.
            storage_size = spec.storage.replicas
            down: Any = None
            if cluster_key is not None or known_key is None:
                if spec.storage.replicas < current:
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
                    storage_size = current
                    if isinstance(down, Shrink) and view is not None:
                        # The leaving nodes leave the assignment before their pods go.
                        blocked, retired = await self._retire(spec, current, down, view)
                        events += retired
                        if blocked is None:
                            storage_size = down.replicas
                        else:
                            progress = blocked
                sized = replace(spec, storage=replace(spec.storage, replicas=storage_size))
                volume_progress, volume_events, volume_refusal = await self._apply(
                    sized, statefulset, current, live
                )
                progress = volume_progress or progress
                events += volume_events
                if volume_refusal:
                    degraded.append(volume_refusal)

            # 3. Scaling.
            if cluster_key is not None and view is not None and not degraded:
                step_progress, step_events, step_refusal = await self._scale(
                    spec, current, down, view
                )
                progress = step_progress or progress
                events += step_events
                if step_refusal:
                    degraded.append(step_refusal)

            # 4. Rolling the storage pods.
            if cluster_key is not None and view is not None and progress is None:
                progress, roll_events = await self._roll(spec, statefulset, view)
                events += roll_events
        elif view is not None:
            cluster_key = view.key

        # 5. Status.
        storage_pods = await self.kube.list("Pod", ns, selector(spec, "storage"))
        deployment = await self.kube.get("Deployment", ns, f"{spec.name}-server")
        storage_ready = sum(1 for p in storage_pods if pod_ready(p))
        servers_ready = int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0)
        figures = self.metrics.figures(cluster_name(spec))
        figures.storage_ready, figures.storage_desired = storage_ready, spec.storage.replicas
        figures.server_ready, figures.server_desired = servers_ready, spec.server.replicas
        observed = Observed(
            zookeeper_error=monitor.zookeeper_error,
            cluster_key=cluster_key,
            create_error=create_error,
            storage_ready=storage_ready,
            servers_ready=servers_ready,
            partitions=tuple(view.status_partitions()) if view is not None else (),
            progress=progress,
            degraded=tuple(degraded),
        )
        status = compute_status(spec, generation, observed, previous, now)
        events += self._refusal_events(previous, status)
        self.metrics.refusals.labels(cluster_name(spec)).inc(
            sum(1 for e in events if e.type == "Warning")
        )
        self.statuses[key] = status
        return Outcome(status, events, busy=progress is not None, status_changed=status != previous)

    async def _secure(
        self,
        spec: ClusterSpec,
        statefulset: Mapping[str, Any] | None,
        live: Mapping[Key, Mapping[str, Any]] | None,
    ) -> tuple[ClusterSpec, list[Event], str | None, HttpsScrape | None]:
        """Before anything is applied: the TLS mode (written into the spec when it was not
        given), the operator's CA and certificates, its ZooKeeper credential. The spec to
        apply, the Events, a refused mode switch, and how to check the daemons' HTTPS."""
        decision = settle_mode(spec, statefulset)
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
                ca = await published_ca(self.kube, spec, live)
            else:
                issued, ca = await ensure_certificates(self.kube, spec, live, self.clock())
                events += issued
            https = HttpsScrape(ca) if ca else None
        if spec.zk_credential_generated and not spec.paused:
            events += await ensure_zk_credential(
                self.kube,
                spec,
                live,
                self._get_secret,
                self.settings.secret_dir,
                self.settings.zk_timeout,
            )
        return spec, events, decision.problem, https

    async def _current_storage_size(
        self, spec: ClusterSpec, statefulset: Mapping[str, Any] | None
    ) -> int:
        """The storage StatefulSet's size; without one (deleted with orphan propagation
        to change its claim template, or by hand), the pods it left: a StatefulSet made
        again smaller than them would delete the highest ordinals at once, past every
        safe scale-down step."""
        if statefulset is not None:
            return int(statefulset["spec"]["replicas"])
        pods = own_pods(
            spec,
            await self.kube.list("Pod", spec.namespace, {"app.kubernetes.io/instance": spec.name}),
            orphans=True,
        )
        storage = [
            _ordinal(p)
            for p in pods
            if p["metadata"]["name"].startswith(f"{spec.storage_service}-")
        ]
        return max([spec.storage.replicas, *(o + 1 for o in storage)])

    async def _apply(
        self,
        spec: ClusterSpec,
        statefulset: Mapping[str, Any] | None,
        current: int,
        live: Mapping[Key, Mapping[str, Any]] | None,
    ) -> tuple[str | None, list[Event], str | None]:
        """Apply the desired objects: (progress, events, refusal). The storage StatefulSet
        goes through ``plan_volume_change`` first: its claim template cannot be updated,
        so a new size is taken by patching the claims and recreating the StatefulSet."""
        progress: str | None = None
        events: list[Event] = []
        refusal: str | None = None
        for obj in desired_objects(spec):
            if obj["kind"] == "StatefulSet" and statefulset is not None:
                if not _controlled_by(statefulset, spec):
                    # Never applied over, let alone deleted and made again.
                    refusal = (
                        f"a StatefulSet {spec.storage_service} that this WaltzCluster does "
                        f"not own is in the namespace; nothing was applied to it: rename or "
                        f"delete it"
                    )
                    continue
                if (statefulset.get("metadata") or {}).get("deletionTimestamp"):
                    progress = "storage volumes: waiting for the old StatefulSet to go"
                    continue
                claims = own_claims(
                    spec,
                    await self.kube.list(
                        "PersistentVolumeClaim",
                        spec.namespace,
                        {"app.kubernetes.io/instance": spec.name},
                    ),
                )
                plan = plan_volume_change(statefulset, obj, claims)
                if isinstance(plan, RefuseVolumeChange):
                    refusal = plan.reason
                    obj = _keep_claim_template(obj, statefulset)
                elif isinstance(plan, Recreate):
                    if spec.storage.replicas != current:
                        progress = f"storage volumes: {plan.reason}; waits for scaling to end"
                        obj = _keep_claim_template(obj, statefulset)
                    else:
                        refused = await self._patch_claims(spec, plan)
                        if refused is not None:
                            # The class cannot grow its volumes: nothing else is held up.
                            refusal = refused
                            await self._apply_one(_keep_claim_template(obj, statefulset), live)
                            continue
                        await self.kube.delete(
                            "StatefulSet", spec.namespace, spec.storage_service, "Orphan"
                        )
                        events.append(
                            Event(
                                "Normal",
                                "VolumesChanging",
                                f"{plan.reason}: patched "
                                f"{', '.join(p.name for p in plan.patches) or 'no claims'}; "
                                f"the StatefulSet is recreated (its pods keep running)",
                            )
                        )
                        progress = f"storage volumes: {plan.reason}"
                        continue
                else:
                    waiting = resizing(claims)
                    if waiting:
                        progress = f"storage volumes resizing: {', '.join(waiting)}"
            await self._apply_one(obj, live)
        return progress, events, refusal

    async def _apply_one(
        self, obj: Mapping[str, Any], live: Mapping[Key, Mapping[str, Any]] | None
    ) -> None:
        """Apply it unless the watched object already is what it should be (owned.py)."""
        key = key_of(obj)
        if live is None or needs_apply(obj, live.get(key), self._applied.get(key)):
            await self.kube.apply(obj)
            self._applied[key] = digest(obj)

    async def _patch_claims(self, spec: ClusterSpec, plan: Recreate) -> str | None:
        """Patch the claims a volume change needs; the API server's refusal (a StorageClass
        that does not allow expansion), or None."""
        for patch in plan.patches:
            try:
                await self.kube.patch(
                    "PersistentVolumeClaim", spec.namespace, patch.name, patch.patch
                )
            except ApiError as e:
                if e.status not in (403, 422):
                    raise
                return (
                    f"spec.storage.size: the volumes cannot grow ({plan.reason}): {e}; "
                    f"allow expansion on their StorageClass (allowVolumeExpansion: true)"
                )
        return None

    async def _admin_ensure(
        self, spec: ClusterSpec, known_key: str | None
    ) -> Created | Refused | Unsupported:
        zk = await self._zookeeper(spec)
        return await asyncio.to_thread(ensure_cluster, zk, spec, known_key)

    def _refusal_events(
        self, previous: Mapping[str, Any], status: Mapping[str, Any]
    ) -> list[Event]:
        """A Warning each time the Degraded message changes to a new refusal (not on every
        reconcile while it lasts)."""
        before = {c["type"]: c for c in previous.get("conditions", []) if "type" in c}
        now = {c["type"]: c for c in status.get("conditions", [])}
        d_now, d_before = now.get("Degraded", {}), before.get("Degraded", {})
        if d_now.get("status") == "True" and d_now.get("message") != d_before.get("message"):
            return [Event("Warning", "Refused", d_now["message"])]
        return []

    # --- scaling -----------------------------------------------------------------------

    async def _scale(
        self, spec: ClusterSpec, current: int, down: Any, view: ClusterView
    ) -> tuple[str | None, list[Event], str | None]:
        """(progress, events, refusal) of one scaling step."""
        events: list[Event] = []
        in_assignment = {a for p in view.partitions for a in p.assigned}
        if down is not None:
            if isinstance(down, Refuse):
                return None, [], f"scale-down to {spec.storage.replicas} refused: {down.reason}"
            if isinstance(down, Wait):
                return f"scaling storage down: {down.reason}", [], None
            if isinstance(down, Assign | Unassign):
                return await self._move(spec, down, "scaling storage down")
            return None, [], None  # Shrink: done before the objects were applied

        # Scaling up: new nodes join the assignment once their pods are ready.
        pods = await self.kube.list("Pod", spec.namespace, selector(spec, "storage"))
        ready = {spec.storage_address(_ordinal(p)) for p in pods if pod_ready(p)}
        wanted = spec.storage_addresses()
        assignment = await self._assignment(spec)
        known = set(assignment.storages)
        zones = await self._zones(spec, pods)
        groups = zone_groups(zones) if zones is not None else dict(assignment.groups)
        new = [a for a in wanted if a not in known]
        if new:
            joining = [a for a in new if a in ready]
            for address in joining:
                await self._admin(spec, admin.add_storage, address, groups.get(address, 0))
                events.append(Event("Normal", "StorageAdded", f"{address} joined the cluster"))
            waiting = [a for a in new if a not in ready]
            if waiting:
                return (
                    f"scaling storage up: waiting for {', '.join(waiting)} to be ready",
                    events,
                    None,
                )
            return "scaling storage up: new nodes joined", events, None

        changes = group_changes(assignment.groups, groups)
        if changes:
            await self._admin(spec, admin.set_storage_groups, changes)
            events.append(
                Event(
                    "Normal",
                    "ZonesFound",
                    "storage nodes' zones as placement groups: "
                    + ", ".join(f"{a} in {zones.get(a) or 'no zone'}" for a in sorted(changes)),
                )
            )
        step = next_rebalance_step(
            [a for a in wanted if a in known or a in in_assignment],
            view.rollout_states(),
            spec.replicas_per_partition,
            groups,
        )
        if isinstance(step, Wait):
            return f"balancing replicas: {step.reason}", events, None
        if isinstance(step, Assign | Unassign):
            progress, moved, refusal = await self._move(spec, step, "balancing replicas")
            return progress, events + moved, refusal
        return None, events, None

    async def _retire(
        self, spec: ClusterSpec, current: int, down: Shrink, view: ClusterView
    ) -> tuple[str | None, list[Event]]:
        """Take the leaving nodes (which hold nothing now) out of the assignment; what
        blocks it (None: nothing), and the Events."""
        leaving = spec.storage_addresses(current)[down.replicas :]
        serving = sorted(a for a in leaving if a in view.still_serving)
        if serving:
            return f"scaling storage down: {', '.join(serving)} still serve a vote", []
        for address in leaving:
            try:
                await self._admin(spec, admin.remove_storage, address)
            except ClusterError as e:
                if "not in the cluster" not in str(e):
                    return f"scaling storage down: {e}", []
        return None, [
            Event(
                "Normal",
                "ScaledDown",
                f"storage scaled down from {current} to {down.replicas}; replicas moved off "
                f"{', '.join(leaving)}",
            )
        ]

    async def _assignment(self, spec: ClusterSpec) -> ReplicaAssignment:
        zk = await self._zookeeper(spec)
        assignment, _ = await asyncio.to_thread(admin.read_assignment, zk, spec.zk_root)
        return assignment

    async def _zones(
        self, spec: ClusterSpec, pods: list[dict[str, Any]]
    ) -> dict[str, str | None] | None:
        """Each storage node's zone, from its pod's node (None for a node without a zone
        label); None as a whole while a pod is not scheduled, or nodes cannot be read."""
        if len(pods) < spec.storage.replicas or self._nodes_forbidden:
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
                    self._nodes_forbidden = True
                    return None
            zones[spec.storage_address(_ordinal(pod))] = node_zone(nodes[node_name])
        return zones

    async def _move(
        self, spec: ClusterSpec, step: Assign | Unassign, what: str
    ) -> tuple[str | None, list[Event], str | None]:
        events = []
        call = admin.assign_partitions if isinstance(step, Assign) else admin.unassign_partitions
        verb = "assigned to" if isinstance(step, Assign) else "taken off"
        for address, partitions in sorted(step.replicas.items()):
            try:
                await self._admin(spec, call, address, set(partitions))
            except ClusterError as e:  # the admin's own safety check: wait and look again
                return f"{what}: {e}", events, None
            events.append(
                Event(
                    "Normal",
                    "ReplicasMoved",
                    f"partitions {', '.join(map(str, sorted(partitions)))} {verb} {address}",
                )
            )
        return f"{what}: replicas moving", events, None

    # --- rolling -------------------------------------------------------------------------

    async def _roll(
        self, spec: ClusterSpec, statefulset: Mapping[str, Any] | None, view: ClusterView
    ) -> tuple[str | None, list[Event]]:
        if statefulset is None:
            return None, []
        revision = (statefulset.get("status") or {}).get("updateRevision")
        if not revision:
            return None, []
        pods = {
            _ordinal(p): p
            for p in await self.kube.list("Pod", spec.namespace, selector(spec, "storage"))
        }
        claims = own_claims(
            spec,
            await self.kube.list(
                "PersistentVolumeClaim", spec.namespace, {"app.kubernetes.io/instance": spec.name}
            ),
        )
        # A grown volume whose file system grows only when mounted again: restart its pod,
        # one at a time like any roll.
        to_remount = {c["metadata"]["name"] for c in claims if needs_restart_to_resize(c)}
        states = []
        for ordinal in range(int(statefulset["spec"]["replicas"])):
            pod = pods.get(ordinal)
            # Missing (deleted, not yet recreated) or terminating: being replaced with the
            # new revision, and down meanwhile.
            replaced = pod is None or bool(pod["metadata"].get("deletionTimestamp"))
            states.append(
                PodState(
                    name=spec.storage_pod(ordinal),
                    address=spec.storage_address(ordinal),
                    ready=not replaced and pod_ready(pod),
                    current=replaced
                    or (
                        (pod["metadata"].get("labels") or {}).get(REVISION_LABEL) == revision
                        and f"data-{spec.storage_pod(ordinal)}" not in to_remount
                    ),
                )
            )
        step = next_pod_to_restart(states, view.rollout_states())
        if isinstance(step, Done):
            return None, []
        if isinstance(step, Wait):
            return f"rolling storage: {step.reason}", []
        assert isinstance(step, Restart)
        await self.kube.delete("Pod", spec.namespace, step.pod)
        return f"rolling storage: restarted {step.pod}", [
            Event("Normal", "RollingRestart", f"restarted {step.pod}: {step.reason}")
        ]

    # --- deletion ------------------------------------------------------------------------

    async def delete(self, body: Mapping[str, Any], timeout: float) -> list[Event]:
        """The resource is being deleted: stop following it, then ``teardown.tear_down``."""
        try:
            spec = replace(parse(body), address_book=self.settings.address_book)
        except SpecError as e:
            return [Event("Warning", "DeleteIncomplete", f"nothing cleaned up: {e}")]
        key = cluster_name(spec)
        monitor = self.monitors.pop(key, None)
        if monitor is not None:
            await monitor.close()
        self.metrics.forget(key)
        self.statuses.pop(key, None)
        for obj in desired_objects(spec):
            self._applied.pop(key_of(obj), None)
        with contextlib.suppress(SecretProblem):  # else: as far as we get without it
            await self._resolve_access(spec)
        return await tear_down(self.kube, lambda: self._zookeeper(spec), spec, timeout)
