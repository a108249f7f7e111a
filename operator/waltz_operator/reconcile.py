"""One reconcile of a WaltzCluster: observe, take the next safe step, report.

The decisions are the pure functions of reconcile_decisions.py, desired.py, rollout.py,
bootstrap.py and status.py; the steps of reconcile_steps.py read the world (the
Kubernetes objects, the cluster's quorum state from its monitor) and apply what they
decide, one after another over one reconciliation state (reconciliation.py). It is
level-triggered: each call looks at everything afresh, takes at most one step of a scale
or a roll, and the next call (the next event, or the timer) takes the next. The same
world twice gives the same step, so a replayed event is harmless.

Order of a reconcile (``ReconcileSteps.pipeline``; nothing of it while paused, except
the observing and the status):
0. settle the TLS mode, and keep the operator's own CA, certificates and ZooKeeper
   credential (security.py);
1. CreateCluster (or adopt it) once ZooKeeper answers;
2. apply the objects the spec wants, keeping the storage StatefulSet at its current size
   while a scale-down moves replicas away;
3. scaling down: the next step of ``next_scale_down_step``; a storage pod whose volume
   is gone (lost_volumes.py): a Warning, and with spec.storage.replaceLostAfterSeconds,
   once the servers replaced its node, its claim and pod deleted (made again empty);
   scaling up: new storage nodes (and such a pod, back empty) join the assignment once
   their pods are ready, then replicas are spread to them (``next_rebalance_step``);
4. growing the partitions to a larger spec.partitions (``admin.add_partitions``), once
   no scale is under way;
5. rolling storage: delete the next pod ``next_pod_to_restart`` names (the StatefulSet
   recreates it with the new template);
6. the status, from what was observed.

This module keeps what lasts between reconciles (the last status, the last Warning, one
lock per cluster) and turns the pipeline's end into an ``Outcome`` for the handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from waltz_client.runtime.tasks import wait_for
from waltz_client.wire.errors import describe

from .bootstrap import cluster_name
from .cluster_connections import ClusterConnections
from .events import Event
from .kube import KubeApi
from .metrics import OperatorMetrics
from .monitor import ClusterMonitor
from .owned import Key
from .pipeline import Step, Stop, run_pipeline
from .reconcile_decisions import WARNING_REPEAT, warning_due
from .reconcile_settings import ReconcileSettings
from .reconcile_steps import ReconcileSteps
from .reconciliation import Reconciliation, begin
from .spec import SpecError, parse
from .status import failure_status
from .teardown import tear_down
from .zk_secrets import SecretProblem

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    busy: bool = False  # a step is under way: look again soon
    status_changed: bool = True  # differs from the last status written
    failed: bool = False  # the reconcile stopped on an error: try again soon


class Reconciler:
    """Reconciles each cluster, one reconcile at a time per cluster."""

    def __init__(
        self,
        kube: KubeApi,
        metrics: OperatorMetrics,
        settings: ReconcileSettings | None = None,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
        pipeline: Sequence[Step[Reconciliation]] | None = None,
    ) -> None:
        """``pipeline``: the steps (``ReconcileSteps.pipeline`` unless given)."""
        self.kube = kube
        self.metrics = metrics
        self.settings = settings or ReconcileSettings()
        self.clock = clock
        self.connections = ClusterConnections(kube, metrics, self.settings)
        self.steps = ReconcileSteps(kube, self.connections, self.settings, clock)
        self._pipeline = tuple(pipeline) if pipeline is not None else self.steps.pipeline()
        self._locks: dict[str, asyncio.Lock] = {}
        self._closing = False
        # The last status each cluster was given: newer than a body kopf delivers
        # before the watch brings our own status write back.
        self.statuses: dict[str, dict[str, Any]] = {}
        self._warned: dict[str, tuple[str, datetime.datetime]] = {}  # the last Warning

    @property
    def monitors(self) -> dict[str, ClusterMonitor]:
        return self.connections.monitors

    async def close(self, grace: float = 30.0) -> None:
        """Stop following every cluster. Reconciles under way finish first (for up to
        ``grace`` seconds): closing a ZooKeeper client under a blocking call in a worker
        thread can leave that thread waiting forever."""
        if not self._closing:
            self._closing = True
            with contextlib.suppress(TimeoutError):
                await wait_for(self._quiesce(), grace)
        await self.connections.close()

    async def _quiesce(self) -> None:
        for lock in list(self._locks.values()):
            await lock.acquire()  # held: nothing new starts either

    # --- reconcile -----------------------------------------------------------------------

    async def reconcile(
        self, body: Mapping[str, Any], live: Mapping[Key, Mapping[str, Any]] | None = None
    ) -> Outcome:
        """One reconcile. ``live``: the owned objects as watched (None: not watched, so
        every object is applied)."""
        key = _key(body)
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
                        body, Stop("ReconcileFailed", f"reconcile failed: {describe(e)}")
                    )
                finally:
                    self.metrics.progress.finished(progress)

    async def _reconcile(
        self, body: Mapping[str, Any], live: Mapping[Key, Mapping[str, Any]] | None
    ) -> Outcome:
        previous = self._previous(body)
        now = self.clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        state = begin(body, live, previous, now, self.settings.address_book)
        if isinstance(state, Stop):
            return self._stopped(body, state)
        finished = await run_pipeline(self._pipeline, state)
        if finished.stop is not None:
            # What the steps before it did is not reported: the status says why it stopped.
            return self._stopped(body, finished.stop)
        return self._reported(finished.state)

    def _previous(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.statuses.get(_key(body)) or dict(body.get("status") or {})

    def _reported(self, state: Reconciliation) -> Outcome:
        assert state.status is not None
        spec = state.spec
        figures = self.metrics.figures(cluster_name(spec))
        figures.storage_ready, figures.storage_desired = state.storage_ready, spec.storage.replicas
        figures.server_ready, figures.server_desired = state.servers_ready, spec.server.replicas
        self.metrics.refusals.labels(cluster_name(spec)).inc(
            sum(1 for e in state.events if e.type == "Warning" and e.reason == "Refused")
        )
        self.statuses[state.key] = state.status
        return Outcome(
            state.status,
            list(state.events),
            busy=state.progress is not None,
            status_changed=state.status != state.previous,
        )

    def _stopped(self, body: Mapping[str, Any], stop: Stop) -> Outcome:
        """A reconcile that could not go on: the status says why (``failure_status``), and a
        Warning Event says it when the message is new, or again every ``WARNING_REPEAT``
        seconds while it lasts."""
        key = _key(body)
        previous = self._previous(body)
        generation = int((body.get("metadata") or {}).get("generation") or 0)
        now = self.clock()
        status = failure_status(
            previous, generation, stop.reason, stop.message, now.strftime("%Y-%m-%dT%H:%M:%SZ")
        )
        self.statuses[key] = status
        events = []
        if warning_due(
            self._warned.get(key), stop.message, now, datetime.timedelta(seconds=WARNING_REPEAT)
        ):
            self._warned[key] = (stop.message, now)
            events.append(Event("Warning", stop.reason, stop.message))
        return Outcome(
            status,
            events,
            status_changed=status != previous,
            failed=stop.reason == "ReconcileFailed",
        )

    # --- deletion ------------------------------------------------------------------------

    async def delete(self, body: Mapping[str, Any], timeout: float) -> list[Event]:
        """The resource is being deleted: stop following it, then ``teardown.tear_down``."""
        try:
            spec = replace(parse(body), address_book=self.settings.address_book)
        except SpecError as e:
            return [Event("Warning", "DeleteIncomplete", f"nothing cleaned up: {e}")]
        key = cluster_name(spec)
        await self.connections.forget(spec)
        self.metrics.forget(key)
        self.statuses.pop(key, None)
        self.steps.forget_applied(spec)
        with contextlib.suppress(SecretProblem):  # else: as far as we get without it
            await self.connections.resolve_access(spec)
        return await tear_down(self.kube, lambda: self.connections.zookeeper(spec), spec, timeout)


def _key(body: Mapping[str, Any]) -> str:
    meta = body.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"
