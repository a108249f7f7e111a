"""Replacing a lost storage node against ZooKeeper, one step of ``replacement``'s plan at
a time, and the record of it (``<root>/store/replacements``).

Each step is a compare-and-set of the replica assignment through ``admin.update_assignment``
(which checks ``replica_safety`` against the partitions' metadata in the same
transaction); the record says which nodes are being replaced and what was done, for
``waltz cluster show``, the metrics and the next assigner, which carries a recorded
replacement on to its end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from .admin import read_assignment, read_params, update_assignment, update_document
from .errors import ClusterError
from .metadata import (
    ClusterParams,
    MetadataError,
    PartitionMetadata,
    ReplacementEvent,
    Replacing,
    ReplicaAssignment,
    StorageReplacements,
)
from .paths import ClusterPaths
from .replacement import ReplacementPlan, plan_replacement, replacement_under_way


@dataclass(frozen=True)
class ReplacementStep:
    """What one step did: its plan (None when ``lost`` had left the assignment already),
    the assignment after it, and whether ``lost`` has left the assignment."""

    lost: str
    plan: ReplacementPlan | None
    assignment: ReplicaAssignment
    finished: bool


def read_replacements(zk: KazooClient, root: str) -> tuple[StorageReplacements, int]:
    """The record and its znode version (-1 when there is none yet)."""
    path = ClusterPaths.of(root).replacements
    try:
        data, stat = zk.get(path)
    except NoNodeError:
        return StorageReplacements(), -1
    try:
        return StorageReplacements.decode(data), stat.version
    except MetadataError as e:
        raise ClusterError(f"{path}: {e}") from None


def replace_storage_step(
    zk: KazooClient,
    root: str,
    lost: str,
    *,
    unusable: Collection[str] = (),
    reason: str = "",
    automatic: bool = False,
    now_ms: int | None = None,
) -> ReplacementStep:
    """Take the next step of replacing ``lost`` (recording it as being replaced first).
    ClusterError when ``lost`` is not in the cluster and no replacement of it is recorded,
    or when ``update_assignment`` refuses."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    record, _ = read_replacements(zk, root)
    assignment, _ = read_assignment(zk, root)
    if lost not in assignment.storages:
        if lost not in record.replacing:
            raise ClusterError(
                f"storage node {lost} is not in the cluster "
                f"(nodes: {', '.join(sorted(assignment.storages)) or 'none'})"
            )
        _update_record(zk, root, lambda r: _finished(r, lost, now_ms))
        return ReplacementStep(lost, None, assignment, True)
    if lost not in record.replacing:
        replacing = Replacing(now_ms, reason, automatic)
        _update_record(zk, root, lambda r: _started(r, lost, replacing))

    paths = ClusterPaths.of(root)
    plans: list[ReplacementPlan] = []

    def change(current: ReplicaAssignment, params: ClusterParams) -> ReplicaAssignment:
        metadata = _metadata(zk, paths, current.storages.get(lost, frozenset()))
        plan = plan_replacement(current, params.num_replicas, metadata, lost, unusable)
        plans.append(plan)
        return plan.apply(current)

    new = update_assignment(zk, root, change)
    plan = plans[-1]
    finished = lost not in new.storages
    events = [
        ReplacementEvent(now_ms, lost, "assigned", tuple(sorted(ps)), to=s)
        for s, ps in plan.assign.items()
    ]
    if plan.unassign:
        events.append(ReplacementEvent(now_ms, lost, "unassigned", tuple(sorted(plan.unassign))))
    if events or finished:
        _update_record(
            zk,
            root,
            lambda r: (
                _finished(r.with_events(*events), lost, now_ms)
                if finished
                else r.with_events(*events)
            ),
        )
    return ReplacementStep(lost, plan, new, finished)


def cancel_replacement(zk: KazooClient, root: str, lost: str, detail: str) -> bool:
    """Drop the recorded replacement of ``lost`` unless one of its partitions has taken a
    new replica already (then it must run to its end); whether it was dropped."""
    params = read_params(zk, root)
    assignment, _ = read_assignment(zk, root)
    if replacement_under_way(assignment, params.num_replicas, lost):
        return False
    now_ms = int(time.time() * 1000)

    def cancel(record: StorageReplacements) -> StorageReplacements:
        if lost not in record.replacing:
            return record
        replacing = {s: r for s, r in record.replacing.items() if s != lost}
        event = ReplacementEvent(now_ms, lost, "cancelled", detail=detail)
        return StorageReplacements(replacing, record.events).with_events(event)

    _update_record(zk, root, cancel)
    return True


def _started(record: StorageReplacements, lost: str, replacing: Replacing) -> StorageReplacements:
    if lost in record.replacing:
        return record  # another writer recorded it meanwhile
    event = ReplacementEvent(replacing.since_ms, lost, "started", detail=replacing.reason)
    return StorageReplacements({**record.replacing, lost: replacing}, record.events).with_events(
        event
    )


def _finished(record: StorageReplacements, lost: str, now_ms: int) -> StorageReplacements:
    if lost not in record.replacing:
        return record
    replacing = {s: r for s, r in record.replacing.items() if s != lost}
    removed = ReplacementEvent(now_ms, lost, "removed", detail="left the replica assignment")
    return StorageReplacements(replacing, record.events).with_events(removed)


def _metadata(
    zk: KazooClient, paths: ClusterPaths, partitions: Iterable[int]
) -> dict[int, PartitionMetadata]:
    out = {}
    for p in sorted(partitions):
        try:
            data, _ = zk.get(paths.partition(p))
        except NoNodeError:
            continue  # no session has run
        try:
            out[p] = PartitionMetadata.decode(data)
        except MetadataError as e:
            raise ClusterError(f"{paths.partition(p)}: {e}") from None
    return out


def _update_record(
    zk: KazooClient, root: str, change: Callable[[StorageReplacements], StorageReplacements]
) -> StorageReplacements:
    return update_document(
        zk,
        ClusterPaths.of(root).replacements,
        "the storage replacements record",
        lambda: read_replacements(zk, root),
        change,
        lambda new: None,  # every record this module makes is one the servers read
    )
