"""Storage pods whose volume is gone. Pure.

A storage pod keeps its data on its PersistentVolumeClaim, ``data-<name>-storage-<i>``.
That volume is gone when:

- the claim's ``status.phase`` is ``Lost`` (its PersistentVolume was deleted);
- the claim is missing (or being deleted) while its pod is there and not being deleted
  (a StatefulSet makes the claim before the pod);
- the pod is ``Pending``, unschedulable for a "volume node affinity conflict" on every
  node: its local volume belongs to a node that is gone. (When the scheduler's message
  counts fewer such nodes than nodes, the volume's node is still there, cordoned for a
  drain, tainted or full: not a loss.)

Such a pod never comes back with its data: its storage node has to be replaced
(docs/operator.md, "A storage pod whose volume is gone"). Only ordinals below the
StatefulSet's size count (a higher one is leaving). A claim and a pod both being deleted
are not a loss any more: the StatefulSet makes them again, the claim with an empty volume.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .spec import ClusterSpec

# The scheduler's words for a pod whose bound volume's node affinity no node satisfies.
VOLUME_NODE_AFFINITY_CONFLICT = "volume node affinity conflict"


@dataclass(frozen=True)
class LostVolume:
    """Storage pod ``ordinal`` has lost its volume, for ``reason``."""

    ordinal: int
    pod: str
    claim: str
    reason: str
    pod_exists: bool  # and is not being deleted
    claim_exists: bool  # and is not being deleted


def claim_name(spec: ClusterSpec, ordinal: int) -> str:
    return f"data-{spec.storage_pod(ordinal)}"


def lost_volumes(
    spec: ClusterSpec,
    pods: Sequence[Mapping[str, Any]],
    claims: Sequence[Mapping[str, Any]],
    size: int,
) -> list[LostVolume]:
    """The storage ordinals below ``size`` whose volume is gone, in ordinal order.
    ``pods`` and ``claims``: the cluster's own (``teardown.own_pods``, ``own_claims``)."""
    pods_by_name = {_name(p): p for p in pods}
    claims_by_name = {_name(c): c for c in claims}
    found = []
    for ordinal in range(size):
        pod = pods_by_name.get(spec.storage_pod(ordinal))
        claim = claims_by_name.get(claim_name(spec, ordinal))
        pod_there = pod is not None and not _deleting(pod)
        claim_there = claim is not None and not _deleting(claim)
        reason = _why_lost(pod if pod_there else None, claim, claim_there)
        if reason is not None:
            found.append(
                LostVolume(
                    ordinal,
                    spec.storage_pod(ordinal),
                    claim_name(spec, ordinal),
                    reason,
                    pod_there,
                    claim_there,
                )
            )
    return found


def _why_lost(
    pod: Mapping[str, Any] | None, claim: Mapping[str, Any] | None, claim_there: bool
) -> str | None:
    if claim is not None and claim_there and (claim.get("status") or {}).get("phase") == "Lost":
        volume = (claim.get("spec") or {}).get("volumeName")
        gone = f"its PersistentVolume {volume}" if volume else "its PersistentVolume"
        return f"the claim is Lost ({gone} is gone)"
    if pod is None:
        return None
    if not claim_there:
        return (
            "the claim is being deleted while the pod runs"
            if claim is not None
            else "the claim is missing while the pod exists"
        )
    conflict = _volume_node_conflict(pod)
    if conflict is not None:
        return f"the pod cannot be scheduled: {conflict} (its local volume's node is gone)"
    return None


def _volume_node_conflict(pod: Mapping[str, Any]) -> str | None:
    status = pod.get("status") or {}
    if status.get("phase", "Pending") != "Pending":
        return None
    for condition in status.get("conditions") or []:
        if condition.get("type") != "PodScheduled" or condition.get("status") != "False":
            continue
        message = str(condition.get("message") or "")
        if VOLUME_NODE_AFFINITY_CONFLICT in message.lower() and not _node_still_there(message):
            return message
    return None


def _node_still_there(message: str) -> bool:
    """The scheduler's message counts the nodes (``0/3 nodes are available: 1 node(s) were
    unschedulable, 2 node(s) had volume node affinity conflict``): fewer conflicts than
    nodes mean the volume's own node exists, unschedulable for another reason."""
    nodes = re.search(r"\b0/(\d+) nodes are available", message)
    conflicts = re.search(r"(\d+) node\(s\) had volume node affinity conflict", message)
    if nodes is None or conflicts is None:
        return False
    return int(conflicts.group(1)) < int(nodes.group(1))


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _deleting(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))
