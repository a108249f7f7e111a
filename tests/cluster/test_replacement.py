"""replacement: the steps that move a lost storage node's replicas to the others, and the
record of them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_client.cluster.metadata import (
    UNRESOLVED,
    MetadataError,
    PartitionMetadata,
    ReplacementEvent,
    Replacing,
    ReplicaAssignment,
    ReplicaState,
    StorageReplacements,
)
from waltz_client.cluster.placement import assign_replicas
from waltz_client.cluster.replacement import plan_replacement, replacement_under_way
from waltz_client.cluster.replica_safety import replica_change_problem, writing_members


def session(members, left=(), session_id=5) -> PartitionMetadata:
    """A partition whose last writing session ``session_id`` had ``members``; ``left``
    replicas closed the session before it."""
    states = {a: ReplicaState(session_id, UNRESOLVED) for a in members}
    states.update({a: ReplicaState(session_id - 1, 42) for a in left})
    return PartitionMetadata(1, session_id, states)


def assignment(held: dict[str, set[int]], groups: dict[str, int] | None = None):
    return ReplicaAssignment({s: frozenset(p) for s, p in held.items()}, groups or {})


def test_a_partition_the_owner_recovered_without_the_node_gets_a_replica_elsewhere():
    a = assignment({"a": {0}, "b": {0}, "c": {0}, "d": set()})
    plan = plan_replacement(a, 3, {0: session(["a", "b"], left=["c"])}, "c")
    assert plan.assign == {"d": frozenset({0})}
    assert not plan.unassign and not plan.waiting and not plan.no_room
    after = plan.apply(a)
    assert after.replicas_of(0) == ["a", "b", "c", "d"]  # one more until d has joined


def test_the_lost_node_gives_up_a_partition_once_its_new_replica_joined():
    a = assignment({"a": {0}, "b": {0}, "c": {0}, "d": {0}})
    copying = session(["a", "b"], left=["c"])  # d assigned, not a member yet
    plan = plan_replacement(a, 3, {0: copying}, "c")
    assert not plan.unassign and not plan.assign
    assert plan.waiting == ("partition 0: waiting for d to be copied in and join a session",)
    joined = session(["a", "b", "d"], left=["c"], session_id=6)
    plan = plan_replacement(a, 3, {0: joined}, "c")
    assert plan.unassign == {0}
    after = plan.apply(a)
    assert "c" not in after.storages  # it held nothing else: it leaves the assignment
    assert after.replicas_of(0) == ["a", "b", "d"]


def test_a_partition_whose_session_still_counts_the_node_takes_a_replica_too():
    """The session may run on without the node (it left it behind, or the node is live
    and being retired): adding a replica is safe, and the next session decides."""
    a = assignment({"a": {0}, "b": {0}, "c": {0}, "d": set()})
    plan = plan_replacement(a, 3, {0: session(["a", "b", "c"])}, "c")
    assert plan.assign == {"d": frozenset({0})} and not plan.waiting


def test_new_replicas_go_to_a_group_the_partition_lacks_then_to_the_least_loaded():
    a = assignment(
        {"a": {0, 1}, "b": {0}, "c": {0, 1}, "d": {1, 2}, "e": set(), "f": set()},
        groups={"a": 0, "b": 1, "c": 2, "d": 0, "e": 2, "f": 0},
    )
    metadata = {0: session(["a", "c"], left=["b"])}
    plan = plan_replacement(a, 3, metadata, "b")
    # Partition 0 keeps groups 0 and 2: group 1 has no other node, so the least loaded of
    # the rest, by address: e (group 2) and f (group 0) hold nothing; e sorts first.
    assert plan.assign == {"e": frozenset({0})}
    a2 = assignment(
        {"a": {0}, "b": {0}, "c": {0}, "d": {5, 6}, "e": set()},
        groups={"a": 0, "b": 1, "c": 2, "d": 1, "e": 2},
    )
    plan = plan_replacement(a2, 3, {0: session(["a", "c"], left=["b"])}, "b")
    assert plan.assign == {"d": frozenset({0})}  # group 1 again, though d is loaded


def test_nowhere_to_go_and_unusable_nodes():
    a = assignment({"a": {0}, "b": {0}, "c": {0}, "d": set()})
    metadata = {0: session(["a", "b"], left=["c"])}
    plan = plan_replacement(a, 3, metadata, "c", unusable={"d"})
    assert plan.no_room == (0,) and not plan.assign
    assert "no other reachable storage node can hold" in plan.describe()[-1]
    assert plan.apply(a) == a


def test_a_partition_no_session_ever_wrote_moves_at_once():
    a = assignment({"a": {0}, "b": {0}, "c": {0}, "d": {0}})
    plan = plan_replacement(a, 3, {}, "c")
    assert plan.unassign == {0}
    assert plan_replacement(a, 3, {0: PartitionMetadata()}, "c").unassign == {0}


def test_a_replacement_is_under_way_once_a_partition_has_a_replica_more():
    a = assignment({"a": {0, 1}, "b": {0, 1}, "c": {0, 1}, "d": {1}})
    assert replacement_under_way(a, 3, "c")
    assert not replacement_under_way(assignment({"a": {0}, "b": {0}, "c": {0}}), 3, "c")


def test_the_record_round_trips_and_keeps_the_latest_events():
    record = StorageReplacements({"s:1": Replacing(1000, "unreachable for 60 s", True)})
    many = [ReplacementEvent(i, "s:1", "assigned", (i % 3,), to="t:1") for i in range(150)]
    record = record.with_events(*many)
    assert len(record.events) == 100 and record.events[0].time_ms == 50
    assert StorageReplacements.decode(record.encode()) == record


@pytest.mark.parametrize(
    "body, message",
    [
        (b'{"version":1,"kind":"storage-replacements","replacing":{},"events":[{"time_ms":1,'
         b'"storage":"s","action":"exploded","partitions":[],"to":"","detail":""}]}',
         "unknown event action 'exploded'"),
        (b'{"version":1,"kind":"storage-replacements","replacing":{"s":{"since_ms":1,'
         b'"reason":"x","automatic":"yes"}},"events":[]}',
         "'automatic' must be bool"),
    ],
)  # fmt: skip
def test_an_unreadable_record_names_the_field(body, message):
    with pytest.raises(MetadataError, match=message):
        StorageReplacements.decode(body)


@settings(max_examples=200, deadline=None)
@given(
    nodes=st.integers(4, 7),
    partitions=st.integers(1, 12),
    replicas=st.integers(2, 3),
    groups=st.integers(1, 3),
    lost_index=st.integers(0, 6),
    how=st.sampled_from(["retired alive", "dead, recovered without", "dead, left behind"]),
    data=st.data(),
)
def test_every_step_is_safe_and_the_node_leaves_once_its_replicas_are_copied(
    nodes, partitions, replicas, groups, lost_index, how, data
):
    """Replay the steps with owners that run a session after each change, in which a new
    replica joins only once its copy is done (drawn): no step fails the replica-safety
    check, no partition ever has fewer replicas than the cluster's count, the lost node
    gives a partition up only once every other replica is a member, and it is gone once
    the copies are done, unless a partition cannot recover without it (two replicas, one
    dead): then no session runs, its new replica never joins, and the node keeps it."""
    names = [f"n{i}:1" for i in range(nodes)]
    groups_of = {n: i % groups for i, n in enumerate(names)}
    current = assign_replicas(names, partitions, replicas, groups_of)
    lost = names[lost_index % nodes]
    alive = [n for n in names if n != lost]
    # Retired alive, the node is a member. Dead, its partitions recovered without it, or
    # their sessions run on without it (it is still listed); a partition whose other
    # replicas are no majority cannot run a session at all.
    alive_lost = how == "retired alive"
    metadata = {}
    stuck = set()
    for p in range(partitions):
        held = current.replicas_of(p)
        others = [a for a in held if a != lost]
        if not alive_lost and lost in held and len(others) < len(held) // 2 + 1:
            stuck.add(p)
        if alive_lost or lost not in held or how == "dead, left behind" or p in stuck:
            metadata[p] = session(held)
        else:
            metadata[p] = session(others, left=[lost])
    for round_ in range(12):
        plan = plan_replacement(current, replicas, metadata, lost)
        new = plan.apply(current)
        for p in range(partitions):
            before, after = current.replicas_of(p), new.replicas_of(p)
            assert len(after) >= replicas
            if p in stuck:
                assert lost in after
                continue  # no session can run: a majority of its replicas is down
            if lost in before and lost not in after:
                assert set(before) - {lost} <= writing_members(metadata[p])
            copied = round_ >= 6 or data.draw(st.booleans())
            if before != after or copied:
                if before != after:
                    assert replica_change_problem(p, metadata[p], after) is None
                # The owner's next session: the replicas that were members, and new ones
                # whose copy is done; never the dead node.
                members = writing_members(metadata[p])
                joined = [
                    a
                    for a in after
                    if (a in alive or (alive_lost and a == lost)) and (a in members or copied)
                ]
                metadata[p] = session(
                    joined,
                    left=[a for a in metadata[p].replicas if a not in joined],
                    session_id=metadata[p].session_id + 1,
                )
        current = new
        if lost not in current.storages:
            break
    assert (lost in current.storages) == bool(stuck)
    for p in range(partitions):
        if p in stuck:  # a new replica waits to join, beside the node
            assert lost in current.replicas_of(p)
            assert len(current.replicas_of(p)) in (replicas, replicas + 1)
        else:
            assert len(current.replicas_of(p)) == replicas
            assert lost not in current.replicas_of(p)
            assert set(current.replicas_of(p)) <= writing_members(metadata[p])
