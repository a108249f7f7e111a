"""The recovery vote: the highest high-water mark a majority of replicas agrees on.

A replica whose log reaches X votes for every high-water mark H <= X. The
highest H with a quorum of votes is committed: everything at or below it
reached a write quorum, nothing above it could have. With replicas offline
the answer may be unknowable: an offline replica might hold H too, making a
higher mark committed. Candidates are examined in descending order; one whose
votes plus the offline replicas could reach the quorum, but whose votes alone
do not, makes the vote undecidable, and recovery must wait until enough
replicas come back or catch up. Pure and deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Decided:
    high_water_mark: int  # -1: nothing is committed


@dataclass(frozen=True)
class Undecidable:
    """``candidate`` might be committed: it has ``votes``, needs ``quorum``, and ``offline``
    replicas could not vote."""

    candidate: int
    votes: int
    offline: int
    quorum: int

    def __str__(self) -> str:
        return (
            f"high-water mark {self.candidate} has {self.votes} of the {self.quorum} votes "
            f"needed and {self.offline} replicas are offline: undecidable until more "
            f"replicas vote"
        )


def majority(replicas: int) -> int:
    return replicas // 2 + 1


def vote(online_marks: Sequence[int], offline: int) -> Decided | Undecidable:
    """Decide from the high-water marks of the replicas that answered and the count of those
    that did not. ``-1`` is an empty log."""
    if offline < 0 or any(m < -1 for m in online_marks):
        raise ValueError(f"invalid vote: marks {list(online_marks)}, offline {offline}")
    quorum = majority(len(online_marks) + offline)
    for candidate in sorted(set(online_marks), reverse=True):
        votes = sum(1 for m in online_marks if m >= candidate)
        if votes >= quorum:
            return Decided(candidate)
        if candidate == -1 and offline < quorum:
            # Every higher candidate fell short even with the offline votes, and the
            # offline replicas alone cannot commit anything: nothing is committed.
            return Decided(-1)
        if votes + offline >= quorum:
            return Undecidable(candidate, votes, offline, quorum)
    # No replica answered, or too few to reach any candidate: only "nothing above -1"
    # is certain when the offline replicas alone cannot form a quorum with the rest.
    if len(online_marks) + offline == 0:
        return Decided(-1)
    return Undecidable(-1, len(online_marks), offline, quorum)
