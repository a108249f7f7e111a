"""Replica placement: counts, balance, failure domains, determinism, and its errors."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz_client.cluster.metadata import ReplicaAssignment
from waltz_client.cluster.placement import (
    assign_replicas,
    place_new_partitions,
    placement_ring,
    quorum,
)


@st.composite
def layouts(draw, max_storages: int = 9):
    """(storages, partitions, replicas) with 1 <= replicas <= storages."""
    n = draw(st.integers(min_value=1, max_value=max_storages))
    storages = [f"storage-{i}.waltz:{9000 + i}" for i in range(n)]
    draw(st.randoms(use_true_random=False)).shuffle(storages)
    num_partitions = draw(st.integers(min_value=1, max_value=64))
    num_replicas = draw(st.integers(min_value=1, max_value=n))
    return storages, num_partitions, num_replicas


@st.composite
def grouped_layouts(draw):
    """Equal-sized failure domains, at least as many domains as replicas."""
    num_groups = draw(st.integers(min_value=1, max_value=5))
    per_group = draw(st.integers(min_value=1, max_value=4))
    group_ids = draw(
        st.lists(
            st.integers(min_value=0, max_value=1000),
            min_size=num_groups,
            max_size=num_groups,
            unique=True,
        )
    )
    groups = {}
    for g in group_ids:
        for i in range(per_group):
            groups[f"zone{g}-node{i}:{7000 + i}"] = g
    storages = list(groups)
    draw(st.randoms(use_true_random=False)).shuffle(storages)
    num_partitions = draw(st.integers(min_value=1, max_value=64))
    num_replicas = draw(st.integers(min_value=1, max_value=num_groups))
    return storages, groups, num_partitions, num_replicas


def loads(a: ReplicaAssignment) -> dict[str, int]:
    return {s: len(ps) for s, ps in a.storages.items()}


def check_counts(a: ReplicaAssignment, storages, num_partitions, num_replicas) -> None:
    assert set(a.storages) == set(storages)  # every node is listed, even one holding nothing
    for p in range(num_partitions):
        replicas = a.replicas_of(p)
        assert len(replicas) == num_replicas, (p, replicas)
        assert len(set(replicas)) == num_replicas
    held = {p for ps in a.storages.values() for p in ps}
    assert held == set(range(num_partitions))  # nothing outside 0..P-1
    assert a.problems(num_partitions, num_replicas) == []


@given(layouts())
def test_every_partition_gets_num_replicas_distinct_storages(layout) -> None:
    storages, num_partitions, num_replicas = layout
    a = assign_replicas(storages, num_partitions, num_replicas)
    check_counts(a, storages, num_partitions, num_replicas)
    assert sum(loads(a).values()) == num_partitions * num_replicas


@given(layouts())
def test_per_storage_load_differs_by_at_most_one(layout) -> None:
    storages, num_partitions, num_replicas = layout
    a = assign_replicas(storages, num_partitions, num_replicas)
    counts = loads(a)
    assert max(counts.values()) - min(counts.values()) <= 1, (
        f"{len(storages)} storages, {num_partitions} partitions, {num_replicas} replicas: "
        f"loads {sorted(counts.values())}"
    )


def test_load_balance_smallest_counterexample() -> None:
    """4 storages, 2 partitions, 2 replicas: 4 replica slots over 4 nodes should be 1 each."""
    a = assign_replicas(["a:1", "b:1", "c:1", "d:1"], 2, 2)
    assert sorted(loads(a).values()) == [1, 1, 1, 1], {
        s: sorted(ps) for s, ps in a.storages.items()
    }


@pytest.mark.parametrize(
    ("n", "partitions", "replicas"), [(3, 3, 3), (3, 12, 2), (5, 10, 3), (9, 64, 9), (1, 7, 1)]
)
def test_balanced_when_slots_divide_evenly(n, partitions, replicas) -> None:
    storages = [f"s{i}:1" for i in range(n)]
    a = assign_replicas(storages, partitions, replicas)
    check_counts(a, storages, partitions, replicas)
    assert set(loads(a).values()) == {partitions * replicas // n}


@given(grouped_layouts())
def test_replicas_of_a_partition_are_in_distinct_groups(layout) -> None:
    storages, groups, num_partitions, num_replicas = layout
    a = assign_replicas(storages, num_partitions, num_replicas, groups)
    check_counts(a, storages, num_partitions, num_replicas)
    assert a.groups == groups
    for p in range(num_partitions):
        domains = [groups[s] for s in a.replicas_of(p)]
        assert len(set(domains)) == num_replicas, (p, a.replicas_of(p))


def test_groups_example_three_zones() -> None:
    groups = {"a1:1": 1, "a2:1": 1, "b1:1": 2, "b2:1": 2, "c1:1": 3, "c2:1": 3}
    a = assign_replicas(list(groups), 12, 3, groups)
    for p in range(12):
        assert sorted(groups[s] for s in a.replicas_of(p)) == [1, 2, 3]
    assert set(loads(a).values()) == {6}


def test_ring_interleaves_groups() -> None:
    groups = {"a:1": 0, "b:1": 0, "c:1": 5, "d:1": 5, "e:1": 9}
    assert placement_ring(list(groups), groups) == ["a:1", "c:1", "e:1", "b:1", "d:1"]
    assert placement_ring([], {}) == []


def test_storages_without_a_group_are_in_group_zero() -> None:
    a = assign_replicas(["x:1", "y:1"], 2, 1, {"x:1": 3})
    assert a.groups == {"x:1": 3, "y:1": 0}
    assert assign_replicas(["x:1", "y:1"], 2, 1).groups == {"x:1": 0, "y:1": 0}


@given(layouts(), st.randoms(use_true_random=False))
def test_deterministic_and_order_of_storages_irrelevant(layout, rnd: random.Random) -> None:
    storages, num_partitions, num_replicas = layout
    groups = {s: rnd.randrange(3) for s in storages}
    first = assign_replicas(storages, num_partitions, num_replicas, groups)
    again = assign_replicas(list(storages), num_partitions, num_replicas, dict(groups))
    shuffled = list(storages)
    rnd.shuffle(shuffled)
    reordered = assign_replicas(shuffled, num_partitions, num_replicas, groups)
    assert first == again == reordered
    assert first.encode() == reordered.encode()  # byte-identical znode data


def test_input_is_not_modified() -> None:
    storages = ["b:1", "a:1"]
    groups = {"a:1": 1}
    assign_replicas(storages, 4, 2, groups)
    assert storages == ["b:1", "a:1"]
    assert groups == {"a:1": 1}


@pytest.mark.parametrize(
    ("storages", "partitions", "replicas", "fragment"),
    [
        (["a:1", "b:1", "a:1"], 4, 2, "listed twice: a:1"),
        (["a:1", "b:1", "b:1", "a:1"], 4, 1, "listed twice: a:1, b:1"),
        (["a:1", "b:1"], 4, 3, "3 replicas need at least 3 storage nodes, got 2"),
        ([], 4, 1, "got 0"),
        (["a:1"], 0, 1, "partitions must be at least 1, got 0"),
        (["a:1"], -3, 1, "got -3"),
        (["a:1"], 4, 0, "replicas must be at least 1, got 0"),
        (["a:1"], 4, -1, "got -1"),
    ],
)
def test_errors(storages, partitions, replicas, fragment) -> None:
    with pytest.raises(ValueError) as info:
        assign_replicas(storages, partitions, replicas)
    assert fragment in str(info.value)


@pytest.mark.parametrize(("n", "q"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)])
def test_quorum(n, q) -> None:
    assert quorum(n) == q


@given(st.integers(min_value=1, max_value=1000))
def test_quorum_is_the_smallest_majority(n) -> None:
    q = quorum(n)
    assert 2 * q > n  # any two quorums intersect
    assert 2 * (q - 1) <= n  # and one fewer would not


# --- growth: place_new_partitions --------------------------------------------------------


@given(layouts(), st.integers(min_value=1, max_value=64))
def test_growth_keeps_the_old_partitions_and_places_the_new_like_creation(layout, more) -> None:
    storages, num_partitions, num_replicas = layout
    before = assign_replicas(storages, num_partitions, num_replicas)
    grown = place_new_partitions(before, num_partitions, num_partitions + more, num_replicas)
    check_counts(grown, storages, num_partitions + more, num_replicas)
    for s, parts in before.storages.items():  # nothing already placed moves
        assert {p for p in grown.storages[s] if p < num_partitions} == set(parts)
    counts = loads(grown)
    assert max(counts.values()) - min(counts.values()) <= 1  # still balanced within one


@given(grouped_layouts(), st.integers(min_value=1, max_value=32))
def test_new_partitions_spread_over_failure_domains(layout, more) -> None:
    storages, groups, num_partitions, num_replicas = layout
    before = assign_replicas(storages, num_partitions, num_replicas, groups)
    grown = place_new_partitions(before, num_partitions, num_partitions + more, num_replicas)
    for p in range(num_partitions, num_partitions + more):
        assert len({groups[s] for s in grown.replicas_of(p)}) == num_replicas


def test_new_partitions_go_to_the_least_loaded_nodes() -> None:
    # s3 was added after creation and holds nothing yet: the new replicas go to it first.
    before = assign_replicas(["s0:1", "s1:1", "s2:1"], 3, 3)
    before = ReplicaAssignment({**before.storages, "s3:1": frozenset()})
    grown = place_new_partitions(before, 3, 5, 3)
    assert grown.storages["s3:1"] == frozenset({3, 4})


def test_growth_needs_enough_nodes() -> None:
    one = ReplicaAssignment({"s0:1": frozenset({0})})
    with pytest.raises(ValueError, match="3 replicas need at least 3 storage nodes"):
        place_new_partitions(one, 1, 2, 3)
