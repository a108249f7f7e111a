"""The recovery vote, against the spec's examples and a brute-force oracle."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz_server.recovery_vote import Decided, Undecidable, majority, vote

# The spec's figure: H_B > H_A > H_C.
H_C, H_A, H_B = 7, 10, 12


def test_spec_all_replicas_vote_for_the_highest_mark_a_majority_reaches():
    # A votes {H_A, H_C}, B votes {H_A, H_B, H_C}, C votes {H_C}: H_A wins.
    assert vote([H_A, H_B, H_C], offline=0) == Decided(H_A)


def test_spec_replica_b_offline_is_undecidable():
    # Only A and C vote: H_C has a majority, but that would be wrong. H_A has one vote,
    # plus one offline replica reaches the quorum of two: undecidable.
    result = vote([H_A, H_C], offline=1)
    assert result == Undecidable(candidate=H_A, votes=1, offline=1, quorum=2)
    assert "undecidable" in str(result)


def test_spec_decidable_again_when_b_returns():
    assert vote([H_A, H_B, H_C], offline=0) == Decided(H_A)


def test_spec_decidable_again_when_c_catches_up_with_a():
    assert vote([H_A, H_A], offline=1) == Decided(H_A)


@pytest.mark.parametrize(
    ("marks", "offline", "expected"),
    [
        ([], 0, Decided(-1)),
        ([-1, -1, -1], 0, Decided(-1)),
        ([5, 5, 5], 0, Decided(5)),
        ([5, 4, 3], 0, Decided(4)),
        ([5, 5], 1, Decided(5)),
        ([9, 5], 1, Undecidable(9, 1, 1, 2)),
        ([5], 2, Undecidable(5, 1, 2, 2)),
        ([], 3, Undecidable(-1, 0, 3, 2)),
        ([9, 8, 7, 6, 5], 0, Decided(7)),
        ([9, 8, 7], 2, Undecidable(9, 1, 2, 3)),
        ([9, 9, 7], 2, Undecidable(9, 2, 2, 3)),
        ([9, 9, 9], 2, Decided(9)),
        ([3, 3, 1, 1], 1, Undecidable(3, 2, 1, 3)),
    ],
)
def test_examples(marks, offline, expected):
    assert vote(marks, offline) == expected


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        vote([1], -1)
    with pytest.raises(ValueError):
        vote([-2], 0)


def test_majority():
    assert [majority(n) for n in range(1, 8)] == [1, 2, 2, 3, 3, 4, 4]


def _full_vote(marks: list[int]) -> int:
    """Everyone voted: the highest mark at least a majority of logs reach."""
    q = majority(len(marks))
    return max((h for h in set(marks) if sum(m >= h for m in marks) >= q), default=-1)


@given(
    marks=st.lists(st.integers(-1, 6), max_size=5),
    offline=st.integers(0, 3),
)
def test_vote_matches_every_possible_value_of_the_offline_replicas(marks, offline):
    """Decided(h) exactly when every value the offline replicas might hold gives h."""
    possible = sorted(set(marks) | {-1, 7})
    outcomes = {
        _full_vote(marks + list(hidden)) for hidden in itertools.product(possible, repeat=offline)
    }
    result = vote(marks, offline)
    if len(outcomes) == 1:
        assert result == Decided(outcomes.pop())
    else:
        assert isinstance(result, Undecidable)


def test_empty_logs_with_too_few_offline_replicas_to_commit_anything_decide_nothing():
    """Found by the oracle above: two offline replicas of four cannot reach a quorum of
    three on their own, so nothing can be committed."""
    assert vote([-1, -1], 2) == Decided(-1)
    assert isinstance(vote([-1], 2), Undecidable)  # two of three offline could hold a commit
