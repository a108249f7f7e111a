"""Which replica-set changes keep a partition recoverable. Pure.

Recovery decides what the last *writing* session W committed by a vote over W's replica
set, which the partition metadata records exactly. W's members (state ``(W,
UNRESOLVED)``) may hold W's transactions; a member recovery cannot reach counts as
offline, and too many offline members make the vote undecidable: recovery waits.

So a change to the replica assignment must leave enough of W's members assigned that
they alone are a majority of W's set. Otherwise, once a removed member's storage node
is gone, the partition could wait forever. Example: replicas {A, B, C} grow to
{A, B, C, D}; a session runs before D has caught up, so its set is {A, B, C, D} with
members {A, B, C}; removing A now would leave {B, C}, 2 of 4, short of the 3 a vote
needs. Wait until D has joined a session, then remove A.

A storage node keeps serving a partition it no longer holds in the assignment while it
is a member of the writing session (``still_needed``), so the next recovery can count
its vote; that recovery's session then drops it from the metadata.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .metadata import NO_SESSION, UNRESOLVED, PartitionMetadata


def writing_session(metadata: PartitionMetadata) -> int:
    """The last session that recorded its members (and so may have written)."""
    return max((r.session_id for r in metadata.replicas.values()), default=NO_SESSION)


def writing_members(metadata: PartitionMetadata) -> set[str]:
    """The replicas that may hold the writing session's transactions."""
    writer = writing_session(metadata)
    if writer == NO_SESSION:
        return set()
    return {
        address
        for address, state in metadata.replicas.items()
        if state.session_id == writer and state.closing_high_water_mark == UNRESOLVED
    }


def voters(metadata: PartitionMetadata, current: Iterable[str]) -> set[str]:
    """The replicas the next recovery's vote counts: the writing session's set, or the
    current set when no session has written."""
    if writing_session(metadata) == NO_SESSION:
        return set(current)
    return set(metadata.replicas)


def replica_change_problem(
    partition_id: int, metadata: PartitionMetadata, new_replicas: Iterable[str]
) -> str | None:
    """Why giving the partition the replica set ``new_replicas`` could leave it unable to
    recover, or None when it is safe."""
    members = writing_members(metadata)
    if not members:
        return None
    kept = members & set(new_replicas)
    needed = len(metadata.replicas) // 2 + 1
    if len(kept) >= needed:
        return None
    removed = ", ".join(sorted(members - kept))
    return (
        f"partition {partition_id}: its last writing session (session "
        f"{writing_session(metadata)}) counts its quorum over {len(metadata.replicas)} "
        f"replicas and only {len(kept)} of its members would remain after removing "
        f"{removed}; recovery needs {needed}. Wait until the partition's newer replicas "
        f"have joined a session (`waltz cluster show` lists each replica's session), or "
        f"remove fewer replicas at a time"
    )


def still_needed(metadata: PartitionMetadata, address: str) -> bool:
    """Whether the partition's next recovery needs ``address``'s vote (it is a member of
    the writing session): a storage node that lost the partition in the assignment keeps
    serving it until this is False. Other replicas of the set, offline, vote "nothing"."""
    return address in writing_members(metadata)


def still_serving(
    assignment: Mapping[int, Iterable[str]], metadata: Mapping[int, PartitionMetadata]
) -> dict[str, list[int]]:
    """Storage nodes that keep partitions they no longer hold in the assignment, because
    the partitions' last writing sessions may need their votes: address -> partitions.
    Delete a storage node's data only once it is not listed here."""
    kept: dict[str, list[int]] = {}
    for p, meta in sorted(metadata.items()):
        assigned = set(assignment.get(p, ()))
        for address in sorted(writing_members(meta) - assigned):
            kept.setdefault(address, []).append(p)
    return kept
