"""A server-wide memory budget, shared by the partitions it owns.

Each owned partition may hold, at most: its feed cache, its data cache, its store
session's backlog (``max_batch_bytes x max_in_flight`` of records not yet committed)
and, per member, ``max_member_backlog_bytes`` of Appends that member has not answered.
The backlogs are what keeps appends flowing, so they are fixed; the caches only save
storage reads, so they are what gives: when the partitions' bounds together would
exceed the budget, every partition's caches shrink by the same factor (never below a
floor that keeps feeds near the head off storage). More partitions, smaller caches;
never more memory than the budget says (while the backlogs alone fit in it).

Pure: the server applies the limits whenever the set of owned partitions changes.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_FEED_CACHE_BYTES = 256 * 1024
MIN_DATA_CACHE_BYTES = 0


@dataclass(frozen=True)
class PartitionBounds:
    feed_cache_bytes: int
    data_cache_bytes: int
    backlog_bytes: int  # the session's backlog and its members' unanswered Appends

    @property
    def total(self) -> int:
        return self.feed_cache_bytes + self.data_cache_bytes + self.backlog_bytes


def partition_bounds(
    budget: int,
    partitions: int,
    *,
    feed_cache_bytes: int,
    data_cache_bytes: int,
    backlog_bytes: int,
) -> PartitionBounds:
    """What each of ``partitions`` owned partitions may hold within ``budget`` bytes."""
    configured = PartitionBounds(feed_cache_bytes, data_cache_bytes, backlog_bytes)
    if partitions <= 0 or configured.total * partitions <= budget:
        return configured
    share = budget // partitions - backlog_bytes  # what is left for one partition's caches
    caches = feed_cache_bytes + data_cache_bytes
    factor = max(0.0, share / caches) if caches else 0.0
    return PartitionBounds(
        max(MIN_FEED_CACHE_BYTES, min(feed_cache_bytes, int(feed_cache_bytes * factor))),
        max(MIN_DATA_CACHE_BYTES, min(data_cache_bytes, int(data_cache_bytes * factor))),
        backlog_bytes,
    )
