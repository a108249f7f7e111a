"""Who a recovery reaches and who joins the new store session, and how: the pure rules
``recovery_manager`` applies around the vote (``waltz_server.recovery``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from waltz_client.cluster.metadata import UNRESOLVED, PartitionMetadata, ReplicaState
from waltz_server.recovery import (
    Assessment,
    JoinMode,
    Standing,
    dirty_tails,
    join_mode,
    join_order,
    position_after_log_start,
    replicas_to_reach,
)
from waltz_server.recovery_vote import majority

# --- replicas_to_reach ----------------------------------------------------------------


def test_a_fresh_partition_reaches_its_assigned_replicas_in_order():
    assert replicas_to_reach(PartitionMetadata(), ("c", "a", "b")) == ["c", "a", "b"]


def test_removed_members_of_the_writing_session_are_reached_after_the_assignment():
    meta = PartitionMetadata(
        1,
        7,
        {
            "a": ReplicaState(7, UNRESOLVED),
            "z": ReplicaState(7, UNRESOLVED),  # removed since: still votes
            "y": ReplicaState(7, UNRESOLVED),
            "x": ReplicaState(5, 40),  # left an earlier session: holds nothing of 7's
        },
    )
    assert replicas_to_reach(meta, ("b", "a")) == ["b", "a", "y", "z"]


# --- dirty_tails ----------------------------------------------------------------------


def _assessment(truncate_to: int | None, vote: int) -> Assessment:
    return Assessment(Standing.RESOLVED, truncate_to, vote)


def test_only_assigned_replicas_with_a_dirty_tail_are_truncated_in_assessment_order():
    assessments = {
        "a": _assessment(None, 9),
        "c": _assessment(7, 7),
        "b": _assessment(5, 5),
        "z": _assessment(3, 3),  # a removed voter: only read
    }
    tails = dirty_tails(assessments, ("a", "b", "c"))
    assert tails == {"c": 7, "b": 5}
    assert list(tails) == ["c", "b"]


# --- position_after_log_start ---------------------------------------------------------


def test_a_replica_ending_below_the_log_start_skips_ahead_to_it():
    assert position_after_log_start(-1, 100) == 99
    assert position_after_log_start(42, 100) == 99
    assert position_after_log_start(99, 100) == 99
    assert position_after_log_start(150, 100) == 150


# --- join_order and join_mode ---------------------------------------------------------


def test_the_replica_holding_most_joins_first_and_ties_go_by_address():
    positions = {"a": 3, "b": 10, "c": 10, "d": 12}  # d: ahead, only truncated
    assert join_order(["d", "c", "a", "b"], positions, 10) == ["d", "b", "c", "a"]


def test_a_far_replica_is_copied_in_the_background_only_once_the_quorum_is_in():
    assert join_mode(0, 10_000, 1, 2, 5_000) is JoinMode.INLINE  # needed for the quorum
    assert join_mode(0, 10_000, 2, 2, 5_000) is JoinMode.BACKGROUND
    assert join_mode(5_000, 10_000, 2, 2, 5_000) is JoinMode.INLINE  # within the inline gap
    assert join_mode(4_999, 10_000, 2, 2, 5_000) is JoinMode.BACKGROUND
    assert join_mode(10_200, 10_000, 3, 2, 5_000) is JoinMode.INLINE  # ahead: truncated


@st.composite
def _recoveries(draw: st.DrawFn) -> tuple[dict[str, int], int, int, set[str]]:
    """Positions of the reachable replicas, the decided mark, the inline gap, and the
    replicas whose cleaning fails."""
    names = draw(st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=7, unique=True))
    decided = draw(st.integers(-1, 50_000))
    positions = {a: draw(st.integers(-1, decided + 100)) for a in names}
    inline = draw(st.integers(0, 20_000))
    failing = draw(st.sets(st.sampled_from(names)))
    return positions, decided, inline, failing


@given(_recoveries(), st.integers(1, 7))
def test_admission_keeps_the_nearest_and_copies_only_what_the_quorum_does_not_need(
    recovery: tuple[dict[str, int], int, int, set[str]], assigned: int
) -> None:
    """Admitting the replicas the way recovery_manager does: a member per cleaned
    replica, a background copy only beside a full quorum, and no near replica left out
    unless its cleaning failed."""
    positions, decided, inline, failing = recovery
    quorum = majority(max(assigned, len(positions)))
    order = join_order(positions, positions, decided)
    assert sorted(order) == sorted(positions)
    distances = [decided - positions[a] for a in order]
    assert distances == sorted(distances)
    members: list[str] = []
    background: list[str] = []
    for address in order:
        mode = join_mode(positions[address], decided, len(members), quorum, inline)
        if mode is JoinMode.BACKGROUND:
            background.append(address)
        elif address not in failing:
            members.append(address)
    for address in background:
        assert decided - positions[address] > inline
    # Only replicas that failed their cleaning keep a possible quorum out.
    healthy = [a for a in positions if a not in failing]
    assert len(members) >= min(quorum, len(healthy))
    # Background copies start once a quorum joined: everything nearer is in or failed.
    if background:
        first = order.index(background[0])
        assert len([a for a in order[:first] if a not in failing]) >= quorum
    for address in healthy:
        if decided - positions[address] <= inline:
            assert address in members
