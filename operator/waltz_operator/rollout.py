"""The operator's next safe step when it scales storage down or rolls storage pods. Pure.

Each function looks at what is (the replica assignment, each partition's members: the
replicas of its last writing session, caught up and in a session; the pods) and returns
one step. The kopf handlers apply the step, wait for the world to change, and ask again;
the same state always gives the same step, so a replayed event or an operator restart
does no harm.

**Scaling down** (Strimzi moves partition replicas off a broker before removing it):
1. every partition held by a leaving node gets replicas on staying nodes until it has
   ``replicas_per_partition`` there (least-loaded staying nodes first);
2. wait until every replica of those partitions is a member (copied, taken into a
   session) and no removed replica is one any more;
3. take one leaving replica off each such partition (the admin library re-checks that
   the last writing session keeps a majority), and go back to 2;
4. once no partition holds or needs a leaving node, shrink the StatefulSet.
When a partition cannot get enough replicas on the staying nodes, or has a single
replica (moving it is never safe), the scale-down is refused and nothing moves.

**Rolling storage pods** (CloudNativePG restarts replicas one at a time, never taking the
majority away): one pod at a time, first those that are down already (not ready and in
no session); a ready pod only while every
partition it holds keeps a majority of members without it, and only once every
partition's replicas are all members again (the previous pod rejoined every session).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


def majority(n: int) -> int:
    return n // 2 + 1


@dataclass(frozen=True)
class PartitionState:
    assigned: frozenset[str]  # storage addresses holding it in the assignment
    members: frozenset[str]  # replicas of its last writing session (caught up, in session)


# --- steps --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Assign:
    """Add replicas: address -> partitions."""

    replicas: Mapping[str, frozenset[int]]


@dataclass(frozen=True)
class Unassign:
    """Take partitions off leaving nodes: address -> partitions."""

    replicas: Mapping[str, frozenset[int]]


@dataclass(frozen=True)
class Wait:
    reason: str
    partitions: frozenset[int] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Shrink:
    replicas: int


@dataclass(frozen=True)
class Refuse:
    reason: str


@dataclass(frozen=True)
class Restart:
    pod: str
    reason: str


@dataclass(frozen=True)
class Done:
    pass


# --- scaling down -------------------------------------------------------------------------


def next_scale_down_step(
    addresses: Sequence[str],
    target: int,
    partitions: Mapping[int, PartitionState],
    replicas_per_partition: int,
) -> Assign | Wait | Unassign | Shrink | Refuse | Done:
    """``addresses``: the storage pods' addresses in ordinal order (pod i at index i);
    the StatefulSet keeps the first ``target``."""
    if target >= len(addresses):
        return Done()
    if target < replicas_per_partition:
        return Refuse(
            f"{target} storage nodes cannot hold {replicas_per_partition} replicas of each "
            f"partition"
        )
    staying, leaving = list(addresses[:target]), set(addresses[target:])
    affected = {p: s for p, s in partitions.items() if (s.assigned | s.members) & leaving}
    if replicas_per_partition == 1 and affected:
        return Refuse(
            f"partitions {sorted(affected)} have a single replica: moving it off a storage "
            f"node leaves a moment where its only copy's vote is needed on a node that is "
            f"going; use replicasPerPartition 3 or more"
        )

    # 1. Enough replicas on the staying nodes.
    load = {a: sum(1 for s in partitions.values() if a in s.assigned) for a in staying}
    additions: dict[str, set[int]] = {}
    for p, state in sorted(affected.items()):
        holders = state.assigned - leaving
        need = replicas_per_partition - len(holders)
        free = [a for a in staying if a not in holders]
        if need > len(free):
            return Refuse(
                f"partition {p} would have {len(holders) + len(free)} replicas on the "
                f"{target} remaining storage nodes, fewer than {replicas_per_partition}"
            )
        for address in sorted(free, key=lambda a: (load[a], staying.index(a)))[: max(0, need)]:
            additions.setdefault(address, set()).add(p)
            load[address] += 1
    if additions:
        return Assign({a: frozenset(ps) for a, ps in sorted(additions.items())})

    # 2. Every replica caught up and in a session, and no removed node's vote still
    # counted (a session since recorded the smaller set).
    unsettled = frozenset(p for p, s in affected.items() if s.assigned != s.members)
    if unsettled:
        return Wait("replicas are being copied, or sessions recording the new sets", unsettled)

    # 3. One leaving replica off each partition at a time: its last session's remaining
    # members then stay a majority of that session's set (the admin's rule).
    removals: dict[str, set[int]] = {}
    for p, state in sorted(affected.items()):
        going = sorted(state.assigned & leaving, key=addresses.index)
        if going:
            removals.setdefault(going[-1], set()).add(p)
    if removals:
        return Unassign({a: frozenset(ps) for a, ps in sorted(removals.items())})
    return Shrink(target)


# --- rolling storage pods -------------------------------------------------------------------


@dataclass(frozen=True)
class PodState:
    name: str
    address: str
    ready: bool
    current: bool  # runs the wanted revision


def next_pod_to_restart(
    pods: Iterable[PodState], partitions: Mapping[int, PartitionState]
) -> Restart | Wait | Done:
    pods = list(pods)
    outdated = [p for p in pods if not p.current]
    if not outdated:
        return Done()
    # Down already (not ready, and a member of no partition's session): restarting it
    # takes nothing away. A pod that is not ready but still serves a session (readiness
    # also fails while one of its partitions is unavailable) waits its turn like the rest.
    serving = {a for s in partitions.values() for a in s.members}
    unready = [p for p in outdated if not p.ready and p.address not in serving]
    if unready:
        return Restart(unready[0].name, "not ready and in no session: restarted first")
    not_ready = [p.name for p in pods if not p.ready]
    if not_ready:
        return Wait(f"waiting for {', '.join(not_ready)} to be ready")
    behind = frozenset(p for p, s in partitions.items() if not s.assigned <= s.members)
    if behind:
        return Wait("waiting for every replica to rejoin its partition's session", behind)
    for pod in sorted(outdated, key=lambda p: p.name, reverse=True):
        short = frozenset(
            p
            for p, s in partitions.items()
            if pod.address in s.assigned
            and len(s.members - {pod.address}) < majority(len(s.assigned))
        )
        if not short:
            return Restart(pod.name, "every partition it holds keeps a majority without it")
    return Wait("no pod can restart without a partition losing its majority")


# --- balancing (after scaling up) ---------------------------------------------------------


def next_rebalance_step(
    addresses: Sequence[str],
    partitions: Mapping[int, PartitionState],
    replicas_per_partition: int,
    groups: Mapping[str, int] | None = None,
) -> Assign | Wait | Unassign | Done:
    """Spread replicas evenly over ``addresses`` (the storage nodes in the assignment), a
    move at a time as in a scale-down: a partition first gets a replica on a light node,
    and once every replica of it is a member, loses the one on the heaviest node.

    With ``groups`` (failure domains: a node's zone), a partition whose replicas share a
    group while another group has none of them first gets a replica there, and a
    partition loses a replica from a group it holds twice before any other; a move for
    balance never lowers the number of groups a partition spans."""
    if replicas_per_partition == 1:
        # Two replicas of a one-replica partition make a session whose majority is both:
        # dropping either afterwards could lose its vote. Single replicas stay put.
        return Done()
    group = {a: (groups or {}).get(a, 0) for a in addresses}
    load = {a: sum(1 for s in partitions.values() if a in s.assigned) for a in addresses}
    order = {a: i for i, a in enumerate(addresses)}

    def spread(nodes: Iterable[str]) -> int:
        return len({group.get(a, 0) for a in nodes})

    over = {p: s for p, s in partitions.items() if len(s.assigned) > replicas_per_partition}
    if over:
        settled = {p: s for p, s in over.items() if s.assigned <= s.members}
        if not settled:
            return Wait("new replicas are being copied", frozenset(over))
        removals: dict[str, set[int]] = {}
        for p, state in sorted(settled.items()):

            def shares_a_group(a: str, held: frozenset[str] = state.assigned) -> bool:
                return sum(1 for b in held if group.get(b, 0) == group.get(a, 0)) > 1

            heaviest = max(
                state.assigned,
                key=lambda a: (shares_a_group(a), load.get(a, 0), order.get(a, -1)),
            )
            removals.setdefault(heaviest, set()).add(p)
        return Unassign({a: frozenset(ps) for a, ps in sorted(removals.items())})

    additions: dict[str, set[int]] = {}
    moved: set[int] = set()
    # Failure domains first: each partition spans as many groups as it can.
    reachable = min(replicas_per_partition, spread(addresses))
    for p, state in sorted(partitions.items()):
        if spread(state.assigned) >= reachable:
            continue
        held = {group.get(a, 0) for a in state.assigned}
        elsewhere = [a for a in addresses if group[a] not in held]
        if elsewhere:
            light = min(elsewhere, key=lambda a: (load[a], order[a]))
            additions.setdefault(light, set()).add(p)
            moved.add(p)
            load[light] += 1
    if additions:
        return Assign({a: frozenset(ps) for a, ps in sorted(additions.items())})

    while True:
        light = min(addresses, key=lambda a: (load[a], order[a]))
        heavy = max(addresses, key=lambda a: (load[a], -order[a]))
        if load[heavy] - load[light] <= 1:
            break
        candidates = [
            p
            for p, s in sorted(partitions.items())
            if heavy in s.assigned
            and light not in s.assigned
            and p not in moved
            and spread((s.assigned - {heavy}) | {light}) >= spread(s.assigned)
        ]
        if not candidates:
            break
        p = candidates[0]
        additions.setdefault(light, set()).add(p)
        moved.add(p)
        load[light] += 1
        load[heavy] -= 1
    if additions:
        return Assign({a: frozenset(ps) for a, ps in sorted(additions.items())})
    return Done()
