"""FeedLag: what a client knows committed against what it applied, and since when."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from waltz_client.client_stats import FeedLag


def test_caught_up_there_is_no_lag() -> None:
    lag = FeedLag()
    assert lag.behind(-1, 100.0) == (0, 0.0)
    lag.learned(9, 100.0, applied=-1)
    assert lag.behind(9, 105.0) == (0, 0.0)


def test_the_lag_is_timed_from_when_the_oldest_unapplied_transaction_became_known() -> None:
    lag = FeedLag()
    lag.learned(4, 10.0, applied=-1)  # 0..4 arrive at t=10
    lag.learned(9, 12.0, applied=-1)  # 5..9 at t=12
    assert lag.behind(-1, 15.0) == (10, 5.0)
    assert lag.behind(4, 15.0) == (5, 3.0)  # 0..4 applied: 5 has waited since t=12
    lag.learned(3, 16.0, applied=4)  # an older mark teaches nothing
    assert lag.known_high_water_mark == 9
    lag.learned(12, 20.0, applied=9)  # what 4 and 9 brought is applied: pruned
    assert lag.behind(9, 21.0) == (3, 1.0)
    assert len(lag._known_since) == 1


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(-1, 50)), max_size=40))
def test_the_lag_counts_what_is_known_beyond_the_applied_mark(events) -> None:
    lag = FeedLag()
    applied, known = -1, -1
    for t, (mark, progress) in enumerate(events):
        applied = max(applied, min(progress, known))
        lag.learned(mark, float(t), applied)
        known = max(known, mark)
        count, seconds = lag.behind(applied, float(t) + 0.5)
        assert count == max(0, known - applied)
        assert (seconds > 0) == (count > 0)
        assert len(lag._known_since) <= len(events)
