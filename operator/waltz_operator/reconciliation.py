"""One reconcile of one WaltzCluster as it goes through its steps (reconcile_steps.py):
what was observed, what the spec wants, what has been decided and done so far, and the
status and Events to report. Immutable: each step returns a new one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .events import Event
from .lost_volumes import LostVolume
from .monitor import ClusterMonitor, HttpsScrape
from .observe import ClusterView
from .owned import Key
from .pipeline import Stop
from .rollout import Assign, Done, Refuse, Shrink, Unassign, Wait
from .spec import ClusterSpec, SpecError, parse

PAUSE_ANNOTATION = "waltz.io/paused"

Live = Mapping[Key, Mapping[str, Any]] | None
ScaleDownStep = Assign | Unassign | Wait | Shrink | Refuse | Done


@dataclass(frozen=True)
class StorageMembership:
    """Who is in the cluster, for scaling up: the storage nodes whose pods are ready, those
    in the replica assignment and their placement groups there, each node's zone (None:
    unknown)."""

    ready: frozenset[str]
    known: frozenset[str]
    assigned_groups: Mapping[str, int]
    zones: Mapping[str, str | None] | None


@dataclass(frozen=True)
class Reconciliation:
    # Where it starts.
    body: Mapping[str, Any]
    live: Live  # the owned objects as watched (None: not watched; every object is applied)
    key: str  # namespace/name
    generation: int
    previous: Mapping[str, Any]  # the last status written
    now: str  # the conditions' timestamp
    spec: ClusterSpec  # as parsed; then with its TLS mode and ZooKeeper access settled

    # Observed.
    statefulset: Mapping[str, Any] | None = None  # the storage StatefulSet, as it was found
    https: HttpsScrape | None = None  # how to check the daemons' HTTPS (None: plain)
    monitor: ClusterMonitor | None = None
    current_storage: int = 0  # storage nodes there are (the StatefulSet's size, or its pods)
    view: ClusterView | None = None  # the quorum state, as seen once before any change
    zookeeper_error: str | None = None  # as last seen (None: reachable)
    membership: StorageMembership | None = None  # only while scaling up
    storage_ready: int = 0
    servers_ready: int = 0
    lost_volumes: tuple[LostVolume, ...] = ()  # storage pods whose volume is gone
    rolling_storage: tuple[str, ...] = ()  # other storage pods a roll has yet to restart

    # Decided and done.
    cluster_key: str | None = None  # the cluster found (or made) where the spec points
    cluster_partitions: int | None = None  # its partition count (None: not read)
    create_error: str | None = None
    scale_down: ScaleDownStep | None = None  # None: not scaling down
    storage_size: int | None = None  # the StatefulSet's size to apply (None: the spec's)
    progress: str | None = None  # a step under way, and what it waits for
    # The servers keep the image they run until the storage nodes run the new one, and
    # why (upgrade_order.py). Apart from ``progress``: the storage roll it waits for must
    # go on; the report puts both in Progressing.
    servers_held: str | None = None
    degraded: tuple[str, ...] = ()  # refusals, with reasons
    # What needs a person but holds no step up (a lost volume the operator does not
    # replace): Degraded says it after the refusals.
    attention: tuple[str, ...] = ()
    events: tuple[Event, ...] = ()
    status: dict[str, Any] | None = None

    @property
    def paused(self) -> bool:
        return self.spec.paused

    @property
    def known_key(self) -> str | None:
        """The key of the cluster this resource was created with (None: not yet)."""
        return self.previous.get("clusterKey") or None

    @property
    def watched(self) -> ClusterMonitor:
        assert self.monitor is not None, "the cluster is watched before it is looked at"
        return self.monitor

    def told(self, *events: Event) -> Reconciliation:
        return replace(self, events=(*self.events, *events))

    def waiting(self, progress: str | None) -> Reconciliation:
        """Under way: a later step's progress replaces an earlier one's (None: no news)."""
        return replace(self, progress=progress or self.progress)

    def refusing(self, refusal: str | None) -> Reconciliation:
        return replace(self, degraded=(*self.degraded, refusal)) if refusal else self

    def asking(self, *needs: str) -> Reconciliation:
        return replace(self, attention=(*self.attention, *needs))


def is_paused(body: Mapping[str, Any], spec: ClusterSpec) -> bool:
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    return spec.paused or str(annotations.get(PAUSE_ANNOTATION, "")).lower() == "true"


def begin(
    body: Mapping[str, Any],
    live: Live,
    previous: Mapping[str, Any],
    now: str,
    address_book: tuple[str, ...],
) -> Reconciliation | Stop:
    """The reconciliation of this body, or why there is none (a spec that does not parse)."""
    meta = body.get("metadata") or {}
    try:
        spec = parse(body)
    except SpecError as e:
        return Stop("InvalidSpec", str(e))
    spec = replace(spec, paused=is_paused(body, spec), address_book=address_book)
    return Reconciliation(
        body=body,
        live=live,
        key=f"{meta.get('namespace')}/{meta.get('name')}",
        generation=int(meta.get("generation") or 0),
        previous=previous,
        now=now,
        spec=spec,
    )
