"""The decisions of the spec's Recovery Procedure, pure and deterministic.

A store session S starts by resolving what the last *writing* session W
committed. W is the highest session any replica state in the partition
metadata names: a session writes only after it recorded its members there
(state ``(W, UNRESOLVED)``), so a session that died during its own recovery
wrote nothing and is not W. Each reachable replica is classified by comparing
its replica state (ZooKeeper) with what the storage node reports (the session
that last set its low-water mark, ``L``):

- ``MEMBER``: state session == L == W. Its log is the committed prefix W
  started from plus W's appends, some perhaps uncommitted: it votes its
  maximum transaction ID.
- ``CLEAN``: L > state session. A later session cleaned it (truncated and
  caught it up to a decided mark, then set the low-water mark) and died
  before writing: its whole log is committed; it votes its maximum.
- ``RESOLVED``: state session == L < W with a resolved closing mark X: it
  left session L, whose committed end is X, so anything above X is dirty.
  Truncate to X first; it votes min(max, X).
- ``UNKNOWN``: anything else (a new replica, or a storage that lost its
  control file): only its own low-water mark is known clean. Truncate to it
  first; it votes that mark.

Only W's members can hold W's transactions, so only offline members make
the vote undecidable; the rest vote low. After the vote decides C, every
reachable replica is truncated to C, caught up to C from a replica holding
it, and gets low-water mark C for session S; those become S's members. A
replica far behind C joins only if S needs it for its quorum; otherwise it
keeps its committed prefix and is copied in the background (catch_up.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from waltz_client.cluster.metadata import (
    NO_SESSION,
    UNRESOLVED,
    PartitionMetadata,
    ReplicaState,
)
from waltz_client.cluster.replica_safety import writing_members, writing_session

from .recovery_vote import Decided, Undecidable, vote


class Standing(Enum):
    MEMBER = "member of the last writing session"
    CLEAN = "cleaned by a later session"
    RESOLVED = "left an earlier session with a resolved closing mark"
    UNKNOWN = "state unknown: trusted up to its own low-water mark"


@dataclass(frozen=True)
class StorageView:
    """What a reachable storage node reports for the partition."""

    last_session_id: int  # the session that last set its low-water mark
    low_water_mark: int
    local_low_water_mark: int
    max_transaction_id: int


@dataclass(frozen=True)
class Assessment:
    standing: Standing
    truncate_to: int | None  # before the vote; None: keep everything
    vote: int  # the highest transaction ID it holds that is certainly not dirty


def assess(state: ReplicaState, view: StorageView, writer: int) -> Assessment:
    top = view.max_transaction_id
    if state.session_id == view.last_session_id == writer:
        return Assessment(Standing.MEMBER, None, top)
    if view.last_session_id > state.session_id:
        return Assessment(Standing.CLEAN, None, top)
    if state.session_id == view.last_session_id and state.closing_high_water_mark != UNRESOLVED:
        closing = state.closing_high_water_mark
        return Assessment(Standing.RESOLVED, closing if top > closing else None, min(top, closing))
    floor = view.local_low_water_mark
    return Assessment(Standing.UNKNOWN, floor if top > floor else None, min(top, floor))


def replicas_to_reach(metadata: PartitionMetadata, replicas: Sequence[str]) -> list[str]:
    """The storage nodes a recovery connects to: the assigned ``replicas``, then the
    writing session's members removed from the assignment since. Those still vote: their
    nodes keep serving the partition until this session's metadata drops them."""
    return [*replicas, *sorted(writing_members(metadata) - set(replicas))]


@dataclass(frozen=True)
class OwnSession:
    """What this server knows of a session it ran itself: everything up to
    ``acknowledged`` was reported committed, nothing above it was."""

    session_id: int
    acknowledged: int


def decide(
    metadata: PartitionMetadata,
    replicas: Iterable[str],
    views: Mapping[str, StorageView],
    own: OwnSession | None = None,
) -> tuple[dict[str, Assessment], Decided | Undecidable]:
    """Assess every reachable replica and vote. ``replicas`` is the partition's current
    replica set; ``views`` may also hold voters no longer in it (members of the writing
    session since removed from the assignment: their storage nodes keep serving the
    partition for this vote). Voters missing from ``views`` are offline.

    ``own``: when this server ran the writing session itself, an undecidable vote has a
    safe answer it alone can give. Nobody saw a transaction above what it acknowledged,
    so those may be dropped: truncated now on reachable replicas, and on the offline ones
    when they return (their closing mark becomes the decided one). The answer keeps every
    acknowledged transaction (a majority acknowledged it, a majority is reachable: one
    reachable replica holds it) and whatever a majority of all replicas visibly holds.
    A new owner has no such knowledge and waits, as the spec says."""
    writer = writing_session(metadata)
    current = set(replicas)
    # W's commits were counted against W's replica set, which the metadata lists exactly
    # (closing_metadata records each session's set); before any session wrote, the
    # current set. A replica added since cannot hold W's transactions and does not vote.
    voters = set(metadata.replicas) if writer != NO_SESSION else current
    assessments: dict[str, Assessment] = {}
    marks: list[int] = []
    offline = 0
    for address in sorted(current | voters):
        state = metadata.replicas.get(address, ReplicaState())
        view = views.get(address)
        assessment = assess(state, view, writer) if view is not None else None
        if assessment is not None:
            assessments[address] = assessment
        if address not in voters:
            continue
        member = state.session_id == writer and state.closing_high_water_mark == UNRESOLVED
        if assessment is None or (member and assessment.standing == Standing.UNKNOWN):
            # Offline, or a member of W that lost its state (a replaced disk): either may
            # have acknowledged W's transactions, so its vote is unknown.
            if member:
                offline += 1
            else:
                marks.append(-1)  # cannot hold anything W committed that others lack
            continue
        marks.append(assessment.vote)
    decision = vote(marks, offline)
    if isinstance(decision, Undecidable) and own is not None and own.session_id == writer:
        total = len(marks) + offline
        visible = [
            h for h in sorted(set(marks), reverse=True) if _holders(marks, h) >= total // 2 + 1
        ]
        reachable_top = max((a.vote for a in assessments.values()), default=-1)
        if len(assessments) >= total // 2 + 1 and reachable_top >= own.acknowledged:
            return assessments, Decided(max(own.acknowledged, visible[0] if visible else -1))
    return assessments, decision


def _holders(marks: list[int], h: int) -> int:
    return sum(1 for m in marks if m >= h)


def dirty_tails(assessments: Mapping[str, Assessment], replicas: Iterable[str]) -> dict[str, int]:
    """The assigned replicas to truncate before the vote's mark is used, and where to, in
    ``assessments`` order. A removed voter is only read, never written."""
    assigned = set(replicas)
    return {
        address: a.truncate_to
        for address, a in assessments.items()
        if a.truncate_to is not None and address in assigned
    }


def position_after_log_start(position: int, log_start: int) -> int:
    """A replica's clean position once its log starts at ``log_start`` (retention): one
    whose log ends below it skips ahead, to start empty there."""
    return max(position, log_start - 1)


class JoinMode(Enum):
    INLINE = "cleaned to the decided mark now, and a member of the new session"
    BACKGROUND = "far behind while the session has its quorum: copied in the background"


def join_order(candidates: Iterable[str], positions: Mapping[str, int], decided: int) -> list[str]:
    """The order in which reachable replicas join the new session: those holding the most
    first (one ahead of the decided mark is only truncated; ties by address), so that a
    far one is needed least."""
    return sorted(candidates, key=lambda a: (decided - positions[a], a))


def far_behind(position: int, decided: int, inline_records: int) -> bool:
    """Whether a replica at ``position`` is too far behind ``decided`` to be copied while
    the partition waits (more than ``inline_records``)."""
    return decided - position > inline_records


def join_mode(
    position: int, decided: int, members: int, quorum: int, inline_records: int
) -> JoinMode:
    """How the next replica (in ``join_order``) reaches ``decided``, with ``members``
    joined so far. Copying more than ``inline_records`` would hold up the whole
    partition's writes: only a replica the quorum needs is worth it. A replica not
    ``far_behind`` joins inline whatever the count, so those may join all at once."""
    if far_behind(position, decided, inline_records) and members >= quorum:
        return JoinMode.BACKGROUND
    return JoinMode.INLINE


@dataclass(frozen=True)
class ReplicaPlan:
    truncate_to: int | None  # remove a dirty tail above the decided mark
    catch_up_from: int | None  # first transaction ID to copy from another replica


def plan_replica(position: int, decided: int) -> ReplicaPlan:
    """``position``: the replica's max transaction ID after its pre-vote truncation."""
    if position > decided:
        return ReplicaPlan(decided, None)
    if position < decided:
        return ReplicaPlan(None, position + 1)
    return ReplicaPlan(None, None)


def pick_source(positions: Mapping[str, int], votes: Mapping[str, int], decided: int) -> str:
    """A replica whose certainly-clean log reaches ``decided`` (the vote guarantees one)."""
    for address in sorted(votes):
        if votes[address] >= decided and positions.get(address, -1) >= decided:
            return address
    raise ValueError(f"no replica holds the decided high-water mark {decided}")


def closing_metadata(
    metadata: PartitionMetadata,
    generation: int,
    session_id: int,
    replicas: Iterable[str],
    members: Iterable[str],
    decided: int,
) -> PartitionMetadata:
    """Step 6: the new session's members become ``(S, UNRESOLVED)``; replicas that left a
    session with an unresolved closing mark get the decided one; others keep theirs.
    Replicas no longer assigned are dropped."""
    member_set = set(members)
    states: dict[str, ReplicaState] = {}
    # Exactly the session's replica set: the next recovery counts its quorum over it.
    for address in sorted(set(replicas)):
        old = metadata.replicas.get(address, ReplicaState())
        if address in member_set:
            states[address] = ReplicaState(session_id, UNRESOLVED)
        elif old.closing_high_water_mark == UNRESOLVED:
            states[address] = ReplicaState(old.session_id, decided)
        else:
            states[address] = old
    return PartitionMetadata(generation, session_id, states, metadata.log_start)
