"""The Recovery Procedure's decisions: assessments, the vote, plans and closing metadata.

Unit tests for every branch of ``waltz_server.recovery``, then a model of a
three-replica partition whose store sessions recover through these functions,
crash at any point of their recovery, and append to some of their members. The
model checks the spec's promise: the decided high-water mark is exactly the
highest committed transaction, a committed transaction is never lost, and the
logs never fork.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from storage_model import Storage

from waltz_client.cluster.metadata import (
    NO_SESSION,
    UNRESOLVED,
    PartitionMetadata,
    ReplicaState,
)
from waltz_server.recovery import (
    Assessment,
    OwnSession,
    ReplicaPlan,
    Standing,
    StorageView,
    assess,
    closing_metadata,
    decide,
    pick_source,
    plan_replica,
    writing_session,
)
from waltz_server.recovery_vote import Decided, Undecidable


def view(last_session: int, low_water_mark: int, top: int) -> StorageView:
    """What a storage node reports: local low-water mark = min(low-water mark, its max)."""
    return StorageView(last_session, low_water_mark, min(low_water_mark, top), top)


def meta(*states: tuple[str, int, int], session_id: int | None = None) -> PartitionMetadata:
    replicas = {address: ReplicaState(s, x) for address, s, x in states}
    if session_id is None:
        session_id = max((s for _, s, _ in states), default=NO_SESSION)
    return PartitionMetadata(1, session_id, replicas)


# --- writing_session ------------------------------------------------------------------


def test_writing_session_of_a_fresh_partition_is_no_session():
    assert writing_session(PartitionMetadata()) == NO_SESSION


def test_writing_session_is_the_highest_session_any_replica_state_names():
    m = meta(("a", 3, 10), ("b", 7, UNRESOLVED), ("c", 5, 12))
    assert writing_session(m) == 7


def test_writing_session_ignores_sessions_that_died_before_writing_replica_states():
    # Sessions 8 and 9 took session IDs (the metadata's session_id) but wrote no states.
    m = meta(("a", 7, UNRESOLVED), ("b", 7, UNRESOLVED), session_id=9)
    assert writing_session(m) == 7


# --- assess ---------------------------------------------------------------------------


def test_member_of_the_writing_session_votes_its_maximum():
    a = assess(ReplicaState(5, UNRESOLVED), view(5, 10, 17), writer=5)
    assert a == Assessment(Standing.MEMBER, None, 17)


def test_member_with_an_empty_log_votes_minus_one():
    assert assess(ReplicaState(0, UNRESOLVED), view(0, -1, -1), writer=0) == Assessment(
        Standing.MEMBER, None, -1
    )


def test_every_replica_of_a_fresh_partition_is_a_member():
    a = assess(ReplicaState(), view(NO_SESSION, -1, -1), writer=NO_SESSION)
    assert a == Assessment(Standing.MEMBER, None, -1)


def test_replica_cleaned_by_a_later_session_votes_its_maximum():
    # Left session 3 (resolved at 10); session 6 cleaned it to 14 and died before writing.
    a = assess(ReplicaState(3, 10), view(6, 14, 14), writer=5)
    assert a == Assessment(Standing.CLEAN, None, 14)


def test_clean_is_recognised_whatever_the_writer_and_closing_mark():
    # A member of the writer whose low-water mark a later (dead) session set.
    assert assess(ReplicaState(5, UNRESOLVED), view(6, 9, 9), writer=5).standing == (Standing.CLEAN)
    # Still CLEAN when the later session is itself newer than the writer's.
    assert assess(ReplicaState(2, UNRESOLVED), view(4, 9, 9), writer=3) == Assessment(
        Standing.CLEAN, None, 9
    )


@pytest.mark.parametrize(
    ("top", "truncate_to", "vote"),
    [(15, 10, 10), (10, None, 10), (8, None, 8), (-1, None, -1)],
)
def test_resolved_replica_truncates_above_its_closing_mark(top, truncate_to, vote):
    a = assess(ReplicaState(3, 10), view(3, 4, top), writer=5)
    assert a == Assessment(Standing.RESOLVED, truncate_to, vote)


def test_resolved_closing_mark_of_zero_is_honoured():
    a = assess(ReplicaState(2, 0), view(2, -1, 3), writer=4)
    assert a == Assessment(Standing.RESOLVED, 0, 0)


@pytest.mark.parametrize(
    ("top", "truncate_to", "vote"),
    [(20, 6, 6), (6, None, 6), (4, None, 4)],
)
def test_non_member_with_an_unresolved_mark_is_trusted_to_its_low_water_mark(
    top, truncate_to, vote
):
    a = assess(ReplicaState(3, UNRESOLVED), view(3, 6, top), writer=5)
    assert a == Assessment(Standing.UNKNOWN, truncate_to, vote)


def test_unknown_uses_the_local_low_water_mark_not_the_low_water_mark():
    # The session set low-water mark 30 while the replica only held up to 12.
    v = StorageView(3, 30, 12, 25)
    assert assess(ReplicaState(3, UNRESOLVED), v, writer=5) == Assessment(Standing.UNKNOWN, 12, 12)


def test_storage_that_lost_its_control_file_is_unknown_even_if_a_member():
    # Metadata says member of the writer, the storage reports no session at all.
    a = assess(ReplicaState(5, UNRESOLVED), view(NO_SESSION, -1, 40), writer=5)
    assert a == Assessment(Standing.UNKNOWN, -1, -1)


def test_new_replica_is_unknown():
    a = assess(ReplicaState(), view(NO_SESSION, -1, -1), writer=4)
    assert a == Assessment(Standing.UNKNOWN, None, -1)


def test_storage_behind_its_replica_state_is_unknown():
    # State says session 5 resolved at 9, but the storage's last session is 4.
    a = assess(ReplicaState(5, 9), view(4, 3, 20), writer=6)
    assert a == Assessment(Standing.UNKNOWN, 3, 3)


_sessions = st.integers(-1, 6)
_marks = st.integers(-1, 30)


@given(
    state_session=_sessions,
    closing=_marks,
    last=_sessions,
    lwm=_marks,
    top=_marks,
    writer=_sessions,
)
def test_assessment_is_consistent(state_session, closing, last, lwm, top, writer):
    state = ReplicaState(state_session, closing)
    v = view(last, lwm, top)
    a = assess(state, v, writer)
    # The vote is what the log holds after the pre-vote truncation.
    assert a.vote <= top
    if a.truncate_to is None:
        assert a.vote == top
    else:
        assert a.truncate_to < top
        assert a.vote == a.truncate_to
    # Never truncate below what the storage itself knows is committed (it would refuse),
    # given a closing mark no lower than the low-water mark its session set.
    if a.truncate_to is not None and (a.standing is Standing.UNKNOWN or closing >= lwm):
        assert a.truncate_to >= v.local_low_water_mark
    # The classification.
    if state_session == last == writer:
        assert a.standing is Standing.MEMBER
    elif last > state_session:
        assert a.standing is Standing.CLEAN
    elif state_session == last and closing != UNRESOLVED:
        assert a.standing is Standing.RESOLVED
        assert a.vote == min(top, closing)
    else:
        assert a.standing is Standing.UNKNOWN
        assert a.vote == min(top, v.local_low_water_mark)


# --- decide ---------------------------------------------------------------------------

ABC = ("a", "b", "c")
_members_of_5 = meta(("a", 5, UNRESOLVED), ("b", 5, UNRESOLVED), ("c", 5, UNRESOLVED))


def test_spec_figure_all_members_online():
    # H_B > H_A > H_C: the highest mark a majority reaches is H_A.
    views = {"a": view(5, 2, 10), "b": view(5, 2, 12), "c": view(5, 2, 7)}
    assessments, decision = decide(_members_of_5, ABC, views)
    assert decision == Decided(10)
    assert {x: a.standing for x, a in assessments.items()} == dict.fromkeys(ABC, Standing.MEMBER)
    assert {x: a.vote for x, a in assessments.items()} == {"a": 10, "b": 12, "c": 7}


def test_spec_figure_offline_member_makes_the_vote_undecidable():
    views = {"a": view(5, 2, 10), "c": view(5, 2, 7)}
    assessments, decision = decide(_members_of_5, ABC, views)
    assert decision == Undecidable(candidate=10, votes=1, offline=1, quorum=2)
    assert set(assessments) == {"a", "c"}


def test_spec_figure_decidable_when_the_laggard_caught_up():
    views = {"a": view(5, 2, 10), "c": view(5, 2, 10)}
    assert decide(_members_of_5, ABC, views)[1] == Decided(10)


def test_offline_non_member_does_not_make_the_vote_undecidable():
    # Session 5's members are a and b; c left session 3 resolved at 8.
    m = meta(("a", 5, UNRESOLVED), ("b", 5, UNRESOLVED), ("c", 3, 8))
    views = {"a": view(5, 8, 14), "b": view(5, 8, 12)}
    assessments, decision = decide(m, ABC, views)
    assert decision == Decided(12)
    assert "c" not in assessments


def test_offline_non_member_with_unresolved_mark_of_an_older_session_votes_low():
    # c left session 3 unresolved (never happens after a metadata write, but the rule only
    # counts the writing session's members as offline).
    m = meta(("a", 5, UNRESOLVED), ("b", 5, UNRESOLVED), ("c", 3, UNRESOLVED))
    views = {"a": view(5, 8, 14), "b": view(5, 8, 14)}
    assert decide(m, ABC, views)[1] == Decided(14)


def test_offline_member_makes_the_vote_undecidable_even_beside_a_non_member():
    m = meta(("a", 5, UNRESOLVED), ("b", 5, UNRESOLVED), ("c", 3, 8))
    # b (member) offline; a holds 14, c can vouch for 8 only.
    views = {"a": view(5, 8, 14), "c": view(3, 2, 8)}
    assessments, decision = decide(m, ABC, views)
    assert decision == Undecidable(candidate=14, votes=1, offline=1, quorum=2)
    assert assessments["c"] == Assessment(Standing.RESOLVED, None, 8)


def test_offline_non_members_count_as_minus_one_in_the_quorum():
    replicas = ("a", "b", "c", "d", "e")
    m = meta(
        ("a", 5, UNRESOLVED),
        ("b", 5, UNRESOLVED),
        ("c", 5, UNRESOLVED),
        ("d", 4, 9),
        ("e", 2, 3),
    )
    views = {"a": view(5, 9, 20), "b": view(5, 9, 20), "c": view(5, 9, 15)}
    # Marks 20, 20, 15, -1, -1: quorum 3 is reached at 15.
    assert decide(m, replicas, views)[1] == Decided(15)


def test_offline_new_replica_is_not_a_member():
    m = meta(("a", 5, UNRESOLVED), ("b", 5, UNRESOLVED))
    views = {"a": view(5, 8, 11), "b": view(5, 8, 11)}
    assert decide(m, ABC, views)[1] == Decided(11)


def test_two_offline_members_of_three_are_undecidable():
    views = {"a": view(5, 2, 10)}
    decision = decide(_members_of_5, ABC, views)[1]
    assert decision == Undecidable(candidate=10, votes=1, offline=2, quorum=2)


def test_fresh_partition_decides_minus_one_with_a_majority_reachable():
    fresh = PartitionMetadata()
    empty = view(NO_SESSION, -1, -1)
    assessments, decision = decide(fresh, ABC, {"a": empty, "c": empty})
    assert decision == Decided(-1)
    assert assessments == {
        "a": Assessment(Standing.MEMBER, None, -1),
        "c": Assessment(Standing.MEMBER, None, -1),
    }
    assert decide(fresh, ABC, dict.fromkeys(ABC, empty))[1] == Decided(-1)


def test_fresh_partition_is_undecidable_without_a_majority():
    fresh = PartitionMetadata()
    empty = view(NO_SESSION, -1, -1)
    assert decide(fresh, ABC, {"b": empty})[1] == Undecidable(-1, 1, 2, 2)
    assert decide(fresh, ABC, {})[1] == Undecidable(-1, 0, 3, 2)


def test_decide_with_no_replicas_at_all():
    assert decide(PartitionMetadata(), (), {}) == ({}, Decided(-1))


def test_decide_counts_a_removed_voter_that_answers():
    # "z" was removed from the assignment but is a member of the writing session: its
    # storage node still serves the partition for this vote. "c" (current, not a voter)
    # is offline and does not matter.
    m = meta(("a", 5, UNRESOLVED), ("b", 5, UNRESOLVED), ("z", 5, UNRESOLVED))
    views = {"a": view(5, 1, 9), "b": view(5, 1, 9), "z": view(5, 1, 50)}
    assessments, decision = decide(m, ["c", "b", "a", "a"], views)
    assert decision == Decided(9)
    assert set(assessments) == {"a", "b", "z"}


def test_a_removed_voter_decides_what_the_remaining_members_cannot():
    # Transaction 9 reached a and z (a quorum of a, b, z); b lags. With z removed from
    # the assignment and unreachable, 9 may be committed: wait. Its answer decides.
    m = meta(("a", 5, UNRESOLVED), ("b", 5, UNRESOLVED), ("z", 5, UNRESOLVED))
    ab = {"a": view(5, 1, 9), "b": view(5, 1, 7)}
    assert isinstance(decide(m, ["a", "b", "d"], ab)[1], Undecidable)
    assert decide(m, ["a", "b", "d"], {**ab, "z": view(5, 1, 9)})[1] == Decided(9)


def test_decide_mixes_all_standings():
    m = meta(
        ("a", 7, UNRESOLVED),  # member of the writer 7
        ("b", 5, 20),  # left session 5 at 20; a dead session 8 cleaned it
        ("c", 5, 20),  # left session 5 at 20, still as it left it
        ("d", 6, UNRESOLVED),  # inconsistent: unknown
        ("e", 7, UNRESOLVED),  # member, offline
    )
    views = {
        "a": view(7, 20, 26),
        "b": view(8, 24, 24),
        "c": view(5, 12, 23),
        "d": view(6, 15, 30),
    }
    assessments, decision = decide(m, ["a", "b", "c", "d", "e"], views)
    assert assessments == {
        "a": Assessment(Standing.MEMBER, None, 26),
        "b": Assessment(Standing.CLEAN, None, 24),
        "c": Assessment(Standing.RESOLVED, 20, 20),
        "d": Assessment(Standing.UNKNOWN, 15, 15),
    }
    # Marks 26, 24, 20, 15 and one offline member: 24 has 2 votes + 1 offline = 3 = quorum.
    assert decision == Undecidable(24, 2, 1, 3)


# --- plan_replica and pick_source -----------------------------------------------------


def test_plan_truncates_a_replica_ahead_of_the_decided_mark():
    assert plan_replica(12, 10) == ReplicaPlan(10, None)


def test_plan_catches_up_a_replica_behind_the_decided_mark():
    assert plan_replica(7, 10) == ReplicaPlan(None, 8)
    assert plan_replica(-1, 10) == ReplicaPlan(None, 0)


def test_plan_leaves_a_replica_at_the_decided_mark_alone():
    assert plan_replica(10, 10) == ReplicaPlan(None, None)
    assert plan_replica(-1, -1) == ReplicaPlan(None, None)


@given(position=st.integers(-1, 50), decided=st.integers(-1, 50))
def test_plan_brings_the_replica_exactly_to_the_decided_mark(position, decided):
    plan = plan_replica(position, decided)
    assert plan.truncate_to is None or plan.catch_up_from is None
    after = position if plan.truncate_to is None else plan.truncate_to
    if plan.catch_up_from is not None:
        assert plan.catch_up_from == after + 1  # contiguous
        after = decided
    assert after == decided


def test_pick_source_prefers_the_first_address_that_reaches_the_mark():
    positions = {"a": 7, "b": 10, "c": 12}
    assert pick_source(positions, positions, 10) == "b"
    assert pick_source(positions, positions, 7) == "a"
    assert pick_source(positions, positions, 12) == "c"


def test_pick_source_is_independent_of_mapping_order():
    positions = {"c": 10, "b": 10, "a": 3}
    assert pick_source(positions, dict(reversed(list(positions.items()))), 10) == "b"


def test_pick_source_needs_both_vote_and_position():
    # b's vote is below the mark (its log above its vote is not certainly clean);
    # c's position is unknown.
    positions = {"a": 4, "b": 10, "d": 10}
    votes = {"a": 4, "b": 8, "c": 10, "d": 10}
    assert pick_source(positions, votes, 10) == "d"


def test_pick_source_without_a_holder_raises():
    with pytest.raises(ValueError, match="decided high-water mark 10"):
        pick_source({"a": 9, "b": 3}, {"a": 9, "b": 3}, 10)
    with pytest.raises(ValueError):
        pick_source({}, {}, -1)


# --- closing_metadata -----------------------------------------------------------------


def test_closing_metadata_applies_step_six():
    old = PartitionMetadata(
        3,
        8,  # sessions 6..8 died before writing
        {
            "a": ReplicaState(5, UNRESOLVED),  # member of 5, now a member of 9
            "b": ReplicaState(5, UNRESOLVED),  # member of 5, offline now: resolve
            "c": ReplicaState(2, 7),  # resolved earlier: unchanged
            "z": ReplicaState(4, 6),  # no longer assigned: dropped
        },
    )
    new = closing_metadata(old, 4, 9, ["a", "b", "c", "d"], ["a", "d"], 30)
    assert new == PartitionMetadata(
        4,
        9,
        {
            "a": ReplicaState(9, UNRESOLVED),
            "b": ReplicaState(5, 30),
            "c": ReplicaState(2, 7),
            "d": ReplicaState(9, UNRESOLVED),  # a new replica, now a member
        },
    )


def test_closing_metadata_member_previously_resolved_becomes_unresolved():
    old = meta(("a", 2, 7), ("b", 5, UNRESOLVED))
    new = closing_metadata(old, 1, 6, ["a", "b"], ["a", "b"], 12)
    assert new.replicas == {"a": ReplicaState(6, UNRESOLVED), "b": ReplicaState(6, UNRESOLVED)}


def test_closing_metadata_new_non_member_replica_gets_the_decided_mark():
    new = closing_metadata(PartitionMetadata(), 2, 0, ["a", "b", "c"], ["a", "b"], -1)
    assert new.generation == 2
    assert new.session_id == 0
    assert new.replicas["a"] == ReplicaState(0, UNRESOLVED)
    assert new.replicas["c"] == ReplicaState(NO_SESSION, -1)


def test_closing_metadata_does_not_modify_its_input():
    old = meta(("a", 5, UNRESOLVED), ("b", 5, UNRESOLVED))
    snapshot = dict(old.replicas)
    closing_metadata(old, 2, 6, ["a", "b"], ["a"], 10)
    assert old.replicas == snapshot


def test_closing_metadata_is_what_decide_reads_next():
    old = _members_of_5
    new = closing_metadata(old, 1, 6, ABC, ["a", "b"], 10)
    assert writing_session(new) == 6
    # c (offline, resolved at 10) no longer blocks the vote of session 7.
    views = {"a": view(6, 10, 13), "b": view(6, 10, 13)}
    assert decide(new, ABC, views)[1] == Decided(13)


def test_a_closing_mark_resolved_to_minus_one_stays_resolved():
    old = meta(("a", 0, UNRESOLVED), ("b", 0, UNRESOLVED), ("c", 0, UNRESOLVED))
    # Session 1 (c offline) decides that session 0 committed nothing.
    after_1 = closing_metadata(old, 1, 1, ABC, ["a", "b"], -1)
    # Session 2 (c still offline) decides 0: what session 1 committed.
    after_2 = closing_metadata(after_1, 1, 2, ABC, ["a", "b"], 0)
    # c left session 0, whose committed end is -1, not 0.
    assert after_2.replicas["c"] == ReplicaState(0, -1)


def test_no_fork_when_the_first_session_commits_nothing():
    # Session 0 recovered a fresh partition (all members, low-water marks (0, -1)) and
    # appended transaction 0 to c only, then died: transaction 0 is not committed.
    m0 = meta(("a", 0, UNRESOLVED), ("b", 0, UNRESOLVED), ("c", 0, UNRESOLVED))
    # Session 1: a, b reachable; decides -1; commits its own transaction 0 on a and b.
    _, d1 = decide(m0, ABC, {"a": view(0, -1, -1), "b": view(0, -1, -1)})
    assert d1 == Decided(-1)
    m1 = closing_metadata(m0, 1, 1, ABC, ["a", "b"], -1)
    # Session 2: a, b reachable; decides 0; appends nothing.
    _, d2 = decide(m1, ABC, {"a": view(1, -1, 0), "b": view(1, -1, 0)})
    assert d2 == Decided(0)
    m2 = closing_metadata(m1, 1, 2, ABC, ["a", "b"], 0)
    # Session 3: a and c reachable, b offline. c still holds session 0's dirty
    # transaction 0; it must not vouch for it.
    assessments, _ = decide(m2, ABC, {"a": view(2, 0, 0), "c": view(0, -1, 0)})
    assert assessments["c"].vote == -1


# --- the model ------------------------------------------------------------------------

REPLICAS = ("a", "b", "c")
GENERATION = 1


@dataclass
class Cluster:
    storages: dict[str, Storage] = field(default_factory=lambda: {r: Storage() for r in REPLICAS})
    metadata: PartitionMetadata = field(default_factory=PartitionMetadata)
    committed: list[tuple[int, int]] = field(default_factory=list)  # the true log
    decisions: list[int] = field(default_factory=list)

    def check_clean(self, address: str, upto: int) -> None:
        log = self.storages[address].log
        assert upto < len(log)
        assert log[: upto + 1] == self.committed[: upto + 1], (
            f"{address} keeps {log[: upto + 1]} where the committed log is "
            f"{self.committed[: upto + 1]} (fork)"
        )

    def session(self, step: dict) -> None:
        """One store session: recovery (maybe crashing or stalling), then appends."""
        # Step 1: a new session ID by compare-and-set.
        self.metadata = replace(
            self.metadata, generation=GENERATION, session_id=self.metadata.session_id + 1
        )
        session_id = self.metadata.session_id
        reachable = sorted(step["reachable"])
        views = {r: self.storages[r].view() for r in reachable}
        assessments, decision = decide(self.metadata, REPLICAS, views)
        assert set(assessments) == set(reachable)
        if isinstance(decision, Undecidable):
            return  # the recovery waits; the model moves on to a later session
        decided = decision.high_water_mark
        self.decisions.append(decided)
        # The vote is exactly the highest committed transaction: no committed transaction
        # is lost, and nothing uncommitted is declared committed.
        assert decided >= len(self.committed) - 1, "a committed transaction would be lost"
        assert decided <= len(self.committed) - 1, "an uncommitted transaction is decided"

        budget = step["crash_after"]  # recovery steps done before the server dies

        def spend() -> bool:
            nonlocal budget
            if budget is None:
                return True
            if budget == 0:
                return False
            budget -= 1
            return True

        # Truncate dirty tails before the vote's consequences.
        for r in reachable:
            a = assessments[r]
            if not spend():
                return
            if a.truncate_to is not None:
                self.storages[r].truncate(a.truncate_to)
            assert self.storages[r].top == a.vote
            # What the replica vouches for is committed, unless it may hold the writer's
            # uncommitted tail (members vouch for their whole log only up to the mark).
            self.check_clean(r, min(a.vote, decided) if a.standing is Standing.MEMBER else a.vote)
        positions = {r: a.vote for r, a in assessments.items()}
        votes = dict(positions)
        members = []
        failing = step["failing"]
        for r in reachable:
            if not spend():
                return
            s = self.storages[r]
            plan = plan_replica(positions[r], decided)
            fails = failing is not None and REPLICAS[failing[0] % 3] == r and len(reachable) == 3
            if plan.truncate_to is not None:
                s.truncate(plan.truncate_to)
            if plan.catch_up_from is not None:
                source = self.storages[pick_source(positions, votes, decided)]
                assert source.top >= decided
                missing = source.log[plan.catch_up_from : decided + 1]
                if fails:
                    missing = missing[: failing[1]]
                s.log.extend(missing)
            if fails:
                continue  # left out of the session before its low-water mark
            assert s.top == decided
            s.set_low_water_mark(session_id, decided)
            members.append(r)
            self.check_clean(r, decided)
        if budget == 0 or len(members) < 2:
            return  # died (or stalled with too few clean replicas) before step 6
        self.metadata = closing_metadata(
            self.metadata, GENERATION, session_id, REPLICAS, members, decided
        )
        # Appends: every member receives a prefix of the session's transactions; one is
        # committed once a majority of the three replicas holds it.
        count = step["appends"]
        received = {r: min(count, step["prefixes"][REPLICAS.index(r)]) for r in members}
        for i in range(count):
            txid = decided + 1 + i
            value = (session_id, txid)
            holders = [r for r in members if received[r] > i]
            for r in holders:
                assert self.storages[r].top == txid - 1
                self.storages[r].log.append(value)
            if len(holders) >= 2:
                assert len(self.committed) == txid
                self.committed.append(value)

    def final_check(self) -> None:
        """Everyone comes back: recovery must decide the committed log and keep all of it."""
        self.session(
            {
                "reachable": set(REPLICAS),
                "crash_after": None,
                "failing": None,
                "appends": 0,
                "prefixes": [0, 0, 0],
            }
        )
        assert self.decisions[-1] == len(self.committed) - 1
        for r in REPLICAS:
            assert self.storages[r].log == self.committed


_reachable = st.one_of(
    st.sets(st.sampled_from(REPLICAS), min_size=2),
    st.sets(st.sampled_from(REPLICAS), max_size=1),
)
_step = st.fixed_dictionaries(
    {
        "reachable": _reachable,
        "crash_after": st.none() | st.integers(0, 6),
        "failing": st.none() | st.tuples(st.integers(0, 2), st.integers(0, 3)),
        "appends": st.integers(0, 3),
        "prefixes": st.lists(st.integers(0, 3), min_size=3, max_size=3),
    }
)

_ALL = set(REPLICAS)


def _step_of(reachable, appends=0, prefixes=(0, 0, 0), crash_after=None, failing=None):
    return {
        "reachable": set(reachable),
        "crash_after": crash_after,
        "failing": failing,
        "appends": appends,
        "prefixes": list(prefixes),
    }


# The fork of test_no_fork_when_the_first_session_commits_nothing, as a history.
_FORK_HISTORY = [
    _step_of(_ALL, appends=1, prefixes=(0, 0, 1)),  # transaction 0 reaches c only
    _step_of({"a", "b"}, appends=1, prefixes=(1, 1, 0)),  # decides -1, commits 0
    _step_of({"a", "b"}),  # decides 0, resolves c's closing mark to 0
    _step_of({"a", "c"}),  # c vouches for its dirty transaction 0
]


def _run(history: list[dict], bootstrap: bool, first: set[str] = _ALL) -> None:
    cluster = Cluster()
    if bootstrap:
        # A first session with the ``first`` replicas commits transaction 0 on them.
        cluster.session(_step_of(first, appends=1, prefixes=(1, 1, 1)))
        assert cluster.committed == [(0, 0)]
    for step in history:
        cluster.session(step)
    cluster.final_check()


_MODEL_SETTINGS = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@_MODEL_SETTINGS
@given(
    first=st.sampled_from([_ALL, {"a", "b"}]),
    history=st.lists(_step, max_size=10),
)
def test_model_after_a_first_commit_no_committed_transaction_is_lost_or_forked(first, history):
    """Histories that start by committing transaction 0, so no session decides -1. When
    the first session runs without c, c is a new replica until it joins a session."""
    _run(history, bootstrap=True, first=first)


@_MODEL_SETTINGS
@given(history=st.lists(_step, max_size=10))
@example(history=_FORK_HISTORY)
def test_model_from_a_fresh_partition_no_committed_transaction_is_lost_or_forked(history):
    _run(history, bootstrap=False)


def test_model_fork_history_without_the_minus_one_collision_is_safe():
    # The same history after a first commit: the closing mark of c is 0, not -1, and c
    # truncates its dirty tail.
    _run(_FORK_HISTORY, bootstrap=True)


def test_model_crash_after_cleaning_one_replica():
    cluster = Cluster()
    # a holds 0..2, b 0..1, c nothing: 0 and 1 are committed.
    cluster.session(_step_of(_ALL, appends=3, prefixes=(3, 2, 0)))
    assert len(cluster.committed) == 2
    # Session 1 reaches everyone, decides 1, cleans a (truncating 2) and dies.
    cluster.session(_step_of(_ALL, crash_after=4))
    assert cluster.decisions == [-1, 1]
    assert cluster.storages["a"].last_session_id == 1
    assert cluster.storages["a"].log == cluster.committed
    assert writing_session(cluster.metadata) == 0
    assert cluster.metadata.session_id == 1

    def decide_with(*reachable):
        views = {r: cluster.storages[r].view() for r in reachable}
        return decide(cluster.metadata, REPLICAS, views)

    assessments, decision = decide_with("a", "c")
    assert assessments["a"] == Assessment(Standing.CLEAN, None, 1)
    assert assessments["c"] == Assessment(Standing.MEMBER, None, -1)
    assert decision == Undecidable(1, 1, 1, 2)  # b (offline member) may hold 1: it does
    assert decide_with("a", "b")[1] == Decided(1)
    cluster.final_check()


# --- a server recovering its own session -------------------------------------------------


def _three_members(session: int) -> PartitionMetadata:
    return PartitionMetadata(
        1, session + 1, {a: ReplicaState(session, UNRESOLVED) for a in ("a:1", "b:1", "c:1")}
    )


def _member_view(session: int, top: int) -> StorageView:
    return StorageView(session, 10, 10, top)


def test_own_session_knowledge_decides_what_a_new_owner_must_wait_for():
    """c died while a batch 25..29 reached only a: a new owner cannot tell whether c holds
    it (undecidable); the server that ran the session knows it acknowledged only 24."""
    meta = _three_members(5)
    views = {"a:1": _member_view(5, 29), "b:1": _member_view(5, 24)}
    _, blind = decide(meta, ["a:1", "b:1", "c:1"], views)
    assert isinstance(blind, Undecidable)
    _, informed = decide(meta, ["a:1", "b:1", "c:1"], views, OwnSession(5, 24))
    assert informed == Decided(24)


def test_own_session_knowledge_keeps_what_a_reachable_majority_holds():
    meta = _three_members(5)
    views = {"a:1": _member_view(5, 29), "b:1": _member_view(5, 27)}
    # 27 is on a majority (a, b): kept even though only 24 was acknowledged.
    _, d = decide(meta, ["a:1", "b:1", "c:1"], views, OwnSession(5, 24))
    assert d == Decided(27)


def test_own_session_knowledge_of_another_session_is_not_used():
    meta = _three_members(5)
    views = {"a:1": _member_view(5, 29), "b:1": _member_view(5, 24)}
    _, d = decide(meta, ["a:1", "b:1", "c:1"], views, OwnSession(4, 24))
    assert isinstance(d, Undecidable)


def test_own_session_knowledge_needs_a_reachable_majority():
    meta = _three_members(5)
    _, d = decide(meta, ["a:1", "b:1", "c:1"], {"a:1": _member_view(5, 29)}, OwnSession(5, 24))
    assert isinstance(d, Undecidable)


# --- the replica set changes; a member loses its disk ----------------------------------


def test_a_replica_added_after_the_writing_session_does_not_vote():
    """3 -> 4 replicas with one old member lagging: 900 was committed on two of the three
    the session wrote to; the new, empty replica must not lower the vote to 895."""
    meta = PartitionMetadata(1, 6, {a: ReplicaState(5, UNRESOLVED) for a in ("a:1", "b:1", "c:1")})
    views = {
        "a:1": StorageView(5, 0, 0, 900),
        "b:1": StorageView(5, 0, 0, 900),
        "c:1": StorageView(5, 0, 0, 895),
        "d:1": StorageView(-1, -1, -1, -1),
    }
    assessments, d = decide(meta, ["a:1", "b:1", "c:1", "d:1"], views)
    assert d == Decided(900)
    assert assessments["d:1"].standing == Standing.UNKNOWN  # it is caught up, not asked
    # With one old member down the vote still counts three voters, not four: it waits
    # for a (which may hold 900 too), rather than deciding low.
    del views["a:1"]
    _, d = decide(meta, ["a:1", "b:1", "c:1", "d:1"], views)
    assert d == Undecidable(900, 1, 1, 2)


def test_a_member_that_lost_its_state_counts_as_offline():
    """c acknowledged W's transactions and came back empty: its vote is unknown, so
    8..10 (on a only, but perhaps committed with c) must not be truncated on a guess."""
    meta = PartitionMetadata(1, 6, {a: ReplicaState(5, UNRESOLVED) for a in ("a:1", "b:1", "c:1")})
    views = {
        "a:1": StorageView(5, 0, 0, 10),
        "b:1": StorageView(5, 0, 0, 7),
        "c:1": StorageView(-1, -1, -1, -1),  # a fresh disk
    }
    assessments, d = decide(meta, ["a:1", "b:1", "c:1"], views)
    assert isinstance(d, Undecidable)
    assert assessments["c:1"].standing == Standing.UNKNOWN
    # The server that ran the session knows what it acknowledged.
    _, d = decide(meta, ["a:1", "b:1", "c:1"], views, OwnSession(5, 10))
    assert d == Decided(10)


def test_closing_metadata_records_exactly_the_session_replica_set():
    old = PartitionMetadata(1, 6, {a: ReplicaState(5, UNRESOLVED) for a in ("a", "b", "c")})
    new = closing_metadata(old, 1, 6, ["a", "b", "d"], ["a", "b", "d"], 40)
    assert set(new.replicas) == {"a", "b", "d"}
