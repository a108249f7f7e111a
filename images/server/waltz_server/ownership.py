"""Which server owns which partition: balanced, stable, and every move bumps the generation.

Pure and deterministic, so every server computes the same answer from the
same ZooKeeper state; the lowest live server ID writes it (by compare-and-set).
A partition moves only when its owner is gone or when the balance is off by
more than one; a moved partition's generation goes up by one, so appends
stamped with the old generation are ignored. ``rebalance_retry_delay`` paces the
assigner's retries after a failed write.
"""

from __future__ import annotations

from collections.abc import Iterable

from waltz_client.cluster.metadata import Ownership


def assign_owners(current: Ownership, num_partitions: int, live: Iterable[str]) -> Ownership:
    servers = sorted(set(live))
    owners: dict[int, str | None] = {}
    generations: dict[int, int] = {}
    for p in range(num_partitions):
        owner, generation = current.partitions.get(p, (None, 0))
        owners[p] = owner if owner in servers else None
        generations[p] = generation
    if servers:
        load = {s: sorted(p for p, o in owners.items() if o == s) for s in servers}

        def lightest() -> str:
            return min(servers, key=lambda s: (len(load[s]), s))

        def heaviest() -> str:
            return max(servers, key=lambda s: (len(load[s]), s))

        for p in sorted(p for p, o in owners.items() if o is None):
            s = lightest()
            owners[p] = s
            load[s].append(p)
        while len(load[heaviest()]) - len(load[lightest()]) > 1:
            src, dst = heaviest(), lightest()
            p = load[src].pop()  # the highest partition ID of the busiest server
            load[dst].append(p)
            owners[p] = dst
    out: dict[int, tuple[str | None, int]] = {}
    for p in range(num_partitions):
        before = current.partitions.get(p, (None, 0))[0]
        moved = owners[p] != before
        out[p] = (owners[p], generations[p] + 1 if moved else generations[p])
    # Partitions beyond the count this server knows were added since it read it: kept as
    # they are, never dropped (a newer assigner places them).
    for p, entry in current.partitions.items():
        if p >= num_partitions:
            out[p] = entry
    return Ownership(out)


# A failed rebalance leaves a dead server's partitions unowned, so the first retry comes
# soon; doubling then spares a ZooKeeper that keeps failing, and the cap bounds how long
# ownership can lag once it recovers. No jitter: only one server (the assigner) retries.
REBALANCE_RETRY_FIRST = 0.5
REBALANCE_RETRY_CAP = 30.0


def rebalance_retry_delay(
    failures: int, first: float = REBALANCE_RETRY_FIRST, cap: float = REBALANCE_RETRY_CAP
) -> float:
    """Seconds to wait before retrying after ``failures`` (>= 1) consecutive failed
    rebalances: ``first``, doubling per failure, never more than ``cap``."""
    if failures < 1:
        raise ValueError(f"failures must be >= 1, got {failures}")
    # The exponent is bounded so that a long outage cannot overflow the float.
    return min(cap, first * 2.0 ** min(failures - 1, 64))


def assigner(live: Iterable[str]) -> str | None:
    """The server that writes the assignment: the lowest live server ID."""
    return min(live, default=None)


def owned_by(ownership: Ownership, server_id: str) -> dict[int, int]:
    """partition -> generation for the partitions ``server_id`` owns."""
    return {p: g for p, (s, g) in ownership.partitions.items() if s == server_id}
