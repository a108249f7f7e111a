"""Partition ownership: balanced, stable, minimal moves, and every move bumps the generation;
and the backoff between the assigner's retries of a failed rebalance."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_client.cluster.metadata import Ownership
from waltz_server.ownership import (
    REBALANCE_RETRY_CAP,
    REBALANCE_RETRY_FIRST,
    assign_owners,
    assigner,
    owned_by,
    rebalance_retry_delay,
)

EMPTY = Ownership({})


def loads(ownership: Ownership, live) -> dict[str, int]:
    counts = Counter(s for s, _ in ownership.partitions.values() if s is not None)
    return {s: counts.get(s, 0) for s in set(live)}


def assert_balanced(ownership: Ownership, live) -> None:
    per_server = loads(ownership, live)
    assert max(per_server.values()) - min(per_server.values()) <= 1, per_server


def moved(before: Ownership, after: Ownership) -> set[int]:
    return {
        p for p, (s, _) in after.partitions.items() if s != before.partitions.get(p, (None, 0))[0]
    }


def minimum_moves(before: Ownership, num_partitions: int, live) -> int:
    """Orphans must move; beyond them, only what exceeds the best balanced target."""
    servers = sorted(set(live))
    if not servers:
        return sum(
            1 for p in range(num_partitions) if before.partitions.get(p, (None, 0))[0] is not None
        )
    kept = Counter(
        s for p in range(num_partitions) if (s := before.partitions.get(p, (None, 0))[0]) in servers
    )
    orphans = num_partitions - sum(kept.values())
    q, r = divmod(num_partitions, len(servers))
    current = sorted((kept.get(s, 0) for s in servers), reverse=True)
    targets = [q + 1] * r + [q] * (len(servers) - r)
    return orphans + sum(max(0, c - t) for c, t in zip(current, targets, strict=True))


# --- examples -------------------------------------------------------------------------


def test_initial_assignment_is_balanced_and_complete():
    out = assign_owners(EMPTY, 10, ["s1", "s2", "s3"])
    assert set(out.partitions) == set(range(10))
    assert all(s in {"s1", "s2", "s3"} for s, _ in out.partitions.values())
    assert sorted(loads(out, ["s1", "s2", "s3"]).values()) == [3, 3, 4]
    # Every partition moved from nobody to somebody: generation 0 -> 1.
    assert all(g == 1 for _, g in out.partitions.values())


def test_initial_assignment_with_more_servers_than_partitions():
    live = ["a", "b", "c", "d", "e"]
    out = assign_owners(EMPTY, 3, live)
    assert sorted(loads(out, live).values()) == [0, 0, 1, 1, 1]
    assert len({s for s, _ in out.partitions.values()}) == 3


def test_reassigning_with_the_same_servers_changes_nothing():
    live = ["s1", "s2", "s3"]
    first = assign_owners(EMPTY, 10, live)
    again = assign_owners(first, 10, live)
    assert again == first
    assert assign_owners(again, 10, list(reversed(live))) == first


def test_when_a_server_leaves_only_its_partitions_move():
    live = ["s1", "s2", "s3", "s4"]
    before = assign_owners(EMPTY, 14, live)
    gone = owned_by(before, "s2")
    after = assign_owners(before, 14, ["s1", "s3", "s4"])
    assert moved(before, after) == set(gone)
    for p, (s, g) in after.partitions.items():
        old_server, old_generation = before.partitions[p]
        if p in gone:
            assert s in {"s1", "s3", "s4"}
            assert g == old_generation + 1
        else:
            assert (s, g) == (old_server, old_generation)
    assert_balanced(after, ["s1", "s3", "s4"])


def test_when_a_server_joins_the_fewest_partitions_move_to_it():
    before = assign_owners(EMPTY, 12, ["s1", "s2", "s3"])  # 4 each
    after = assign_owners(before, 12, ["s1", "s2", "s3", "s4"])
    changed = moved(before, after)
    assert len(changed) == 3  # 3 each
    assert all(after.partitions[p][0] == "s4" for p in changed)
    assert sorted(owned_by(after, "s4")) == sorted(changed)
    for p, (_, g) in after.partitions.items():
        assert g == before.partitions[p][1] + (1 if p in changed else 0)
    assert_balanced(after, ["s1", "s2", "s3", "s4"])


def test_join_with_a_remainder_moves_the_minimum():
    before = assign_owners(EMPTY, 10, ["a", "b"])  # 5 each
    after = assign_owners(before, 10, ["a", "b", "c"])  # 4, 3, 3 (in some order)
    assert len(moved(before, after)) == 3
    assert sorted(loads(after, "abc").values()) == [3, 3, 4]


def test_no_live_servers_leaves_every_partition_unowned():
    before = assign_owners(EMPTY, 5, ["a", "b"])
    after = assign_owners(before, 5, [])
    assert all(s is None for s, _ in after.partitions.values())
    # Losing the owner is a move: old generations are fenced.
    assert all(g == before.partitions[p][1] + 1 for p, (_, g) in after.partitions.items())
    # And staying unowned is not.
    assert assign_owners(after, 5, []) == after


def test_no_live_servers_on_a_fresh_cluster():
    assert assign_owners(EMPTY, 3, []) == Ownership({0: (None, 0), 1: (None, 0), 2: (None, 0)})


def test_zero_partitions():
    assert assign_owners(EMPTY, 0, ["a"]) == Ownership({})


def test_unowned_and_missing_entries_are_assigned_and_keep_their_generation_history():
    current = Ownership({0: ("a", 4), 1: (None, 7), 3: ("gone", 2)})
    out = assign_owners(current, 4, ["a", "b"])
    assert out.partitions[0] == ("a", 4)  # stays put
    assert out.partitions[1][1] == 8
    assert out.partitions[2][1] == 1  # missing: generation 0 -> 1
    assert out.partitions[3][1] == 3
    assert_balanced(out, ["a", "b"])


def test_an_unbalanced_assignment_is_rebalanced_once_and_then_stable():
    current = Ownership({p: ("a", 3) for p in range(9)})
    out = assign_owners(current, 9, ["a", "b", "c"])
    assert sorted(loads(out, "abc").values()) == [3, 3, 3]
    assert len(moved(current, out)) == 6
    assert assign_owners(out, 9, ["a", "b", "c"]) == out


def test_assignment_is_deterministic_whatever_the_order_of_live_servers():
    current = Ownership({0: ("b", 1), 1: ("x", 5), 2: (None, 0), 5: ("c", 9)})
    live = ["d", "c", "b", "a", "c"]
    expected = assign_owners(current, 8, live)
    rng = random.Random(7)
    for _ in range(20):
        shuffled = live[:]
        rng.shuffle(shuffled)
        assert assign_owners(current, 8, shuffled) == expected
        assert assign_owners(current, 8, iter(shuffled)) == expected
        assert assign_owners(current, 8, set(shuffled)) == expected


def test_assign_owners_does_not_modify_its_input():
    current = Ownership({0: ("a", 1), 1: ("a", 1)})
    snapshot = dict(current.partitions)
    assign_owners(current, 4, ["b"])
    assert current.partitions == snapshot


def test_assigner_is_the_lowest_live_server():
    assert assigner(["s3", "s1", "s2"]) == "s1"
    assert assigner(iter(["b", "a"])) == "a"
    assert assigner([]) is None


def test_owned_by():
    ownership = Ownership({0: ("a", 3), 1: ("b", 1), 2: ("a", 5), 3: (None, 2)})
    assert owned_by(ownership, "a") == {0: 3, 2: 5}
    assert owned_by(ownership, "b") == {1: 1}
    assert owned_by(ownership, "c") == {}


def test_rebalance_retry_delay_doubles_from_the_first_delay_up_to_the_cap():
    assert [rebalance_retry_delay(n, first=0.5, cap=30.0) for n in range(1, 10)] == [
        0.5,
        1.0,
        2.0,
        4.0,
        8.0,
        16.0,
        30.0,
        30.0,
        30.0,
    ]
    assert rebalance_retry_delay(1) == REBALANCE_RETRY_FIRST
    # A very long outage stays at the cap (no overflow).
    assert rebalance_retry_delay(10_000) == REBALANCE_RETRY_CAP
    with pytest.raises(ValueError):
        rebalance_retry_delay(0)


@given(failures=st.integers(1, 5_000))
def test_rebalance_retry_delay_is_bounded_and_never_shrinks(failures):
    delay = rebalance_retry_delay(failures)
    assert REBALANCE_RETRY_FIRST <= delay <= REBALANCE_RETRY_CAP
    assert rebalance_retry_delay(failures + 1) >= delay


# --- properties -----------------------------------------------------------------------

POOL = ["s0", "s1", "s2", "s3", "s4", "s5"]


def check_step(before: Ownership, after: Ownership, num_partitions: int, live: list[str]):
    servers = set(live)
    assert set(after.partitions) == set(range(num_partitions))
    changed = moved(before, after)
    for p, (s, g) in after.partitions.items():
        old_server, old_generation = before.partitions.get(p, (None, 0))
        assert s is None if not servers else s in servers
        # A move bumps the generation by exactly one; anything else keeps it.
        assert g == old_generation + (1 if p in changed else 0)
        # A partition whose owner is still live only moves to fix the balance.
        if old_server in servers and p in changed:
            assert len(owned_by(before, old_server)) > len(owned_by(after, old_server))
    if servers:
        assert_balanced(after, servers)
    assert len(changed) == minimum_moves(before, num_partitions, live)
    # Stable and deterministic.
    assert assign_owners(after, num_partitions, live) == after
    assert assign_owners(before, num_partitions, sorted(live, reverse=True)) == after


@settings(max_examples=200)
@given(
    num_partitions=st.integers(0, 40),
    history=st.lists(st.lists(st.sampled_from(POOL), max_size=8), min_size=1, max_size=12),
)
def test_random_sequences_of_live_server_sets(num_partitions, history):
    current = EMPTY
    for live in history:
        after = assign_owners(current, num_partitions, live)
        check_step(current, after, num_partitions, live)
        current = after


_change = st.tuples(st.sampled_from(["join", "leave"]), st.sampled_from(POOL))


@settings(max_examples=200)
@given(
    num_partitions=st.integers(1, 40),
    start=st.sets(st.sampled_from(POOL), min_size=1),
    changes=st.lists(_change, min_size=1, max_size=15),
)
def test_single_joins_and_leaves_from_a_balanced_assignment(num_partitions, start, changes):
    live = set(start)
    current = assign_owners(EMPTY, num_partitions, live)
    for kind, server in changes:
        previous_live = set(live)
        if kind == "join":
            live.add(server)
        else:
            live.discard(server)
        after = assign_owners(current, num_partitions, live)
        check_step(current, after, num_partitions, sorted(live))
        changed = moved(current, after)
        if kind == "leave" and server in previous_live and live:
            # Only the partitions of the server that left move.
            assert changed == set(owned_by(current, server))
        if kind == "join" and server not in previous_live:
            # Every moved partition goes to the newcomer.
            assert all(after.partitions[p][0] == server for p in changed)
            if previous_live:
                assert len(changed) == num_partitions // len(live)
            else:
                assert changed == set(range(num_partitions))
        current = after


def test_partitions_added_beyond_a_stale_count_are_kept_as_they_are() -> None:
    # An assigner that read 2 partitions meets an ownership of a cluster grown to 4: it
    # places 0 and 1, and leaves 2 and 3 for an assigner that knows them.
    current = Ownership({0: (None, 0), 1: (None, 0), 2: ("b", 3), 3: (None, 0)})
    new = assign_owners(current, 2, ["a", "b"])
    assert new.partitions[2] == ("b", 3) and new.partitions[3] == (None, 0)
    assert {new.partitions[0][0], new.partitions[1][0]} == {"a", "b"}


def test_a_grown_cluster_gets_owners_for_its_new_partitions() -> None:
    current = assign_owners(Ownership({0: (None, 0), 1: (None, 0)}), 2, ["a", "b"])
    grown = Ownership({**current.partitions, 2: (None, 0), 3: (None, 0)})
    new = assign_owners(grown, 4, ["a", "b"])
    assert all(owner is not None for owner, _ in new.partitions.values())
    assert new.partitions[0] == current.partitions[0]  # the old ones do not move
    assert new.partitions[1] == current.partitions[1]
    assert sorted(o for o, _ in new.partitions.values()) == ["a", "a", "b", "b"]
