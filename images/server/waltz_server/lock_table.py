"""The optimistic lock table of one partition (the spec's "Concurrency Control").

A fixed array of high-water marks and N hash functions. The estimated
high-water mark of a lock is the minimum of its N entries: never below the
last transaction that took the lock (no false negatives), sometimes above it
when other locks share entries (a false conflict, rarer with a larger array).
An append is safe when the client's high-water mark is at or above the
estimate of every lock it names; a committed append raises its locks' entries.
Pure and deterministic.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

_MASK64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: spreads nearby lock hashes over the whole table."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class LockTable:
    def __init__(self, size: int = 1 << 16, hashes: int = 3) -> None:
        if size < 1 or hashes < 1:
            raise ValueError(f"lock table size and hash count must be >= 1, got {size}, {hashes}")
        self.size = size
        self.hashes = hashes
        self._marks = array("q", [-1]) * size

    def _slots(self, lock_hash: int) -> list[int]:
        base = _mix(lock_hash & 0xFFFFFFFF)
        return [_mix(base + i) % self.size for i in range(self.hashes)]

    def estimate(self, lock_hash: int) -> int:
        """Upper bound of the last transaction that took this lock (-1: none)."""
        return min(self._marks[s] for s in self._slots(lock_hash))

    def conflict(self, client_high_water_mark: int, lock_hashes: Iterable[int]) -> int | None:
        """The transaction ID that makes the append unsafe, or None when it is safe."""
        worst = None
        for h in lock_hashes:
            estimate = self.estimate(h)
            if estimate > client_high_water_mark and (worst is None or estimate > worst):
                worst = estimate
        return worst

    def commit(self, transaction_id: int, lock_hashes: Iterable[int]) -> None:
        marks = self._marks
        for h in lock_hashes:
            for s in self._slots(h):
                if marks[s] < transaction_id:
                    marks[s] = transaction_id

    def reset(self, high_water_mark: int) -> None:
        """After a recovery the history is unknown: every lock is as new as the log."""
        self._marks = array("q", [high_water_mark]) * self.size  # C speed: 64k slots
