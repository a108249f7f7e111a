"""replica_safety: which replica-set changes keep a partition recoverable."""

from __future__ import annotations

from waltz_client.cluster.metadata import UNRESOLVED, PartitionMetadata, ReplicaState
from waltz_client.cluster.replica_safety import (
    replica_change_problem,
    still_needed,
    still_serving,
    voters,
    writing_members,
    writing_session,
)


def meta(members=(), others=(), session=7) -> PartitionMetadata:
    states = {a: ReplicaState(session, UNRESOLVED) for a in members}
    states.update({a: ReplicaState(session - 1, 10) for a in others})
    return PartitionMetadata(1, session, states)


def test_a_partition_no_session_wrote_can_take_any_set():
    assert writing_session(PartitionMetadata()) == -1
    assert writing_members(PartitionMetadata()) == set()
    assert replica_change_problem(0, PartitionMetadata(), []) is None
    assert voters(PartitionMetadata(), ["a", "b"]) == {"a", "b"}


def test_members_and_voters_of_the_writing_session():
    m = meta(["a", "b", "c"], others=["d"])
    assert writing_members(m) == {"a", "b", "c"}
    assert voters(m, ["x"]) == {"a", "b", "c", "d"}
    assert still_needed(m, "a") and not still_needed(m, "d") and not still_needed(m, "x")


def test_removing_one_member_of_three_is_safe_two_is_not():
    m = meta(["a", "b", "c"])
    assert replica_change_problem(0, m, ["b", "c", "d"]) is None
    problem = replica_change_problem(0, m, ["c", "d", "e"])
    assert problem is not None and "only 1 of its members would remain" in problem
    assert "removing a, b" in problem and "recovery needs 2" in problem


def test_the_issue_example_waits_for_the_new_replica_to_join():
    before = meta(["a", "b", "c"], others=["d"])  # a session over four, d not yet a member
    assert "only 2 of its members" in replica_change_problem(0, before, ["b", "c", "d"])
    after = meta(["a", "b", "c", "d"])
    assert replica_change_problem(0, after, ["b", "c", "d"]) is None


def test_still_serving_lists_removed_members_per_node():
    metadata = {0: meta(["a", "b", "c"]), 1: meta(["a", "d", "e"]), 2: PartitionMetadata()}
    assignment = {0: ["b", "c", "x"], 1: ["a", "d", "e"], 2: ["a"]}
    assert still_serving(assignment, metadata) == {"a": [0]}
    assignment[1] = ["d", "e", "x"]
    assert still_serving(assignment, metadata) == {"a": [0, 1]}
