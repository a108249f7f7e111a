"""Replacing a lost storage node's replicas on the other nodes. Pure and deterministic.

A node unreachable for longer than the servers' ``replace_storage_after`` (or named by
``waltz cluster replace-storage``) loses its replicas the way an operator moves them by
hand, through the checks of ``assign`` and ``remove-storage`` (``replica_safety``), one
step at a time, each step decided afresh from the assignment and the partitions' metadata:

1. Each partition the node holds gets a replica on another node: one in a failure group
   the partition does not use yet if there is one, then the least loaded, then by
   address. The partition has one replica more than the cluster's count for a while (a
   change that is always safe, the node down or not); its owner starts a session over
   the new set, recovering without the node if it is down, copies the new replica in,
   and the new replica joins a session.
2. Once every other replica of the partition is a member of its last writing session and
   ``replica_safety`` agrees, the lost node loses the partition.
3. Once it holds none, it leaves the assignment.

A partition no other usable node can take (each holds it already) waits, and says so.
One whose majority of replicas is down cannot start a session, so its new replica cannot
join and the node keeps it until it can: the majority rule is never bent.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from .metadata import NO_SESSION, PartitionMetadata, ReplicaAssignment
from .partition_ranges import format_partition_ranges
from .replica_safety import replica_change_problem, writing_members, writing_session


@dataclass(frozen=True)
class ReplacementPlan:
    """The next step of replacing ``lost``; empty when there is nothing to do yet."""

    lost: str
    assign: Mapping[str, frozenset[int]] = field(default_factory=dict)  # node -> partitions
    unassign: frozenset[int] = frozenset()  # partitions ``lost`` gives up now
    waiting: tuple[str, ...] = ()  # why partitions wait, one line each
    no_room: tuple[int, ...] = ()  # partitions no usable node can take

    def apply(self, assignment: ReplicaAssignment) -> ReplicaAssignment:
        """``assignment`` after this step; ``lost`` leaves it once it holds nothing."""
        storages = {
            s: parts | self.assign.get(s, frozenset()) for s, parts in assignment.storages.items()
        }
        groups = dict(assignment.groups)
        if self.lost in storages:
            remaining = storages[self.lost] - self.unassign
            if remaining:
                storages[self.lost] = remaining
            else:
                del storages[self.lost]
                groups.pop(self.lost, None)
        return ReplicaAssignment(storages, groups)

    def describe(self) -> list[str]:
        """What the step does and what waits, one line each."""
        lines = [f"partitions {_ranges(ps)} get a replica on {s}" for s, ps in self.assign.items()]
        if self.unassign:
            lines.append(f"{self.lost} gives up partitions {_ranges(self.unassign)}")
        return lines + self.waits()

    def waits(self) -> list[str]:
        """Why partitions wait, one line each."""
        lines = list(self.waiting)
        if self.no_room:
            lines.append(
                f"partitions {_ranges(self.no_room)}: no other reachable storage node can hold "
                f"them (each holds them already); add a storage node"
            )
        return lines


def plan_replacement(
    assignment: ReplicaAssignment,
    num_replicas: int,
    metadata: Mapping[int, PartitionMetadata],
    lost: str,
    unusable: Collection[str] = (),
) -> ReplacementPlan:
    """The next step of moving ``lost``'s replicas to other nodes (not to ``unusable``
    ones: unreachable, or being replaced themselves). ``metadata``: the partitions'
    metadata; a partition without any has never had a session, so nothing to copy."""
    held = sorted(assignment.storages.get(lost, frozenset()))
    load = {s: len(ps) for s, ps in assignment.storages.items()}
    targets = sorted(s for s in assignment.storages if s != lost and s not in set(unusable))
    assign: dict[str, set[int]] = {}
    unassign: set[int] = set()
    waiting: list[str] = []
    no_room: list[int] = []
    for p in held:
        meta = metadata.get(p)
        others = set(assignment.replicas_of(p)) - {lost}
        if len(others) >= num_replicas:
            missing = _not_joined(p, meta, others)
            if missing is None:
                unassign.add(p)
            else:
                waiting.append(missing)
            continue
        chosen: list[str] = []
        for _ in range(num_replicas - len(others)):
            used = {assignment.groups.get(s, 0) for s in others | set(chosen)}
            candidates = [s for s in targets if s not in others and s not in chosen]
            if not candidates:
                break
            best = min(candidates, key=lambda s: (assignment.groups.get(s, 0) in used, load[s], s))
            chosen.append(best)
            load[best] += 1
        if not chosen:
            no_room.append(p)
        for s in chosen:
            assign.setdefault(s, set()).add(p)
    return ReplacementPlan(
        lost,
        {s: frozenset(ps) for s, ps in sorted(assign.items())},
        frozenset(unassign),
        tuple(waiting),
        tuple(no_room),
    )


def replacement_under_way(assignment: ReplicaAssignment, num_replicas: int, lost: str) -> bool:
    """Whether a partition of ``lost`` has taken a new replica (it has more than the
    cluster's count): the replacement must then run to its end."""
    return any(
        len(assignment.replicas_of(p)) > num_replicas
        for p in assignment.storages.get(lost, frozenset())
    )


def _not_joined(partition_id: int, meta: PartitionMetadata | None, others: set[str]) -> str | None:
    """Why the lost node cannot give up the partition yet (the other replicas have not all
    joined a session, or removing it is unsafe), or None when it can."""
    if meta is None or writing_session(meta) == NO_SESSION:
        return None  # no session has run: there is nothing to copy, and no vote to keep
    members = writing_members(meta)
    copying = sorted(others - members)
    if copying:
        return (
            f"partition {partition_id}: waiting for {', '.join(copying)} to be copied in and "
            f"join a session"
        )
    return replica_change_problem(partition_id, meta, others)


def _ranges(partitions: Collection[int]) -> str:
    return format_partition_ranges(sorted(partitions))
