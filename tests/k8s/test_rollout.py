"""The operator's next safe step: scaling storage down and rolling storage pods,
driven step by step against a small model of the cluster."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_client.cluster.metadata import UNRESOLVED, PartitionMetadata, ReplicaState
from waltz_client.cluster.replica_safety import replica_change_problem
from waltz_operator.rollout import (
    Assign,
    Done,
    PartitionState,
    PodState,
    Refuse,
    Restart,
    Shrink,
    Unassign,
    Wait,
    majority,
    next_pod_to_restart,
    next_rebalance_step,
    next_scale_down_step,
)


def nodes(n: int) -> list[str]:
    return [f"s{i}:1" for i in range(n)]


def state(assigned, members=None) -> PartitionState:
    assigned = frozenset(assigned)
    return PartitionState(assigned, frozenset(assigned if members is None else members))


# --- scaling down ---------------------------------------------------------------------------


def test_scaling_down_moves_replicas_then_waits_then_unassigns_then_shrinks():
    a = nodes(4)
    parts = {0: state(a[1:4]), 1: state(a[0:3])}
    step = next_scale_down_step(a, 3, parts, 3)
    assert step == Assign({a[0]: frozenset({0})})  # s3 leaves; partition 0 needs a third
    parts[0] = state(a[0:4], members=a[1:4])  # assigned, being copied
    step = next_scale_down_step(a, 3, parts, 3)
    assert isinstance(step, Wait) and step.partitions == frozenset({0})
    parts[0] = state(a[0:4])  # s0 joined a session
    assert next_scale_down_step(a, 3, parts, 3) == Unassign({a[3]: frozenset({0})})
    parts[0] = state(a[0:3], members=a[0:4])  # unassigned; its last session still counts s3
    assert isinstance(next_scale_down_step(a, 3, parts, 3), Wait)
    parts[0] = state(a[0:3])
    assert next_scale_down_step(a, 3, parts, 3) == Shrink(3)


def test_a_partition_with_every_replica_leaving_loses_them_one_at_a_time():
    a = nodes(6)
    parts = {0: state(a[3:6])}
    step = next_scale_down_step(a, 3, parts, 3)
    assert step == Assign({a[0]: frozenset({0}), a[1]: frozenset({0}), a[2]: frozenset({0})})
    parts[0] = state(a)
    assert next_scale_down_step(a, 3, parts, 3) == Unassign({a[5]: frozenset({0})})


def test_a_single_replica_partition_is_not_moved():
    a = nodes(2)
    step = next_scale_down_step(a, 1, {0: state([a[1]])}, 1)
    assert isinstance(step, Refuse) and "single replica" in step.reason


def test_scaling_down_below_the_replica_count_is_refused():
    a = nodes(3)
    step = next_scale_down_step(a, 2, {0: state(a)}, 3)
    assert isinstance(step, Refuse) and "cannot hold 3 replicas" in step.reason


def test_nothing_to_do_when_not_scaling_down():
    assert next_scale_down_step(nodes(3), 3, {0: state(nodes(3))}, 3) == Done()


@st.composite
def clusters(draw):
    rpp = draw(st.sampled_from([1, 3, 5]))
    n = draw(st.integers(rpp, 8))
    addresses = nodes(n)
    partitions = {
        p: state(
            draw(st.lists(st.sampled_from(addresses), min_size=rpp, max_size=rpp, unique=True))
        )
        for p in range(draw(st.integers(1, 12)))
    }
    target = draw(st.integers(1, n))
    return rpp, addresses, partitions, target


def _metadata(s: PartitionState) -> PartitionMetadata:
    states = {a: ReplicaState(7, UNRESOLVED) for a in s.members}
    states.update({a: ReplicaState(6, 10) for a in s.assigned - s.members})
    return PartitionMetadata(1, 7, states)


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_a_scale_down_driven_step_by_step_never_risks_a_partition(cluster):
    """Apply each step to a model (copies finish and sessions record their members while
    the operator waits): every partition always keeps its replica count, every Unassign
    passes the admin's check, and the plan ends in Shrink(target) or a refusal."""
    rpp, addresses, partitions, target = cluster
    leaving = set(addresses[target:])
    for _ in range(20):
        step = next_scale_down_step(addresses, target, partitions, rpp)
        match step:
            case Done() | Shrink() | Refuse():
                break
            case Assign(replicas=adds):
                for address, ps in adds.items():
                    for p in ps:
                        s = partitions[p]
                        partitions[p] = state(s.assigned | {address}, s.members)
            case Wait():  # the world moves on: copies finish, a new session records the set
                partitions = {p: state(s.assigned) for p, s in partitions.items()}
            case Unassign(replicas=removals):
                for address, ps in removals.items():
                    for p in ps:
                        s = partitions[p]
                        assert (
                            replica_change_problem(p, _metadata(s), s.assigned - {address}) is None
                        )
                        partitions[p] = state(s.assigned - {address}, s.members)
        assert all(len(s.assigned) >= rpp for s in partitions.values())
    else:
        raise AssertionError("the scale-down did not finish")
    moved = any(s.assigned & leaving for s in partitions.values())
    if target < rpp or (rpp == 1 and moved):
        assert isinstance(step, Refuse)
    elif target < len(addresses):
        assert step == Shrink(target)
        for s in partitions.values():
            assert not (s.assigned | s.members) & leaving and len(s.assigned) >= rpp


# --- rolling storage pods ---------------------------------------------------------------------


def pods(addresses, current=(), unready=()) -> list[PodState]:
    return [
        PodState(f"c-storage-{i}", a, ready=a not in unready, current=a in current)
        for i, a in enumerate(addresses)
    ]


def test_an_unready_outdated_pod_restarts_first():
    a = nodes(3)
    step = next_pod_to_restart(pods(a, unready=[a[0]]), {0: state(a, members=a[1:])})
    assert step == Restart("c-storage-0", "not ready and in no session: restarted first")


def test_an_unready_pod_still_in_a_session_is_not_restarted_out_of_turn():
    """Readiness also fails while one of a node's partitions is unavailable: such a pod
    may still be one of a majority. Here c-storage-2 was just restarted and has not
    rejoined; restarting c-storage-0 too would take partition 0's majority away."""
    a = nodes(3)
    step = next_pod_to_restart(
        pods(a, current=[a[2]], unready=[a[0]]), {0: state(a, members=a[:2])}
    )
    assert isinstance(step, Wait)


def test_pods_restart_from_the_highest_ordinal_while_majorities_hold():
    a = nodes(3)
    assert next_pod_to_restart(pods(a), {0: state(a)}).pod == "c-storage-2"
    # c-storage-2 restarted: not ready yet, then ready but not yet back in the session
    assert isinstance(
        next_pod_to_restart(pods(a, current=[a[2]], unready=[a[2]]), {0: state(a, a[:2])}), Wait
    )
    step = next_pod_to_restart(pods(a, current=[a[2]]), {0: state(a, a[:2])})
    assert isinstance(step, Wait) and step.partitions == frozenset({0})
    assert next_pod_to_restart(pods(a, current=[a[2]]), {0: state(a)}).pod == "c-storage-1"
    assert next_pod_to_restart(pods(a, current=a), {0: state(a)}) == Done()


def test_a_single_replica_partition_is_never_taken_down():
    a = nodes(2)
    step = next_pod_to_restart(pods(a), {0: state([a[0]]), 1: state([a[1]])})
    assert step == Wait("no pod can restart without a partition losing its majority")


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_a_roll_keeps_every_majority_and_finishes(cluster):
    rpp, addresses, partitions, _ = cluster
    current: set[str] = set()
    down: set[str] = set()
    for _ in range(4 * len(addresses) + 4):
        step = next_pod_to_restart(pods(addresses, current, down), partitions)
        if isinstance(step, Done):
            break
        if isinstance(step, Wait):
            if not down and all(s.assigned <= s.members for s in partitions.values()):
                assert rpp == 1, step  # stuck only when a single replica would go
                return
            down.clear()  # the restarted pod comes back and rejoins every session
            partitions = {p: state(s.assigned) for p, s in partitions.items()}
            continue
        pod = next(p for p in pods(addresses) if p.name == step.pod)
        current.add(pod.address)
        down.add(pod.address)
        partitions = {
            p: state(s.assigned, s.members - {pod.address}) for p, s in partitions.items()
        }
        for p, s in partitions.items():
            assert len(s.members) >= majority(len(s.assigned)), (p, s)
    assert current == set(addresses)


# --- balancing after a scale-up ----------------------------------------------------------------


def test_a_new_node_gets_replicas_one_partition_at_a_time_then_the_heaviest_lose_theirs():
    a = nodes(4)
    partitions = {p: state(a[:3]) for p in range(4)}  # s3 is new and empty
    step = next_rebalance_step(a, partitions, 3)
    assert isinstance(step, Assign) and set(step.replicas) == {a[3]}
    for p in step.replicas[a[3]]:
        partitions[p] = state(set(a[:3]) | {a[3]}, a[:3])  # assigned, not yet copied
    assert isinstance(next_rebalance_step(a, partitions, 3), Wait)
    partitions = {p: state(s.assigned) for p, s in partitions.items()}  # copies done
    step = next_rebalance_step(a, partitions, 3)
    assert isinstance(step, Unassign) and a[3] not in step.replicas


def test_a_balanced_cluster_is_left_alone():
    a = nodes(3)
    assert next_rebalance_step(a, {p: state(a) for p in range(4)}, 3) == Done()


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 12), st.data())
def test_balancing_converges_and_never_leaves_a_partition_short(half, extra, count, data):
    rpp = 2 * half - 1
    a = nodes(rpp + extra)
    old = a[: rpp + data.draw(st.integers(0, extra - 1))]
    partitions = {
        p: state(data.draw(st.sets(st.sampled_from(old), min_size=rpp, max_size=rpp)))
        for p in range(count)
    }
    partitions = _play(a, partitions, rpp, None, 10 * count + 10)
    load = [sum(1 for s in partitions.values() if n in s.assigned) for n in a]
    assert rpp == 1 or max(load) - min(load) <= 1, load
    assert all(len(s.assigned) == rpp for s in partitions.values())


def _play(a, partitions, rpp, groups, rounds):
    """Apply rebalance steps as the operator would (copies finish at each Wait) until
    Done; the partitions at the end."""
    for _ in range(rounds):
        step = next_rebalance_step(a, partitions, rpp, groups)
        match step:
            case Done():
                return partitions
            case Assign(replicas=adds):
                for address, ps in adds.items():
                    for p in ps:
                        s = partitions[p]
                        assert address not in s.assigned
                        partitions[p] = state(s.assigned | {address}, s.members)
            case Wait():
                partitions = {p: state(s.assigned) for p, s in partitions.items()}
            case Unassign(replicas=removals):
                for address, ps in removals.items():
                    for p in ps:
                        s = partitions[p]
                        assert len(s.assigned) > rpp and s.assigned <= s.members
                        assert (
                            replica_change_problem(p, _metadata(s), s.assigned - {address}) is None
                        )
                        partitions[p] = state(s.assigned - {address}, s.members)
        assert all(len(s.assigned) >= rpp for s in partitions.values())
    raise AssertionError("balancing did not finish")


def test_a_cluster_in_one_zone_spreads_into_the_zones_it_now_has():
    """Created before its pods were scheduled (no zones known): every partition on the
    three nodes of zone 0. Once the zones are known, each partition spans all three."""
    a = nodes(6)
    groups = {a[0]: 0, a[1]: 0, a[2]: 0, a[3]: 1, a[4]: 1, a[5]: 2}
    partitions = {p: state(a[:3]) for p in range(4)}
    first = next_rebalance_step(a, partitions, 3, groups)
    assert isinstance(first, Assign)
    assert all(groups[address] != 0 for address in first.replicas)
    end = _play(a, partitions, 3, groups, 100)
    assert all(len({groups[n] for n in s.assigned}) == 3 for s in end.values())


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3), st.integers(0, 4), st.integers(1, 12), st.data())
def test_balancing_with_zones_spans_every_zone_it_can(half, extra, count, data):
    rpp = 2 * half - 1
    a = nodes(rpp + extra)
    groups = {n: data.draw(st.integers(0, 3)) for n in a}
    partitions = {
        p: state(data.draw(st.sets(st.sampled_from(a), min_size=rpp, max_size=rpp)))
        for p in range(count)
    }
    end = _play(a, partitions, rpp, groups, 20 * count + 20)
    reachable = min(rpp, len(set(groups.values())))
    if rpp > 1:
        assert all(len({groups[n] for n in s.assigned}) >= reachable for s in end.values())
    assert all(len(s.assigned) == rpp for s in end.values())
