"""The commit clock: times follow the wall clock and never go back (commit_clock.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from waltz_server.commit_clock import NO_TIME, CommitClock

# A step: the wall clock at a stamp, or a new session's floor (then the wall clock).
steps = st.lists(
    st.one_of(
        st.tuples(st.just("stamp"), st.integers(0, 10**13)),
        st.tuples(st.just("floor"), st.integers(-1, 10**13), st.integers(0, 10**13)),
    ),
    max_size=60,
)


@given(steps)
def test_times_never_decrease_and_follow_the_clock_when_it_leads(script) -> None:
    clock = CommitClock()
    last = NO_TIME
    floor = NO_TIME
    for step in script:
        if step[0] == "floor":
            _, floor_ms, now = step
            ahead = clock.raise_floor(floor_ms, now)
            floor = max(floor, floor_ms)
            assert ahead == max(0, max(last, floor) - now)
            continue
        now = step[1]
        stamped = clock.stamp(now)
        assert stamped >= last  # never back, whatever the wall clock does
        assert stamped >= floor  # never below a session's floor
        assert stamped >= now  # and never behind the wall clock
        # Exactly the wall clock unless something before it was later.
        assert stamped == max(now, last, floor)
        last = stamped


def test_a_clock_behind_the_floor_stands_still_until_it_catches_up() -> None:
    clock = CommitClock()
    assert clock.raise_floor(5_000, now=2_000) == 3_000  # the last owner's clock led by 3 s
    assert [clock.stamp(now) for now in (2_000, 4_999, 5_000, 5_001)] == [
        5_000,
        5_000,
        5_000,
        5_001,
    ]


def test_a_clock_stepping_back_does_not_take_times_back() -> None:
    clock = CommitClock()
    assert clock.stamp(10_000) == 10_000
    assert clock.stamp(9_000) == 10_000  # NTP stepped the clock back 1 s
    assert clock.stamp(10_002) == 10_002


def test_a_floor_below_the_times_already_stamped_changes_nothing() -> None:
    clock = CommitClock()
    clock.stamp(10_000)
    assert clock.raise_floor(NO_TIME, now=10_000) == 0  # the last record had no time
    assert clock.raise_floor(9_000, now=10_000) == 0
    assert clock.stamp(9_500) == 10_000
