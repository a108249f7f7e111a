"""Replica placement: which storage nodes hold each partition. Pure and deterministic."""

from __future__ import annotations

from .metadata import ReplicaAssignment


def placement_ring(storages: list[str], groups: dict[str, int]) -> list[str]:
    """Storage nodes in an order where neighbours come from different groups when possible."""
    by_group: dict[int, list[str]] = {}
    for s in sorted(storages):
        by_group.setdefault(groups.get(s, 0), []).append(s)
    columns = [by_group[g] for g in sorted(by_group)]
    ring: list[str] = []
    for i in range(max((len(c) for c in columns), default=0)):
        ring.extend(c[i] for c in columns if i < len(c))
    return ring


def assign_replicas(
    storages: list[str],
    num_partitions: int,
    num_replicas: int,
    groups: dict[str, int] | None = None,
) -> ReplicaAssignment:
    """Partition p goes to ``num_replicas`` consecutive ring nodes from p * num_replicas.

    Every node gets the same number of replicas (within one), and with groups
    (failure domains) a partition's replicas land in distinct groups whenever
    there are at least ``num_replicas`` groups of equal size.
    """
    if num_partitions < 1:
        raise ValueError(f"the number of partitions must be at least 1, got {num_partitions}")
    if num_replicas < 1:
        raise ValueError(f"the number of replicas must be at least 1, got {num_replicas}")
    if len(set(storages)) != len(storages):
        dupes = sorted({s for s in storages if storages.count(s) > 1})
        raise ValueError(f"storage nodes listed twice: {', '.join(dupes)}")
    if num_replicas > len(storages):
        raise ValueError(
            f"{num_replicas} replicas need at least {num_replicas} storage nodes, "
            f"got {len(storages)}"
        )
    groups = dict(groups or {})
    ring = placement_ring(storages, groups)
    held: dict[str, set[int]] = {s: set() for s in storages}
    for p in range(num_partitions):
        for k in range(num_replicas):
            held[ring[(p * num_replicas + k) % len(ring)]].add(p)
    return ReplicaAssignment(
        {s: frozenset(ps) for s, ps in held.items()}, {s: groups.get(s, 0) for s in storages}
    )


def place_new_partitions(
    current: ReplicaAssignment, first_new: int, num_partitions: int, num_replicas: int
) -> ReplicaAssignment:
    """``current`` with partitions ``first_new .. num_partitions-1`` placed too; the
    existing ones stay where they are.

    Each new replica goes, among the nodes not yet holding the partition, to one in a
    group the partition does not use yet if there is one, then to the least loaded,
    then in ring order from where ``assign_replicas`` would start the partition: the
    same rules as creation, balanced against the load the nodes carry now (after
    ``add-storage`` or ``remove-storage`` moved replicas)."""
    storages = sorted(current.storages)
    if num_replicas > len(storages):
        raise ValueError(
            f"{num_replicas} replicas need at least {num_replicas} storage nodes, "
            f"the assignment has {len(storages)}"
        )
    groups = {s: current.groups.get(s, 0) for s in storages}
    ring = placement_ring(storages, groups)
    held = {s: set(current.storages[s]) for s in storages}
    load = {s: len(parts) for s, parts in held.items()}
    for p in range(first_new, num_partitions):
        start = (p * num_replicas) % len(ring)
        ring_order = {s: (i - start) % len(ring) for i, s in enumerate(ring)}
        chosen: list[str] = []
        for _ in range(num_replicas):
            used = {groups[c] for c in chosen}
            best = min(
                (s for s in ring if s not in chosen),
                key=lambda s: (groups[s] in used, load[s], ring_order[s]),
            )
            chosen.append(best)
            load[best] += 1
            held[best].add(p)
    return ReplicaAssignment({s: frozenset(ps) for s, ps in held.items()}, dict(current.groups))


def quorum(num_replicas: int) -> int:
    """The majority of ``num_replicas``."""
    return num_replicas // 2 + 1
