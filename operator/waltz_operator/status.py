"""A WaltzCluster's status, computed from what the operator observed. Pure.

Conditions are shaped like metav1.Condition. A condition's ``lastTransitionTime`` moves
only when its status changes, so the previous status is an input; the clock is too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .desired import selector_string
from .spec import ClusterSpec

CONDITIONS = (
    "Ready",
    "ZooKeeperReachable",
    "ClusterCreated",
    "StorageReady",
    "ServersReady",
    "QuorumHealthy",
    "Progressing",
    "Degraded",
)


@dataclass(frozen=True)
class PartitionObserved:
    partition: int
    owner: str | None
    generation: int
    live_replicas: int  # in the running store session (0: none running)
    assigned_replicas: int
    high_water_mark: int

    @property
    def quorum(self) -> bool:
        return self.assigned_replicas > 0 and self.live_replicas >= self.assigned_replicas // 2 + 1


@dataclass(frozen=True)
class Observed:
    zookeeper_error: str | None = None  # None: reachable
    cluster_key: str | None = None  # None: not created (yet)
    create_error: str | None = None  # CreateCluster refused, and why
    storage_ready: int = 0
    servers_ready: int = 0
    partitions: Sequence[PartitionObserved] = ()
    progress: str | None = None  # a scale or roll under way, and what it waits for
    degraded: Sequence[str] = field(default_factory=tuple)  # refusals, with reasons
    # What needs a person but is no refusal (a storage volume that is gone).
    attention: Sequence[str] = field(default_factory=tuple)


def _condition(
    kind: str,
    ok: bool,
    reason: str,
    message: str,
    previous: Mapping[str, Mapping[str, Any]],
    generation: int,
    now: str,
) -> dict[str, Any]:
    status = "True" if ok else "False"
    before = previous.get(kind)
    moved = before is None or before.get("status") != status
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": now if moved else before.get("lastTransitionTime", now),
    }


def compute_status(
    spec: ClusterSpec,
    generation: int,
    observed: Observed,
    previous: Mapping[str, Any] | None,
    now: str,
) -> dict[str, Any]:
    """The status subresource's new content."""
    prev = {c["type"]: c for c in (previous or {}).get("conditions", []) if "type" in c}
    o = observed
    # The partitions the spec wants, or those the cluster has when it has more (a lower
    # spec.partitions is refused: partitions never shrink).
    total = max(spec.partitions, len(o.partitions))
    with_quorum = sum(1 for p in o.partitions if p.quorum)
    zk_ok = o.zookeeper_error is None
    created = o.cluster_key is not None
    storage_ok = o.storage_ready >= spec.storage.replicas
    servers_ok = o.servers_ready >= spec.server.replicas
    quorum_ok = created and with_quorum == total
    lost = sorted(p.partition for p in o.partitions if not p.quorum)

    def cond(kind: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
        return _condition(kind, ok, reason, message, prev, generation, now)

    conditions = [
        cond(
            "ZooKeeperReachable",
            zk_ok,
            "Connected" if zk_ok else "Unreachable",
            f"{spec.zookeeper} answers" if zk_ok else f"{spec.zookeeper}: {o.zookeeper_error}",
        ),
        cond(
            "ClusterCreated",
            created,
            "Created" if created else ("Refused" if o.create_error else "Pending"),
            f"cluster key {o.cluster_key} at {spec.zk_root}"
            if created
            else (o.create_error or "waiting for ZooKeeper to create the cluster"),
        ),
        cond(
            "StorageReady",
            storage_ok,
            "AllReady" if storage_ok else "NotReady",
            f"{o.storage_ready}/{spec.storage.replicas} storage pods ready",
        ),
        cond(
            "ServersReady",
            servers_ok,
            "AllReady" if servers_ok else "NotReady",
            f"{o.servers_ready}/{spec.server.replicas} server pods ready",
        ),
        cond(
            "QuorumHealthy",
            quorum_ok,
            "AllPartitions" if quorum_ok else "QuorumLost",
            f"{with_quorum}/{total} partitions hold a quorum"
            + (f"; without one: {', '.join(map(str, lost))}" if lost else ""),
        ),
        cond(
            "Progressing",
            o.progress is not None and not spec.paused,
            "Paused" if spec.paused else ("InProgress" if o.progress else "Idle"),
            "changes are paused (spec.paused)" if spec.paused else (o.progress or "up to date"),
        ),
        cond(
            "Degraded",
            bool(o.degraded or o.attention),
            "Refused" if o.degraded else ("NeedsAttention" if o.attention else "AsDesired"),
            "; ".join([*o.degraded, *o.attention]) or "nothing refused",
        ),
    ]
    ready = zk_ok and created and storage_ok and servers_ok and quorum_ok
    not_ready = [c["type"] for c in conditions[:5] if c["status"] != "True"]
    conditions.insert(
        0,
        cond(
            "Ready",
            ready,
            "Ready" if ready else "NotReady",
            "every pod is ready and every partition holds a quorum"
            if ready
            else f"not yet: {', '.join(not_ready)}",
        ),
    )
    return {
        "observedGeneration": generation,
        "clusterKey": o.cluster_key or "",
        "quorum": f"{with_quorum}/{total}",
        "storage": {
            "desired": spec.storage.replicas,
            "ready": o.storage_ready,
            "summary": f"{o.storage_ready}/{spec.storage.replicas}",
            "selector": selector_string(spec, "storage"),
        },
        "servers": {
            "desired": spec.server.replicas,
            "ready": o.servers_ready,
            "summary": f"{o.servers_ready}/{spec.server.replicas}",
            "selector": selector_string(spec, "server"),
        },
        "partitions": [
            {
                "partition": p.partition,
                "owner": p.owner or "",
                "generation": p.generation,
                "liveReplicas": p.live_replicas,
                "assignedReplicas": p.assigned_replicas,
                "highWaterMark": p.high_water_mark,
            }
            for p in o.partitions
        ],
        "conditions": conditions,
    }


def failure_status(
    previous: Mapping[str, Any], generation: int, reason: str, message: str, now: str
) -> dict[str, Any]:
    """The status after a reconcile that could not finish: what was last observed stays,
    ``Degraded`` (the one condition whose True is bad) says what failed, and
    ``Progressing`` stops claiming that the cluster is up to date."""
    prev = {c["type"]: c for c in previous.get("conditions", []) if "type" in c}
    degraded = _condition("Degraded", True, reason, message, prev, generation, now)
    progressing = _condition(
        "Progressing", False, reason, f"stopped: {message}", prev, generation, now
    )
    replaced = {"Degraded": degraded, "Progressing": progressing}
    conditions = [replaced.pop(c.get("type"), c) for c in previous.get("conditions", [])]
    return {**previous, "conditions": [*conditions, *replaced.values()]}
