"""When a running store session ends at a planned boundary: the pure rules of
``waltz_server.session_boundary`` (missing replicas, checkpoints, rejoin probes)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from waltz_server.session_boundary import (
    MAX_REJOIN_BACKOFF,
    RejoinProbes,
    checkpoint_reached,
    missing_replicas,
    rejoin_backoff,
)

ADDRESSES = ("a:1", "b:1", "c:1", "d:1", "e:1")


def test_missing_replicas_are_those_neither_members_nor_being_copied():
    replicas = ("c:1", "a:1", "b:1", "d:1")
    assert missing_replicas(replicas, {"a:1": None}, {"d:1"}) == ["c:1", "b:1"]
    assert missing_replicas(replicas, {}, set()) == list(replicas)
    assert missing_replicas(replicas, set(replicas), set()) == []


@given(
    st.lists(st.sampled_from(ADDRESSES), unique=True),
    st.sets(st.sampled_from(ADDRESSES)),
    st.sets(st.sampled_from(ADDRESSES)),
)
def test_missing_replicas_keep_the_assignment_order(
    replicas: list[str], members: set[str], copying: set[str]
) -> None:
    missing = missing_replicas(replicas, members, copying)
    assert missing == [a for a in replicas if a in set(missing)]  # a subsequence
    assert set(missing) == set(replicas) - members - copying


def test_checkpoint_is_reached_after_interval_commits():
    assert not checkpoint_reached(108, 9, 100)
    assert checkpoint_reached(109, 9, 100)
    assert checkpoint_reached(500, -1, 100)
    assert not checkpoint_reached(-1, -1, 1)


def test_rejoin_backoff_doubles_from_the_probe_interval_up_to_a_cap():
    assert [rejoin_backoff(2.0, k) for k in range(1, 7)] == [4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert rejoin_backoff(0.5, 0) == 0.5


@given(st.floats(0.01, 100.0), st.integers(0, 50))
def test_rejoin_backoff_never_shrinks_and_stays_capped(probe_interval: float, attempts: int):
    now, later = (
        rejoin_backoff(probe_interval, attempts),
        rejoin_backoff(probe_interval, attempts + 1),
    )
    assert now <= later <= MAX_REJOIN_BACKOFF
    assert later == min(MAX_REJOIN_BACKOFF, 2 * now)


def test_a_replica_never_probed_is_due_at_once():
    probes = RejoinProbes(2.0)
    assert probes.due("a:1", 0.0)
    assert probes.attempts("a:1") == 0


def test_a_returning_replica_ends_the_session_then_waits_longer_each_time():
    probes = RejoinProbes(2.0)
    assert probes.reachable_again("a:1", 100.0) == "replica a:1 is reachable again"
    assert probes.attempts("a:1") == 1
    assert not probes.due("a:1", 103.9)
    assert probes.due("a:1", 104.0)
    assert probes.due("b:1", 100.0)  # each replica backs off on its own
    probes.reachable_again("a:1", 104.0)
    assert not probes.due("a:1", 111.9)
    assert probes.due("a:1", 112.0)


def test_joining_a_session_restarts_the_backoff_but_keeps_the_pending_probe():
    probes = RejoinProbes(2.0)
    for now in (0.0, 10.0, 30.0):
        probes.reachable_again("a:1", now)
    assert probes.attempts("a:1") == 3
    probes.joined(["a:1", "b:1"])
    assert probes.attempts("a:1") == 0
    assert not probes.due("a:1", 30.0 + 15.9)  # the probe set before it joined stands
    assert probes.due("a:1", 30.0 + 16.0)
    probes.reachable_again("a:1", 50.0)
    assert not probes.due("a:1", 53.9) and probes.due("a:1", 54.0)  # from the start again


# One step: ("probe", address, seconds later) probes if due and finds it reachable;
# ("join", addresses) starts a session with those members.
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("probe"), st.sampled_from(ADDRESSES[:3]), st.floats(0.0, 90.0)),
        st.tuples(st.just("join"), st.sets(st.sampled_from(ADDRESSES[:3]))),
    ),
    max_size=60,
)


@given(st.floats(0.1, 10.0), _steps)
def test_returns_of_a_replica_are_spaced_by_its_backoff(probe_interval: float, steps: list):
    """Whatever the order of probes and sessions, a replica ends two sessions no closer
    together than the backoff of its attempts since it last joined."""
    probes = RejoinProbes(probe_interval)
    now = 0.0
    last_return: dict[str, tuple[float, int]] = {}  # address -> (when, attempts then)
    for step in steps:
        if step[0] == "join":
            probes.joined(step[1])
            continue
        _, address, wait = step
        now += wait
        if not probes.due(address, now):
            when, attempts = last_return[address]
            assert now < when + rejoin_backoff(probe_interval, attempts)
            continue
        if address in last_return:
            when, attempts = last_return[address]
            assert now >= when + rejoin_backoff(probe_interval, attempts)
        before = probes.attempts(address)
        probes.reachable_again(address, now)
        assert probes.attempts(address) == before + 1
        last_return[address] = (now, before + 1)
