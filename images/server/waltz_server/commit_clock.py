"""The commit clock of a partition: the time stamped on each transaction as it gets its ID.

A commit time is the wall clock in milliseconds since the Unix epoch, except that it never
goes back within a partition: not when this server's clock steps back (NTP, a VM resumed),
and not across a change of owner, whose clock may lag the previous owner's. So a new
session starts the clock at the time of the last committed transaction (``raise_floor``,
read back by recovery), and while the wall clock is behind, times stay at that floor: equal
times are allowed, going back is not. Readers can then window and seek by time knowing a
partition's times only grow with its transaction IDs.

Pure: the caller passes the wall clock in.
"""

from __future__ import annotations

import time

NO_TIME = -1  # nothing committed yet, or the last record has no commit time (format 1)


def wall_clock_ms() -> int:
    """The wall clock, in ms since the Unix epoch."""
    return time.time_ns() // 1_000_000


class CommitClock:
    """Commit times that never decrease (see the module's docstring)."""

    __slots__ = ("last",)

    def __init__(self, floor: int = NO_TIME) -> None:
        self.last = floor  # the last time stamped, or the floor recovery set

    def raise_floor(self, floor: int, now: int) -> int:
        """A session starts: times from now on are at least ``floor`` (the last committed
        transaction's time). Returns how far (ms) the floor is ahead of ``now``: more than
        a little means some server's clock runs ahead, and times will stand still until
        this one catches up."""
        self.last = max(self.last, floor)
        return max(0, self.last - now)

    def stamp(self, now: int) -> int:
        """The commit time of the next transaction, given the wall clock ``now``."""
        if now > self.last:
            self.last = now
        return self.last
