"""How far behind a client is, per partition: what it knows was committed, what it has
applied, and for how long the oldest transaction not yet applied has been known. Pure:
the shell passes the clock's readings in.

``FeedLag`` learns of committed transactions from feed rows as they arrive, from Flush
answers and from high-water marks read from a server; the application's progress is
the partition's applied mark. Without transaction timestamps (the log has none), "lag in
seconds" is how long the oldest transaction this client knows of but has not applied has
waited here: zero when caught up, growing while the application falls behind.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


class FeedLag:
    def __init__(self) -> None:
        self.known_high_water_mark = -1  # the highest committed ID this client knows of
        # (the highest ID known, since when): an entry per time the mark rose, kept while
        # some of what it brought is not applied.
        self._known_since: deque[tuple[int, float]] = deque()

    def learned(self, transaction_id: int, now: float, applied: int) -> None:
        """Committed transactions up to ``transaction_id`` exist, as of ``now``."""
        if transaction_id <= self.known_high_water_mark:
            return
        self.known_high_water_mark = transaction_id
        since = self._known_since
        while since and since[0][0] <= applied:
            since.popleft()  # all it brought is applied
        since.append((transaction_id, now))

    def behind(self, applied: int, now: float) -> tuple[int, float]:
        """Transactions known and not applied, and how long the oldest of them has been
        known. Safe from another thread (a metrics scrape): it reads a copy."""
        count = self.known_high_water_mark - applied
        if count <= 0:
            return 0, 0.0
        for last, since in tuple(self._known_since):
            if last > applied:  # the first rise that brought an unapplied transaction
                return count, max(0.0, now - since)
        return count, 0.0


@dataclass(frozen=True)
class PartitionStats:
    """One partition as this client sees it (``WaltzClient.partition_stats``)."""

    partition_id: int
    applies: bool  # the application applies its feed (else it is only written to)
    mounted: bool
    high_water_mark: int  # the highest committed transaction ID known here; -1: none
    applied: int  # the last transaction delivered (applied, when applying); -1: none
    lag: int  # transactions known and not yet applied
    lag_seconds: float  # how long the oldest of them has been known here
    outstanding_appends: int  # sent and not yet settled
    retries: int  # executions of contexts beyond their first, since the client started
    lock_failures: int  # appends refused for a lock, since the client started
